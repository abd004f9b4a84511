"""`loom compare`: key metrics of several runs side by side, and their CDFs overlaid.

Runs are grouped by trace (the manifest's `config.trace`): ratios (e.g. JCT vs a baseline) are computed only
within a group, against the group's baseline — its first run in the order given. Each policy has one colour
(sorted policy names → a fixed palette) used in every panel. Next to the PNG/HTML output a machine-readable
`comparison.json` is written: per trace group, per run, its policy, placer, key metrics and ratios to the baseline.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

from loom.errors import LoomInputError
from loom.report import data as D

KEY_METRICS = ("jobs", "finished", "rejected", "unfinished", "avg_jct_s", "p50_jct_s", "p99_jct_s", "avg_queue_s",
               "p50_queue_s", "p99_queue_s", "makespan_s", "gpu_utilization", "preemptions", "failure_evictions",
               "sim_wall_s", "decision_ms_median", "decision_ms_p99")
# display names with units, for tables
METRIC_LABELS = {
    "jobs": "jobs", "finished": "finished jobs", "rejected": "rejected jobs", "unfinished": "unfinished jobs",
    "avg_jct_s": "JCT, mean (s)", "p50_jct_s": "JCT, median (s)", "p99_jct_s": "JCT, p99 (s)",
    "avg_queue_s": "queueing delay, mean (s)", "p50_queue_s": "queueing delay, median (s)",
    "p99_queue_s": "queueing delay, p99 (s)", "makespan_s": "makespan (s)", "gpu_utilization": "GPU utilisation (%)",
    "preemptions": "preemptions", "failure_evictions": "failure evictions", "sim_wall_s": "simulation wall time (s)",
    "decision_ms_median": "decision latency, median (ms)", "decision_ms_p99": "decision latency, p99 (ms)"}
# colour-blind-friendly fixed palette (Okabe–Ito, then tab10 extras); policies beyond it cycle
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000",
           "#8c564b", "#7f7f7f")
LINESTYLES = ("-", "--", ":", "-.")
MAX_RUNS_PER_TABLE = 5  # wider groups are split into several tables so none is wider than the page
UNKNOWN_TRACE = "(unknown trace)"


def run_labels(paths: list[Path]) -> list[str]:
    """Directory names, or the full paths when two runs share a name."""
    names = [Path(p).name or str(p) for p in paths]
    return names if len(set(names)) == len(names) else [str(p) for p in paths]


def _named(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("name")
    return None if value is None else str(value)


def trace_of(run: D.RunData) -> str:
    cfg = run.manifest.get("config") or {}
    return str(cfg.get("trace") or run.summary.get("trace") or UNKNOWN_TRACE)


def policy_of(run: D.RunData) -> str:
    cfg = run.manifest.get("config") or {}
    return _named(cfg.get("policy")) or _named(run.summary.get("policy")) or "unknown"


def placer_of(run: D.RunData) -> str | None:
    cfg = run.manifest.get("config") or {}
    return _named(cfg.get("placer")) or _named(run.summary.get("placer"))


def policy_colours(policies: list[str]) -> dict[str, str]:
    """A stable colour per policy: sorted distinct names → PALETTE, in order."""
    return {p: PALETTE[i % len(PALETTE)] for i, p in enumerate(sorted(set(policies)))}


def group_by_trace(runs: list[D.RunData]) -> list[tuple[str, list[int]]]:
    """(trace, indices of its runs) in order of first appearance; the first index is the group's baseline."""
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(runs):
        groups.setdefault(trace_of(r), []).append(i)
    return list(groups.items())


def _ratio(value: Any, base: Any) -> float | None:
    ok = isinstance(value, (int, float)) and isinstance(base, (int, float)) and not isinstance(value, bool)
    return value / base if ok and base else None


def comparison(runs: list[D.RunData]) -> list[dict[str, Any]]:
    """One row per metric: name, each run's value and its ratio to the first run (None if undefined).
    Callers comparing runs of different traces should call it once per `group_by_trace` group."""
    rows = []
    for key in KEY_METRICS:
        values = [r.summary.get(key) for r in runs]
        if all(v is None for v in values):
            continue
        rows.append({"metric": key, "values": values, "ratios": [_ratio(v, values[0]) for v in values]})
    return rows


