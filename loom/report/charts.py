"""The report's charts as inline SVG (`loom.report.svgchart`): CDFs of JCT, queueing delay and
bounded slowdown; utilisation and queue length over time; the occupancy heatmap; failures,
where busy GPU time went, and resizes. Legends sit in a band right of the panels; heavy-tailed
distributions get log axes; when most jobs did not wait, the queueing CDF is that of the jobs
that did, and says so."""

from __future__ import annotations

from typing import Any

import numpy as np

from loom.report.data import cdf
from loom.report.jobstats import MOSTLY_NO_WAIT, WAIT_THRESHOLD_S, wait_split
from loom.report.svgchart import Chart, Panel, Scale, colour, gradient, heat_png

WIDTH = 1250.0
LEFT = 72.0
LEGEND = 270.0  # band right of the panels
PLOT_RIGHT = WIDTH - LEGEND - 16
MAX_POINTS = 1200
TIME_MARKS = ((60.0, "1 min"), (3600.0, "1 h"), (86400.0, "1 d"))
NO_SLOWDOWN = 1.0 + 1e-9  # a bounded slowdown at or below this is "not slowed down"


def time_unit(span_s: float) -> tuple[float, str]:
    if span_s > 3 * 86400:
        return 86400.0, "days"
    if span_s > 3 * 3600:
        return 3600.0, "hours"
    return 60.0, "minutes"


