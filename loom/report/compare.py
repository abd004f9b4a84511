"""`loom compare`: key metrics of several runs side by side, and their CDFs overlaid."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from loom.errors import LoomInputError
from loom.report import data as D

KEY_METRICS = ("jobs", "finished", "rejected", "unfinished", "avg_jct_s", "p50_jct_s", "p99_jct_s", "avg_queue_s",
               "p50_queue_s", "p99_queue_s", "makespan_s", "gpu_utilization", "preemptions", "failure_evictions",
               "sim_wall_s", "decision_ms_median", "decision_ms_p99")


def run_labels(paths: list[Path]) -> list[str]:
    """Directory names, or the full paths when two runs share a name."""
    names = [Path(p).name or str(p) for p in paths]
    return names if len(set(names)) == len(names) else [str(p) for p in paths]


def comparison(runs: list[D.RunData]) -> list[dict[str, Any]]:
    """One row per metric: name, each run's value and its ratio to the first run (None if undefined)."""
    rows = []
    for key in KEY_METRICS:
        values = [r.summary.get(key) for r in runs]
        if all(v is None for v in values):
            continue
        base = values[0]
        ratios = [v / base if isinstance(v, (int, float)) and isinstance(base, (int, float)) and base else None
                  for v in values]
        rows.append({"metric": key, "values": values, "ratios": ratios})
    return rows


def cell(key: str, value: Any, ratio: float | None, first: bool) -> str:
    text = "—" if value is None else D.fmt_value(key, value)
    return text if first or ratio is None else f"{text} ({ratio:.2f}×)"


def cdf_png(runs: list[D.RunData], labels: list[str]) -> bytes:
    from loom.report import plots

    jct = {lab: r.jobs["jct_s"].drop_nulls().to_numpy() for lab, r in zip(labels, runs)}
    queue = {lab: r.jobs["queue_s"].drop_nulls().to_numpy() for lab, r in zip(labels, runs)}
    return plots.cdf_figure([("runs compared", jct, queue)])


def check_out(out: Path) -> str:
    suffix = out.suffix.lower()
    if suffix not in (".png", ".html", ".htm"):
        raise LoomInputError("--out must end in .png or .html", source=str(out))
    return suffix


def write_comparison(runs: list[D.RunData], labels: list[str], out: Path) -> Path:
    """PNG of the overlaid CDFs, or (for .html) a page with the metrics table and the figure."""
    suffix = check_out(out)
    png = cdf_png(runs, labels)
    out.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".png":
        out.write_bytes(png)
        return out
    esc = html.escape
    head = "".join(f"<th>{esc(lab)}</th>" for lab in labels)
    body = "".join(
        f"<tr><th style='text-align:left'>{esc(row['metric'])}</th>"
        + "".join(f"<td>{esc(cell(row['metric'], v, q, i == 0))}</td>"
                  for i, (v, q) in enumerate(zip(row["values"], row["ratios"]))) + "</tr>"
        for row in comparison(runs))
    out.write_text(
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>Loom comparison</title><style>"
        "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1250px}table{border-collapse:collapse}"
        "td,th{border:1px solid #ddd;padding:.25em .6em;text-align:right}img{max-width:100%}</style></head><body>"
        f"<h1>Loom comparison</h1><p>Ratios are relative to the first run ({esc(labels[0])}).</p>"
        f"<table><tr><th></th>{head}</tr>{body}</table><h2>JCT and queueing delay</h2>"
        f"<img alt='CDFs' src='data:image/png;base64,{base64.b64encode(png).decode()}'></body></html>",
        encoding="utf-8")
    return out