def comparison_data(runs: list[D.RunData], labels: list[str]) -> dict[str, Any]:
    """The machine-readable comparison (the content of comparison.json)."""
    colours = policy_colours([policy_of(r) for r in runs])
    groups = []
    for trace, idx in group_by_trace(runs):
        base = runs[idx[0]]
        members = []
        for i in idx:
            r = runs[i]
            metrics = {k: r.summary.get(k) for k in KEY_METRICS if r.summary.get(k) is not None}
            members.append({
                "label": labels[i], "path": str(r.path), "policy": policy_of(r), "placer": placer_of(r),
                "cluster": r.cluster, "colour": colours[policy_of(r)], "baseline": i == idx[0], "metrics": metrics,
                "ratios": {k: _ratio(v, base.summary.get(k)) for k, v in metrics.items()}})
        groups.append({"trace": trace, "baseline": labels[idx[0]], "runs": members})
    return {"ratios": "each run's metric divided by its trace group's baseline run (never across traces)",
            "policy_colours": colours, "groups": groups}


def cell(key: str, value: Any, ratio: float | None, first: bool) -> str:
    if value is None:
        text = "—"
    elif key == "gpu_utilization" and isinstance(value, (int, float)):
        text = f"{100 * value:.1f} %"
    elif key.endswith("_s") and isinstance(value, (int, float)) and not isinstance(value, bool):
        text = f"{value:,.1f} s" if abs(value) < 60 else f"{value:,.0f} s ({D.fmt_duration(value)})"
    elif key.startswith("decision_ms") and isinstance(value, (int, float)):
        text = f"{value:.3f} ms"
    else:
        text = D.fmt_value(key, value)
    return text if first or ratio is None else f"{text} ({ratio:.2f}×)"


def chunks(items: list[int], size: int = MAX_RUNS_PER_TABLE) -> list[list[int]]:
    return [items[i:i + size] for i in range(0, len(items), size)] or [[]]


def cdf_figure(runs: list[D.RunData], labels: list[str]) -> tuple[bytes, list[dict[str, str]]]:
    """One row of panels per trace group (JCT CDF left, queueing delay right), a run's colour that of its policy
    (line style tells runs of one policy apart). Returns the PNG and, per drawn line, its panel, run, policy and
    colour as read back from the figure."""
    import matplotlib.colors as mcolors
    import numpy as np

    from loom.report import plots

    colours = policy_colours([policy_of(r) for r in runs])
    groups = group_by_trace(runs)
    fig, axes = plots.plt.subplots(len(groups), 2, figsize=(12, 3.8 * len(groups)), squeeze=False)
    drawn: list[dict[str, str]] = []
    for (trace, idx), row in zip(groups, axes):
        queue_xlabel = f"queueing delay (s, log; < {plots.FLOOR_S:g} s drawn at {plots.FLOOR_S:g} s)"
        for column, ax, title, xlabel in (("jct_s", row[0], "JCT", "job completion time (s, log)"),
                                          ("queue_s", row[1], "queueing delay", queue_xlabel)):
            panel = f"{title} — {trace}"
            seen: dict[str, int] = {}
            for i in idx:
                policy = policy_of(runs[i])
                style = LINESTYLES[seen.get(policy, 0) % len(LINESTYLES)]
                seen[policy] = seen.get(policy, 0) + 1
                values = runs[i].jobs[column].drop_nulls().to_numpy() if column in runs[i].jobs.columns else []
                xs, ys = D.cdf(np.asarray(values, dtype=float))
                if xs.size == 0:
                    continue
                xs = np.maximum(xs, plots.FLOOR_S)
                if xs.size > 2000:
                    pick = np.unique(np.linspace(0, xs.size - 1, 2000).astype(int))
                    xs, ys = xs[pick], ys[pick]
                (line,) = ax.step(np.concatenate([[xs[0]], xs]), np.concatenate([[0.0], ys]), where="post",
                                  color=colours[policy], linestyle=style, linewidth=1.4,
                                  label=f"{labels[i]} ({policy}, n={len(values):,})")
                drawn.append({"panel": panel, "label": labels[i], "policy": policy,
                              "colour": mcolors.to_hex(line.get_color()).upper()})
            ax.set_xscale("log")
            ax.set_ylim(0, 1.01)
            ax.set_title(panel if len(panel) <= 70 else panel[:67] + "…")
            ax.set_xlabel(xlabel)
            ax.set_ylabel("fraction of jobs")
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return plots.to_png(fig), drawn