def _thin(xs: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """At most MAX_POINTS points, evenly spaced in rank (a CDF from quantiles looks the same)."""
    if xs.size <= MAX_POINTS:
        return xs, ys
    pick = np.unique(np.linspace(0, xs.size - 1, MAX_POINTS).astype(int))
    return xs[pick], ys[pick]


def _cdf_line(panel: Panel, values: np.ndarray, stroke: str, tip: str, floor: float) -> None:
    xs, ys = cdf(values)
    if xs.size == 0:
        return
    xs, ys = _thin(np.maximum(xs, floor), ys)
    panel.step(np.concatenate([[xs[0]], xs, [panel.xs.hi]]), np.concatenate([[0.0], ys, [1.0]]), stroke, tip=tip)


def _range(groups: dict[str, np.ndarray], floor: float) -> Scale:
    """A log axis over the values (below `floor` drawn at it) when they spread over 10× or more —
    heavy tails — else a linear one over their range."""
    vals = [v[~np.isnan(v)] for v in groups.values() if v.size]
    vals = [np.maximum(v, floor) for v in vals if v.size]
    if not vals:
        return Scale(floor, floor * 10, log=True)
    lo, hi = min(float(v.min()) for v in vals), max(float(v.max()) for v in vals)
    if hi >= 10 * lo:
        return Scale(lo, hi, log=True)
    pad = max((hi - lo) * 0.05, 1e-3 * max(abs(hi), 1.0))
    return Scale(max(lo - pad, 0.0), hi + pad)


def _axis_label(what: str, scale: Scale, note: str = "") -> str:
    return f"{what} ({'log' if scale.log else 'linear'}{note})"


def _cdf_panel(x: float, y: float, w: float, h: float, scale: Scale, title: str, xlabel: str) -> Panel:
    return Panel(x, y, w, h, scale, Scale(0.0, 1.0), title, xlabel, "fraction of jobs",
                 yticks=[(v, f"{v:g}") for v in (0, 0.25, 0.5, 0.75, 1.0)])


def cdf_chart(rows: list[dict[str, Any]]) -> str:
    """One row per grouping (all jobs, by class, by VC): JCT, queueing delay and bounded slowdown
    CDFs and the row's legend. Each row: {"label", "jct", "queue", "slowdown"}, each {group: values}."""
    gap, panel_h, pitch = 62.0, 190.0, 270.0
    w = (PLOT_RIGHT - LEFT - 2 * gap) / 3
    chart = Chart(WIDTH, pitch * len(rows) + 10)
    for r, row in enumerate(rows):
        top = 28 + r * pitch
        groups = list(row["jct"]) or list(row["queue"])
        colours = {g: colour(i) for i, g in enumerate(groups)}
        scale = _range(row["jct"], 1.0)
        jct = chart.panel(_cdf_panel(LEFT, top, w, panel_h, scale, "JCT", _axis_label("job completion time, s", scale)))
        for g, values in row["jct"].items():
            _cdf_line(jct, values, colours[g], f"{g}: JCT", 1.0)
        for seconds, text in TIME_MARKS:
            jct.mark(seconds, text)
        notes = _queue_panel(chart, LEFT + w + gap, top, w, panel_h, row, colours)
        _slowdown_panel(chart, LEFT + 2 * (w + gap), top, w, panel_h, row, colours)
        entries = [(colours[g], f"{g} (n={len(row['jct'].get(g, [])):,}; {notes.get(g, '')})") for g in groups]
        chart.legend(PLOT_RIGHT + 24, top, entries, title=row["label"])
    return chart.svg("CDFs of JCT, queueing delay and bounded slowdown")


def _queue_panel(chart: Chart, x: float, y: float, w: float, h: float, row: dict[str, Any],
                 colours: dict[str, str]) -> dict[str, str]:
    """Queueing-delay CDFs; when most jobs did not wait, those of the jobs that waited (and a note
    saying how many did not). Returns per group its "did not wait" share for the legend."""
    queue = {g: v for g, v in row["queue"].items() if g in colours}
    everything = np.concatenate(list(queue.values())) if queue else np.array([])
    share, waited = wait_split(everything)
    conditional = share >= MOSTLY_NO_WAIT
    shown = {g: wait_split(v)[1] for g, v in queue.items()} if conditional else queue
    title = "queueing delay, jobs that waited" if conditional and waited.size else "queueing delay"
    scale = _range(shown, 1.0)
    note = "" if conditional else f"; < {WAIT_THRESHOLD_S:g} s drawn at {WAIT_THRESHOLD_S:g} s"
    panel = chart.panel(_cdf_panel(x, y, w, h, scale, title, _axis_label("queueing delay, s", scale, note)))
    notes = {}
    for g, values in queue.items():
        notes[g] = f"{100 * wait_split(values)[0]:.0f}% did not wait"
        _cdf_line(panel, shown[g], colours[g], f"{g}: queueing delay", 1.0)
    for seconds, text in TIME_MARKS:
        panel.mark(seconds, text)
    if everything.size and not waited.size:
        panel.note(["No job waited:", f"all started within {WAIT_THRESHOLD_S:g} s"])
    elif conditional:
        panel.note([f"{100 * share:.0f}% of jobs did not wait (< {WAIT_THRESHOLD_S:g} s);",
                    f"curves: the {_jobs(waited.size)} that did"])
    return notes


def _slowdown_panel(chart: Chart, x: float, y: float, w: float, h: float, row: dict[str, Any],
                    colours: dict[str, str]) -> None:
    """Bounded-slowdown CDFs; when most jobs were not slowed down at all (slowdown 1), those of the
    jobs that were, with a note saying how many were not."""
    groups = {g: v for g, v in row["slowdown"].items() if g in colours}
    everything = np.concatenate(list(groups.values())) if groups else np.array([])
    slowed = everything[everything > NO_SLOWDOWN]
    none = 1.0 - slowed.size / everything.size if everything.size else 0.0
    conditional = none >= MOSTLY_NO_WAIT
    shown = {g: v[v > NO_SLOWDOWN] for g, v in groups.items()} if conditional else groups
    title = "bounded slowdown, jobs slowed down" if conditional and slowed.size else "bounded slowdown"
    scale = _range(shown, 1.0)
    panel = chart.panel(_cdf_panel(x, y, w, h, scale, title, _axis_label("bounded slowdown", scale, "; 1 = none")))
    for g, values in shown.items():
        _cdf_line(panel, values, colours[g], f"{g}: bounded slowdown", 1.0)
    if everything.size and not slowed.size:
        panel.note(["No job was slowed down:", "every JCT equals its run time"])
    elif conditional:
        panel.note([f"{100 * none:.0f}% of jobs were not slowed down (= 1);",
                    f"curves: the {_jobs(slowed.size)} that were"])


def _jobs(n: int) -> str:
    return f"{n:,} job" + ("" if n == 1 else "s")


def _time_axis(edges: np.ndarray) -> tuple[float, str, Scale]:
    scale, unit = time_unit(edges[-1] - edges[0])
    return scale, unit, Scale(0.0, (edges[-1] - edges[0]) / scale)


def _series(panel: Panel, times: np.ndarray, levels: np.ndarray, binned: dict[str, np.ndarray], edges: np.ndarray,
            scale: float, stroke: str, label: str) -> list[tuple[str, str]]:
    """The exact step function when small, else the mean per bin inside a min–max band; returns
    the legend entries saying which."""
    if times.size <= 4000:
        panel.step((times - edges[0]) / scale, levels, stroke, width=1.1)
        return [(stroke, f"{label} (exact)")]
    mids = ((edges[:-1] + edges[1:]) / 2 - edges[0]) / scale
    panel.band(mids, binned["min"], binned["max"], stroke)
    panel.line(mids, binned["mean"], stroke, width=1.1)
    return [(stroke, f"{label}: mean per bin ({mids.size} bins)"), (stroke + "55", "band: min–max per bin")]


def timeline_chart(busy: tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]], edges: np.ndarray,
                   capacity: int | None, by_type: dict[str, np.ndarray] | None,
                   waiting: tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]) -> str:
    """Busy GPUs, utilisation per GPU type (when there are several) and waiting jobs, sharing time."""
    scale, unit, xs = _time_axis(edges)
    heights = [170.0] + ([150.0] if by_type else []) + [150.0]
    chart = Chart(WIDTH, sum(heights) + 42 * len(heights) + 48)
    top = 28.0
    peak = float(busy[1].max()) if busy[1].size else 1.0
    busy_panel = chart.panel(Panel(LEFT, top, PLOT_RIGHT - LEFT, heights[0], xs,
                                   Scale(0.0, max(capacity or 0, peak, 1.0) * 1.05), "GPUs in use", "", "busy GPUs"),
                             xticks=False)
    entries = _series(busy_panel, *busy[:2], busy[2], edges, scale, colour(0), "busy GPUs")
    if capacity:
        busy_panel.hline(capacity, colour(3))
        entries.append((colour(3), f"installed: {capacity:,} GPUs"))
    chart.legend(PLOT_RIGHT + 24, top, entries)
    top += heights[0] + 42
    if by_type:
        panel = chart.panel(Panel(LEFT, top, PLOT_RIGHT - LEFT, heights[1], xs, Scale(0.0, 105.0),
                                  "utilisation per GPU type (mean per time bin)", "", "busy ÷ installed (%)",
                                  yticks=[(v, f"{v}%") for v in (0, 25, 50, 75, 100)]), xticks=False)
        mids = ((edges[:-1] + edges[1:]) / 2 - edges[0]) / scale
        for i, (name, frac) in enumerate(by_type.items()):
            panel.line(mids, 100 * frac, colour(i + 1), tip=name)
        chart.legend(PLOT_RIGHT + 24, top, [(colour(i + 1), n) for i, n in enumerate(by_type)], title="GPU type")
        top += heights[1] + 42
    wpeak = float(waiting[1].max()) if waiting[1].size else 0.0
    panel = chart.panel(Panel(LEFT, top, PLOT_RIGHT - LEFT, heights[-1], xs, Scale(0.0, max(wpeak * 1.08, 4.0)),
                              "queue length: jobs submitted, not ended, holding no GPUs", 
                              f"time since first submission ({unit})", "waiting jobs"))
    entries = _series(panel, *waiting[:2], waiting[2], edges, scale, colour(4), "waiting jobs")
    chart.legend(PLOT_RIGHT + 24, top, [*entries, ("#ffffff", f"peak: {wpeak:,.0f} jobs")])
    return chart.svg("GPUs in use and queue length over time")


