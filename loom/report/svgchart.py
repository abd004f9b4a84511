"""A small SVG chart kit for the report: panels with linear or log axes, step and line series,
bands, event ticks, bars, a heatmap image and legends in a band right of the panels.

Why not Matplotlib: rasterising a figure costs it ~0.3 s of mostly text layout, and the report of
the full Philly replay has a 2 s budget; these charts are text (a few milliseconds each), stay
sharp at any zoom, and inherit the page's font. Styling is by CSS classes the page defines
(`CHART_CSS`), so each element stays short.
"""

from __future__ import annotations

import base64
import html
import itertools
import math
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

_ids = itertools.count()
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
CHART_CSS = """
svg.chart{font-size:11px;overflow:visible}svg.chart text{fill:#333}svg.chart .t{font-size:12px;font-weight:600}
svg.chart .g{stroke:#e8e8e8;stroke-width:1}svg.chart .ax{stroke:#999;stroke-width:1;fill:none}
svg.chart .m{stroke:#999;stroke-width:1;stroke-dasharray:2 3}svg.chart .mt{fill:#888;font-size:10px}
svg.chart .nb{fill:#fff;fill-opacity:.92;stroke:#bbb}svg.chart .s{fill:none;stroke-width:1.4}
svg.chart .lg{font-size:11px}
"""


def colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def fmt_tick(v: float) -> str:
    """Compact tick label: 0.5, 12, 1.5k, 20M."""
    a = abs(v)
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= size:
            return f"{v / size:.3g}{suffix}"
    return f"{v:.3g}" if a >= 1e-3 or v == 0 else f"{v:.1e}"


@dataclass
class Scale:
    """A data range mapped onto [0, 1]; `log` for base-10 log axes (the low end kept positive)."""

    lo: float
    hi: float
    log: bool = False

    def __post_init__(self) -> None:
        if self.log:
            self.lo = max(self.lo, 1e-9)
            self.hi = max(self.hi, self.lo * 10)
        elif not self.hi > self.lo:
            self.hi = self.lo + 1.0

    def frac(self, v: np.ndarray | float) -> np.ndarray:
        v = np.asarray(v, dtype=float)
        if self.log:
            return (np.log10(np.maximum(v, self.lo)) - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo))
        return (v - self.lo) / (self.hi - self.lo)

    def ticks(self, n: int = 6) -> list[tuple[float, str]]:
        return _log_ticks(self.lo, self.hi) if self.log else _linear_ticks(self.lo, self.hi, n)


def _linear_ticks(lo: float, hi: float, n: int) -> list[tuple[float, str]]:
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if (hi - lo) / (m * mag) <= n)
    first = math.ceil(lo / step - 1e-9) * step
    values = [first + k * step for k in range(int((hi - first) / step + 1e-9) + 1)]
    return [(v, fmt_tick(round(v, 12))) for v in values]


def _log_ticks(lo: float, hi: float) -> list[tuple[float, str]]:
    a, b = math.floor(math.log10(lo) + 1e-9), math.ceil(math.log10(hi) - 1e-9)
    mults = (1,) if b - a > 3 else (1, 2, 5) if b - a > 1 else (1, 2, 3, 5)
    values = [m * 10.0 ** k for k in range(a, b + 1) for m in mults]
    return [(v, fmt_tick(v)) for v in values if lo * (1 - 1e-9) <= v <= hi * (1 + 1e-9)]


def _num(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".")


