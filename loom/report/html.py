"""`write_report`: one self-contained HTML page about a run (PNG figures inlined as base64)."""

from __future__ import annotations

import base64
import html
import time
from pathlib import Path
from typing import Any

import polars as pl

from loom.report import data as D

TIMELINE_BINS = 1000
HEATMAP_BINS = 200
PLACEMENT_JOBS = 5

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1250px;color:#222}
h1{font-size:1.6em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #ddd;padding:.25em .6em;text-align:right}
th{background:#f4f4f4}td.l,th.l{text-align:left}img{max-width:100%;display:block;margin:.5em 0}
.note{color:#666;font-size:.9em}#declog{max-height:600px;overflow:auto;display:block}
input{font-size:1em;padding:.3em;width:18em}nav a{margin-right:1em}
.warnings{background:#fff6e0;border:1px solid #e0b040;padding:.6em 1em;margin:1em 0}.warnings ul{margin:.3em 0}
"""

FILTER_JS = """
function filterDecisions(){
  var q=document.getElementById('jobfilter').value.trim(), n=0;
  var rows=document.querySelectorAll('#declog tbody tr');
  for(var i=0;i<rows.length;i++){var show=!q||rows[i].dataset.job===q;rows[i].style.display=show?'':'none';if(show)n++;}
  document.getElementById('shown').textContent=n+' rows shown';
}
"""


def write_report(run_dir: Path, out: Path | None = None) -> Path:
    """Write the HTML report of the run in `run_dir` (default `run_dir/report.html`); return its path."""
    run_dir = Path(run_dir)
    out = Path(out) if out is not None else run_dir / "report.html"
    run = D.load_run(run_dir)
    page = render(run)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out


def figures(run: D.RunData) -> dict[str, Any]:
    """All figures as PNG bytes (placements: list of (job, png)); keys missing when not computable."""
    from loom.report import plots

    figs: dict[str, Any] = {}
    jobs = run.jobs
    rows = [("all jobs", D.grouped_series(jobs, "jct_s", None), D.grouped_series(jobs, "queue_s", None))]
    for by, label in (("job_class", "by job class"), ("vc", "by VC")):
        jct = D.grouped_series(jobs, "jct_s", by)
        if jct:
            rows.append((label, jct, D.grouped_series(jobs, "queue_s", by)))
    figs["cdf"] = plots.cdf_figure(rows)
    times, levels = D.busy_gpus(run)
    edges = D.time_edges(run, TIMELINE_BINS)
    figs["utilisation"] = plots.utilisation_figure(times, levels, D.binned(times, levels, edges), edges,
                                                   run.total_gpus)
    topology = _topology(run)
    if topology is not None:
        heat = D.occupancy_heatmap(run, topology, HEATMAP_BINS)
        if heat is not None:
            figs["heatmap"] = plots.heatmap_figure(heat)
        figs["placements"] = [(p["job"], _group_figure(topology, p) or plots.placement_figure(topology, p))
                              for p in D.placements(run, PLACEMENT_JOBS)]
    if run.decisions is not None:
        from loom.report.gantt import gantt_figure

        gantt = gantt_figure(run.decisions, run.jobs)
        if gantt is not None:
            figs["gantt"] = gantt
    return figs


def _group_figure(topology: Any, placement: dict[str, Any]) -> bytes | None:
    """For a job with a known dp×tp×pp plan on whole nodes: the Arnold picture
    (nodes coloured by PP group, in rank order); None otherwise."""
    plan = placement.get("plan")
    if not plan:
        return None
    import numpy as np

    from loom.errors import LoomInputError
    from loom.placement.arnold.plot import draw
    from loom.placement.arnold.problem import JobShape
    from loom.report import plots

    dp, tp, pp = (int(x) for x in plan.split("x"))
    nodes = [topology.node_index[n] for n in placement["nodes"] if n in topology.node_index]
    per_node = {int(topology.node_gpus[n]) for n in nodes}
    if len(per_node) != 1 or pp < 2:
        return None
    try:
        shape = JobShape(dp, tp, pp, per_node.pop())
    except LoomInputError:
        return None
    if shape.nodes != len(nodes):
        return None
    grid = np.asarray(nodes, dtype=np.int64).reshape(shape.cols, shape.rows).T
    return plots.to_png(draw(grid, shape, topology, title=f"job {placement['job']}: dp{dp}·tp{tp}·pp{pp}"))


def _topology(run: D.RunData) -> Any:
    from loom.errors import LoomInputError
    from loom.hardware.clusters import load_cluster

    if not run.cluster:
        return None
    try:
        return load_cluster(run.cluster)
    except (LoomInputError, OSError):
        return None


def render(run: D.RunData) -> str:
    t0 = time.perf_counter()
    figs = figures(run)
    esc = html.escape
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>Loom run {esc(run.name)}</title>",
             f"<style>{CSS}</style><script>{FILTER_JS}</script></head><body>",
             f"<h1>Loom run report: {esc(run.name)}</h1>",
             "<nav><a href='#summary'>Summary</a><a href='#cdf'>JCT and queueing delay</a>"
             "<a href='#utilisation'>Utilisation</a><a href='#heatmap'>Occupancy heatmap</a>"
             "<a href='#placements'>Largest jobs' placements</a><a href='#classes'>Per class</a>"
             "<a href='#decisions'>Decision log</a></nav>"]
    parts.append(warnings_box(run.summary))
    parts.append("<h2 id='summary'>Summary</h2>" + kv_table(D.summary_rows(run)))
    parts.append("<h2 id='cdf'>JCT and queueing delay</h2>" + img(figs["cdf"], "JCT and queueing delay CDFs"))
    parts.append("<p class='note'>Empirical CDFs over jobs (JCT: finished jobs; queueing delay: started jobs, "
                 "first start − submit). Per job class and per VC when the trace has more than one "
                 "(top 8 by job count, the rest as “other”).</p>")
    source = "decision log (start/resume/migrate/resize/preempt) and job ends" if run.decisions is not None \
        else "jobs' start and end (no decision log: preemptions are not visible)"
    parts.append("<h2 id='utilisation'>GPU utilisation</h2>" + img(figs["utilisation"], "busy GPUs over time")
                 + f"<p class='note'>Busy GPUs, exact step function from the {esc(source)}.</p>")
    parts.append("<h2 id='heatmap'>Occupancy heatmap</h2>")
    parts.append(img(figs["heatmap"], "occupancy heatmap") if "heatmap" in figs else
                 "<p class='note'>Needs the decision log and the cluster named in manifest.json.</p>")
    parts.append(f"<h2 id='placements'>Placements of the {PLACEMENT_JOBS} largest jobs</h2>")
    if figs.get("placements"):
        parts.append("<p class='note'>Each box row is a minipod; inner boxes are leaf switches, squares nodes. "
                     "The job's last allocation is coloured (darker = more of the node's GPUs); "
                     "leaves it touches are outlined in orange.</p>")
        parts.extend(img(png, f"placement of job {job}") for job, png in figs["placements"])
    else:
        parts.append("<p class='note'>Needs the decision log and the cluster named in manifest.json.</p>")
    if "gantt" in figs:
        parts.append("<h2 id='reservation'>Reservation</h2>" + img(figs["gantt"], "reservation Gantt chart"))
    parts.append("<h2 id='classes'>Per job class</h2>" + frame_table(D.class_table(run.jobs)))
    if "vc" in run.jobs.columns and run.jobs["vc"].drop_nulls().n_unique() > 1:
        parts.append("<h3>Per VC</h3>" + frame_table(D.class_table(run.jobs, "vc")))
    subset, note = D.decision_subset(run)
    parts.append("<h2 id='decisions'>Decision log</h2>"
                 f"<p class='note'>{esc(note)}</p>"
                 "<p>Job id: <input id='jobfilter' placeholder='exact job id, empty = all' "
                 "oninput='filterDecisions()'> <span id='shown' class='note'></span></p>"
                 + decision_table(subset))
    parts.append(f"<p class='note'>Generated by loom in {time.perf_counter() - t0:.1f} s.</p></body></html>")
    return "\n".join(parts)


def warnings_box(summary: dict[str, Any]) -> str:
    """The run's sanity warnings and dropped jobs (loom.report.sanity), above everything else."""
    items = [w["message"] for w in summary.get("warnings", [])]
    dropped = summary.get("dropped") or {}
    if dropped.get("count"):
        why = ", ".join(f"{n:,} {reason}" for reason, n in dropped.get("reasons", {}).items())
        items.insert(0, f"{dropped['count']:,} of {summary.get('trace_jobs', 0):,} trace jobs were dropped: {why}")
    if not items:
        return ""
    return ("<div class='warnings' role='alert'><strong>Read this first</strong><ul>"
            + "".join(f"<li>{html.escape(m)}</li>" for m in items) + "</ul></div>")


def img(png: bytes, alt: str) -> str:
    return f"<img alt='{html.escape(alt)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"


def kv_table(rows: list[tuple[str, str]]) -> str:
    body = "".join(f"<tr><th class='l'>{html.escape(k)}</th><td class='l'>{html.escape(v)}</td></tr>"
                   for k, v in rows)
    return f"<table>{body}</table>"


def frame_table(frame: pl.DataFrame) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in frame.columns)
    rows = []
    for row in frame.iter_rows():
        cells = []
        for col, value in zip(frame.columns, row):
            if col.endswith("_share") and value is not None:
                text = f"{100 * value:.1f}%"
            else:
                text = D.fmt_value(col, value)
            cells.append(f"<td>{html.escape(text)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def decision_table(frame: pl.DataFrame) -> str:
    if frame.is_empty():
        return "<p class='note'>No decisions.</p>"
    esc = html.escape
    rows = []
    for seq, t, kind, job, gpus, nodes, reason in frame.select(
            "seq", "time", "decision", "job", "gpus", "nodes", "reason").iter_rows():
        job = "" if job is None else str(job)
        nodes_text = ", ".join(nodes) if nodes else ""
        rows.append(f"<tr data-job='{esc(job)}'><td>{seq}</td><td>{t:,.1f}</td><td class='l'>{esc(kind)}</td>"
                    f"<td class='l'>{esc(job)}</td><td>{'' if gpus is None else gpus}</td>"
                    f"<td class='l'>{esc(nodes_text)}</td><td class='l'>{esc(reason or '')}</td></tr>")
    head = "".join(f"<th class='l'>{h}</th>" for h in ("#", "time (s)", "decision", "job", "GPUs", "nodes",
                                                        "reason"))
    return f"<table id='declog'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"