def heatmap_chart(heat: dict[str, Any]) -> str:
    """Occupancy (busy ÷ capacity) per node group and time bin, with a colour bar."""
    groups, occ, edges = heat["groups"], heat["occupancy"], heat["edges"]
    labels = [f"{g} ({int(c)})" for g, c in zip(groups, heat["capacity"])]
    left = min(260.0, 24 + 6.2 * max((len(s) for s in labels), default=4))
    row = 14.0 if len(groups) <= 40 else max(6.0, 560.0 / len(groups))
    height = max(80.0, row * len(groups))
    _, unit, xs = _time_axis(edges)
    step = max(1, int(np.ceil(12.0 / row)))
    yticks = [(len(groups) - 1 - i + 0.5, labels[i]) for i in range(0, len(groups), step)]
    chart = Chart(WIDTH, height + 90)
    panel = chart.panel(Panel(left, 28, WIDTH - left - 120, height, xs, Scale(0.0, float(len(groups))),
                              f"occupancy per {heat['tier']}: busy GPUs ÷ capacity, mean per time bin",
                              f"time since first submission ({unit})", "", yticks=yticks))
    panel.image(heat_png(occ))
    x0 = WIDTH - 100
    stops = "".join(f"<stop offset='{o:.2f}' stop-color='{c}'/>" for o, c in gradient())
    chart.extra.append(
        f"<linearGradient id='vir' x1='0' y1='1' x2='0' y2='0'>{stops}</linearGradient>"
        f"<rect x='{x0}' y='28' width='14' height='{height:.0f}' fill='url(#vir)'/>"
        + "".join(f"<text x='{x0 + 20}' y='{28 + height * (1 - v) + 4:.0f}'>{v:g}</text>" for v in (0, 0.5, 1))
        + f"<text x='{x0 + 20}' y='{28 + height + 22:.0f}'>occupancy</text>")
    return chart.svg(f"occupancy heatmap per {heat['tier']}")