@dataclass
class Panel:
    """One plotting area at (x, y) of size (w, h) px, its scales, and what is drawn in it."""

    x: float
    y: float
    w: float
    h: float
    xs: Scale
    ys: Scale
    title: str = ""
    xlabel: str = ""
    ylabel: str = ""
    yticks: list[tuple[float, str]] | None = None
    data: list[str] = field(default_factory=list)
    over: list[str] = field(default_factory=list)

    def px(self, v: np.ndarray | float) -> np.ndarray:
        return self.x + np.clip(self.xs.frac(v), -0.02, 1.02) * self.w

    def py(self, v: np.ndarray | float) -> np.ndarray:
        return self.y + self.h - np.clip(self.ys.frac(v), -0.02, 1.02) * self.h

    def step(self, xs: np.ndarray, ys: np.ndarray, stroke: str, width: float = 1.4, tip: str = "") -> None:
        """A post-step line through the points (each level holds until the next x)."""
        if len(xs) == 0:
            return
        px, py = self.px(xs), self.py(ys)
        cmds = [f"M{_num(px[0])} {_num(py[0])}"]
        cmds += [f"H{_num(a)}V{_num(b)}" for a, b in zip(px[1:], py[1:])]
        self.data.append(self._path("".join(cmds), stroke, width, tip))

    def line(self, xs: np.ndarray, ys: np.ndarray, stroke: str, width: float = 1.2, tip: str = "") -> None:
        if len(xs) == 0:
            return
        pts = " ".join(f"{_num(a)},{_num(b)}" for a, b in zip(self.px(xs), self.py(ys)))
        title = f"<title>{html.escape(tip)}</title>" if tip else ""
        self.data.append(f"<polyline class='s' points='{pts}' stroke='{stroke}' stroke-width='{width}'>"
                         f"{title}</polyline>")

    def band(self, xs: np.ndarray, lo: np.ndarray, hi: np.ndarray, fill: str, opacity: float = 0.25) -> None:
        """The area between two lines (e.g. min and max per time bin)."""
        if len(xs) == 0:
            return
        px = self.px(xs)
        top = " ".join(f"{_num(a)},{_num(b)}" for a, b in zip(px, self.py(hi)))
        bottom = " ".join(f"{_num(a)},{_num(b)}" for a, b in zip(px[::-1], self.py(lo)[::-1]))
        self.data.append(f"<polygon points='{top} {bottom}' fill='{fill}' fill-opacity='{opacity}'/>")

    def hline(self, v: float, stroke: str, dash: str = "5 3") -> None:
        y = _num(float(self.py(v)))
        self.data.append(f"<line x1='{_num(self.x)}' x2='{_num(self.x + self.w)}' y1='{y}' y2='{y}' "
                         f"stroke='{stroke}' stroke-dasharray='{dash}' stroke-width='1.2'/>")

    def mark(self, v: float, text: str) -> None:
        """A dotted vertical reference line with a small label at its foot."""
        if not (self.xs.lo <= v <= self.xs.hi):
            return
        x = _num(float(self.px(v)))
        self.over.append(f"<line class='m' x1='{x}' x2='{x}' y1='{_num(self.y)}' y2='{_num(self.y + self.h)}'/>"
                         f"<text class='mt' x='{x}' dx='3' y='{_num(self.y + self.h - 4)}'>{html.escape(text)}</text>")

    def ticks_at(self, xs: np.ndarray, row: float, stroke: str, half: float = 0.35) -> None:
        """Event ticks: a short vertical line per x, centred on y = row."""
        if len(xs) == 0:
            return
        y0, y1 = float(self.py(row + half)), float(self.py(row - half))
        d = "".join(f"M{_num(a)} {_num(y0)}V{_num(y1)}" for a in self.px(np.asarray(xs, dtype=float)))
        self.data.append(self._path(d, stroke, 1.0, ""))

    def segments(self, x: np.ndarray, y0: np.ndarray, y1: np.ndarray, stroke: str) -> None:
        px, a, b = self.px(x), self.py(y0), self.py(y1)
        d = "".join(f"M{_num(p)} {_num(q)}V{_num(r)}" for p, q, r in zip(px, a, b))
        dots = "".join(f"<circle cx='{_num(p)}' cy='{_num(r)}' r='2.2' fill='{stroke}'/>" for p, r in zip(px, b))
        self.data.append(self._path(d, stroke, 1.2, "") + dots)

    def rect(self, x0: float, x1: float, y0: float, y1: float, fill: str, tip: str = "") -> None:
        a, b = float(self.px(x0)), float(self.px(x1))
        top, bottom = float(self.py(y1)), float(self.py(y0))
        title = f"<title>{html.escape(tip)}</title>" if tip else ""
        self.data.append(f"<rect x='{_num(a)}' y='{_num(top)}' width='{_num(max(b - a, 0))}' "
                         f"height='{_num(max(bottom - top, 0))}' fill='{fill}'>{title}</rect>")

    def image(self, png: bytes) -> None:
        """A raster (e.g. a heatmap grid) stretched over the whole panel."""
        b64 = base64.b64encode(png).decode()
        self.data.append(f"<image x='{_num(self.x)}' y='{_num(self.y)}' width='{_num(self.w)}' height='{_num(self.h)}' "
                         f"preserveAspectRatio='none' style='image-rendering:pixelated' href='data:image/png;base64,{b64}'/>")

    def note(self, lines: list[str], right: bool = False) -> None:
        """A boxed note in the panel's top corner."""
        width = 6.2 * max(len(line) for line in lines) + 12
        x = self.x + self.w - width - 6 if right else self.x + 6
        rows = "".join(f"<tspan x='{_num(x + 6)}' dy='{14 if i else 15}'>{html.escape(t)}</tspan>"
                       for i, t in enumerate(lines))
        self.over.append(f"<rect class='nb' x='{_num(x)}' y='{_num(self.y + 6)}' width='{_num(width)}' "
                         f"height='{_num(14 * len(lines) + 8)}' rx='3'/><text y='{_num(self.y + 6)}'>{rows}</text>")

    def _path(self, d: str, stroke: str, width: float, tip: str) -> str:
        title = f"<title>{html.escape(tip)}</title>" if tip else ""
        return f"<path class='s' d='{d}' stroke='{stroke}' stroke-width='{width}'>{title}</path>"

    def svg(self, xticks: bool = True) -> str:
        clip = f"c{next(_ids)}"
        out = [(f"<clipPath id='{clip}'><rect x='{_num(self.x)}' y='{_num(self.y - 2)}' width='{_num(self.w)}' "
                f"height='{_num(self.h + 4)}'/></clipPath>")]
        out += self._grid(xticks)
        out.append(f"<g clip-path='url(#{clip})'>{''.join(self.data)}</g>")
        out.append(f"<path class='ax' d='M{_num(self.x)} {_num(self.y)}V{_num(self.y + self.h)}H{_num(self.x + self.w)}'/>")
        out += self.over
        if self.title:
            out.append(f"<text class='t' x='{_num(self.x)}' y='{_num(self.y - 8)}'>{html.escape(self.title)}</text>")
        if self.xlabel and xticks:
            out.append(f"<text x='{_num(self.x + self.w / 2)}' y='{_num(self.y + self.h + 32)}' text-anchor='middle'>"
                       f"{html.escape(self.xlabel)}</text>")
        if self.ylabel:
            cx, cy = self.x - 44, self.y + self.h / 2
            out.append(f"<text transform='translate({_num(cx)},{_num(cy)}) rotate(-90)' text-anchor='middle'>"
                       f"{html.escape(self.ylabel)}</text>")
        return "".join(out)

    def _grid(self, xticks: bool) -> list[str]:
        out = []
        bottom = self.y + self.h
        for v, label in self.xs.ticks(8):
            x = _num(float(self.px(v)))
            out.append(f"<line class='g' x1='{x}' x2='{x}' y1='{_num(self.y)}' y2='{_num(bottom)}'/>")
            if xticks:
                out.append(f"<text x='{x}' y='{_num(bottom + 14)}' text-anchor='middle'>{label}</text>")
        for v, label in self.yticks if self.yticks is not None else self.ys.ticks(5):
            y = _num(float(self.py(v)))
            out.append(f"<line class='g' x1='{_num(self.x)}' x2='{_num(self.x + self.w)}' y1='{y}' y2='{y}'/>"
                       f"<text x='{_num(self.x - 5)}' y='{y}' dy='4' text-anchor='end'>{html.escape(label)}</text>")
        return out