def cdf_png(runs: list[D.RunData], labels: list[str]) -> bytes:
    return cdf_figure(runs, labels)[0]


def check_out(out: Path) -> str:
    suffix = out.suffix.lower()
    if suffix not in (".png", ".html", ".htm"):
        raise LoomInputError("--out must end in .png or .html", source=str(out))
    return suffix


def _html_tables(runs: list[D.RunData], labels: list[str], data: dict[str, Any]) -> str:
    esc = html.escape
    parts = []
    for group, (trace, idx) in zip(data["groups"], group_by_trace(runs)):
        parts.append(f"<h2>Trace <code>{esc(trace)}</code></h2><p>Baseline: <b>{esc(group['baseline'])}</b> "
                     f"({len(idx)} run{'s' if len(idx) != 1 else ''}; ratios are to the baseline).</p>")
        rows = comparison([runs[i] for i in idx])
        positions = list(range(len(idx)))
        for part in chunks(positions):
            head = "".join(
                f"<th data-policy='{esc(group['runs'][p]['policy'])}' style='border-top:5px solid "
                f"{group['runs'][p]['colour']}'>{esc(labels[idx[p]])}<br><small>{esc(group['runs'][p]['policy'])}"
                f" / {esc(str(group['runs'][p]['placer']))}</small></th>" for p in part)
            body = "".join(
                f"<tr><th class='metric'>{esc(METRIC_LABELS.get(row['metric'], row['metric']))}</th>"
                + "".join(f"<td>{esc(cell(row['metric'], row['values'][p], row['ratios'][p], p == 0))}</td>"
                          for p in part) + "</tr>"
                for row in rows)
            parts.append(f"<table><tr><th class='metric'>metric</th>{head}</tr>{body}</table>")
    return "".join(parts)


def write_comparison(runs: list[D.RunData], labels: list[str], out: Path) -> Path:
    """PNG of the overlaid CDFs, or (for .html) a page with per-trace metrics tables and the figure; either way
    also comparison.json beside it."""
    suffix = check_out(out)
    png, drawn = cdf_figure(runs, labels)
    data = comparison_data(runs, labels)
    data["plot_lines"] = drawn
    out.parent.mkdir(parents=True, exist_ok=True)
    (out.parent / "comparison.json").write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    if suffix == ".png":
        out.write_bytes(png)
        return out
    esc = html.escape
    legend = " ".join(f"<span class='swatch' data-policy='{esc(p)}' style='background:{c}'></span>{esc(p)}"
                      for p, c in data["policy_colours"].items())
    out.write_text(
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>Loom comparison</title><style>"
        "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1250px;padding:0 1em}"
        "table{border-collapse:collapse;table-layout:fixed;width:100%;margin-bottom:1em}"
        "td,th{border:1px solid #ddd;padding:.25em .6em;text-align:right;overflow-wrap:anywhere}"
        "th.metric{text-align:left;width:14em}img{max-width:100%}"
        ".swatch{display:inline-block;width:1em;height:1em;margin:0 .3em 0 1em;vertical-align:middle}"
        "</style></head><body>"
        "<h1>Loom comparison</h1><p>Runs are grouped by trace; ratios are computed only within a group, against "
        f"its baseline (its first run). Policy colours: {legend}</p>"
        f"{_html_tables(runs, labels, data)}<h2>JCT and queueing delay</h2>"
        f"<img alt='CDFs' src='data:image/png;base64,{base64.b64encode(png).decode()}'></body></html>",
        encoding="utf-8")
    return out