def failure_chart(timeline: dict[str, Any], start: float, end: float) -> str:
    """Nodes down over time (when the failures could be rebuilt) above a row of ticks per kind of event."""
    scale, unit = time_unit(end - start)
    xs = Scale(0.0, (end - start) / scale)
    events: dict[str, np.ndarray] = timeline["events"]
    down = timeline["nodes_down"]
    rows_h = max(60.0, 24.0 * len(events) + 12)
    chart = Chart(WIDTH, (150 + 42 if down is not None else 0) + rows_h + 80)
    top = 28.0
    if down is not None:
        times, levels = down
        panel = chart.panel(Panel(LEFT, top, PLOT_RIGHT - LEFT, 150, xs, Scale(0.0, max(float(levels.max(initial=0)), 1.0) * 1.1),
                                  "nodes down (injected node failures until their repair)", "", "nodes"), xticks=False)
        if times.size:
            panel.step(np.concatenate([[0.0], (times - start) / scale]), np.concatenate([[0.0], levels]), colour(3))
        chart.legend(PLOT_RIGHT + 24, top, [(colour(3), "nodes down")])
        top += 150 + 42
    kinds = list(events)
    yticks = [(len(kinds) - 1 - i, f"{k} ({events[k].size:,})") for i, k in enumerate(kinds)]
    panel = chart.panel(Panel(LEFT + 150, top, PLOT_RIGHT - LEFT - 150, rows_h, xs, Scale(-0.6, len(kinds) - 0.4),
                              "failure and recovery events (one tick each)", f"time since first submission ({unit})",
                              "", yticks=yticks))
    for i, kind in enumerate(kinds):
        panel.ticks_at((events[kind] - start) / scale, len(kinds) - 1 - i, _event_colour(kind))
    return chart.svg("failures and recoveries over time")


def _event_colour(kind: str) -> str:
    return {"node failed": colour(3), "job stopped by a failure": colour(1),
            "job restarted by recovery": colour(2)}.get(kind, colour(4))


def goodput_chart(parts: list[tuple[str, float, str]]) -> str:
    """Busy GPU time as one stacked bar: useful work and each overhead."""
    total = sum(h for _, h, _ in parts) or 1.0
    chart = Chart(WIDTH, 130)
    panel = chart.panel(Panel(LEFT, 28, PLOT_RIGHT - LEFT, 44, Scale(0.0, total), Scale(0.0, 1.0),
                              "where busy GPU time went", "GPU-hours", "", yticks=[]))
    left, entries = 0.0, []
    for i, (label, hours, why) in enumerate(parts):
        fill = (colour(2), colour(3), colour(1), colour(0))[i % 4]
        panel.rect(left, left + hours, 0.1, 0.9, fill, tip=f"{label}: {hours:,.1f} GPU-h — {why}")
        entries.append((fill, f"{label}: {100 * hours / total:.1f} %"))
        left += hours
    chart.legend(PLOT_RIGHT + 24, 28, entries)
    return chart.svg("where busy GPU time went")


def resize_chart(held: tuple[np.ndarray, np.ndarray], table: Any, start: float, end: float) -> str:
    """GPUs held by the jobs that were ever resized, and each resize as a segment from the job's
    GPUs before to after (the dot; green grown, red shrunk), on a log axis."""
    scale, unit = time_unit(end - start)
    xs = Scale(0.0, (end - start) / scale)
    chart = Chart(WIDTH, 150 + 42 + 170 + 80)
    times, levels = held
    top_panel = chart.panel(Panel(LEFT, 28, PLOT_RIGHT - LEFT, 150, xs,
                                  Scale(0.0, max(float(levels.max(initial=0)), 1.0) * 1.1),
                                  "GPUs held by the jobs that were resized", "", "GPUs"), xticks=False)
    top_panel.step((times - start) / scale, levels, colour(0))
    chart.legend(PLOT_RIGHT + 24, 28, [(colour(0), f"{table['job'].n_unique():,} resized jobs")])
    t = (table["time"].to_numpy() - start) / scale
    before = np.maximum(table["from_gpus"].fill_null(0).to_numpy().astype(float), 0.5)
    after = np.maximum(table["to_gpus"].fill_null(0).to_numpy().astype(float), 0.5)
    panel = chart.panel(Panel(LEFT, 28 + 150 + 42, PLOT_RIGHT - LEFT, 170, xs,
                              Scale(min(before.min(), after.min()) / 1.5, max(before.max(), after.max()) * 1.5, log=True),
                              "resizes: a segment from the job's GPUs before to after (the dot)",
                              f"time since first submission ({unit})", "GPUs (log)"))
    grow = after > before
    entries = []
    for mask, fill, label in ((grow, colour(2), "grown"), (~grow, colour(3), "shrunk")):
        if mask.any():
            panel.segments(t[mask], before[mask], after[mask], fill)
            entries.append((fill, f"{label} ({int(mask.sum()):,})"))
    chart.legend(PLOT_RIGHT + 24, 28 + 150 + 42, entries)
    return chart.svg("resizes over time")