@dataclass
class Chart:
    """A whole figure: panels plus legends, rendered as one inline <svg>."""

    width: float
    height: float
    panels: list[tuple[Panel, bool]] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)

    def panel(self, panel: Panel, xticks: bool = True) -> Panel:
        self.panels.append((panel, xticks))
        return panel

    def legend(self, x: float, y: float, entries: list[tuple[str, str]], title: str = "", max_chars: int = 44) -> None:
        """Colour swatches with labels from (x, y) down, in the band right of the panels."""
        out = [f"<text class='t' x='{_num(x)}' y='{_num(y)}'>{html.escape(title)}</text>"] if title else []
        top = y + (16 if title else 4)
        for i, (fill, label) in enumerate(entries):
            ty = top + 16 * i
            text = label if len(label) <= max_chars else label[: max_chars - 1] + "…"
            out.append(f"<rect x='{_num(x)}' y='{_num(ty - 4)}' width='14' height='4' fill='{fill}'/>"
                       f"<text class='lg' x='{_num(x + 20)}' y='{_num(ty + 1)}'>{html.escape(text)}"
                       f"<title>{html.escape(label)}</title></text>")
        self.extra.append("".join(out))

    def svg(self, label: str) -> str:
        body = "".join(p.svg(ticks) for p, ticks in self.panels) + "".join(self.extra)
        return (f"<svg class='chart' xmlns='http://www.w3.org/2000/svg' viewBox='0 0 {_num(self.width)} "
                f"{_num(self.height)}' width='{_num(self.width)}' height='{_num(self.height)}' role='img' "
                f"aria-label='{html.escape(label)}'>{body}</svg>")


# viridis (Matplotlib's default colormap) at 17 evenly spaced points: interpolating between them is
# indistinguishable from the full table, and the report needs no Matplotlib import for it
VIRIDIS = ("#440154", "#48186a", "#472d7b", "#424086", "#3b528b", "#33638d", "#2c728e", "#26828e", "#21918c",
           "#1fa088", "#28ae80", "#3fbc73", "#5ec962", "#84d44b", "#addc30", "#d8e219", "#fde725")


def _viridis_rgb(values: np.ndarray) -> np.ndarray:
    """RGB bytes (…, 3) of values in [0, 1] on viridis."""
    anchors = np.array([[int(c[i:i + 2], 16) for i in (1, 3, 5)] for c in VIRIDIS], dtype=float)
    pos = np.clip(np.nan_to_num(values), 0.0, 1.0) * (len(VIRIDIS) - 1)
    lo = np.minimum(pos.astype(int), len(VIRIDIS) - 2)
    frac = (pos - lo)[..., None]
    return np.round(anchors[lo] * (1 - frac) + anchors[lo + 1] * frac).astype(np.uint8)


def png_rgb(rgb: np.ndarray) -> bytes:
    """A (rows, cols, 3) uint8 array as PNG bytes (8-bit RGB, no filtering)."""
    rows, cols, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[r].tobytes() for r in range(rows))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", cols, rows, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")


def heat_png(grid: np.ndarray) -> bytes:
    """A (rows, cols) array in [0, 1] as a PNG of rows × cols pixels coloured by viridis."""
    return png_rgb(_viridis_rgb(grid))


def gradient() -> list[tuple[float, str]]:
    """(offset, hex colour) stops of viridis, for an SVG linearGradient colour bar."""
    return [(k / (len(VIRIDIS) - 1), c) for k, c in enumerate(VIRIDIS)]
