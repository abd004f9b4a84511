"""The decision log as JSON lines: one decision per line, with its reason."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from loom.core.decisions import Decision, Resume, Start
from loom.hardware.topology import Topology

_SEP = "\x1f"  # ASCII unit separator: never part of a node name


def decision_frame(decisions: list[tuple[float, Decision]], topology: Topology) -> pl.DataFrame:
    names = topology.node_names
    # "node:gpus" labels, made once per (node, count) rather than once per decision
    most = int(topology.node_gpus.max()) if len(names) else 0
    labels = [[f"{name}:{g}" for g in range(most + 1)] for name in names]
    times, kinds, jobs, gpus, nodes_col, plans, reasons = _columns(decisions, names, labels, most)
    frame = pl.DataFrame({"time": times, "decision": kinds, "job": jobs, "gpus": gpus, "plan": plans,
                          "reason": reasons},
                         schema={"time": pl.Float64, "decision": pl.Utf8, "job": pl.Utf8, "gpus": pl.Int64,
                                 "plan": pl.Utf8, "reason": pl.Utf8})
    # `nodes` (a list per decision) travels as one string per decision, each node behind a separator,
    # and is split by polars: a Python list per row costs polars ~20 µs (seconds for a 100k-decision log)
    split = pl.Series("nodes", nodes_col, dtype=pl.Utf8).str.split(_SEP).list.slice(1)  # "" before the first
    return frame.insert_column(4, split)


def _columns(decisions: list[tuple[float, Decision]], names: list[str], labels: list[list[str]],
             most: int) -> tuple[list, ...]:
    """The log's columns, in one pass over the decisions (each read for the fields its kind has;
    one pass touches each decision once: cheaper than a pass per column). Starts and resumes,
    nearly every decision of a run, read their fields directly; other kinds through `getattr`."""
    times: list[float] = []
    kinds: list[str] = []
    jobs: list[str | None] = []
    gpus: list[int | None] = []
    plans: list[str | None] = []
    reasons: list[str] = []
    nodes_col: list[str | None] = []
    kind_of: dict[type, str] = {}
    for when, d in decisions:
        cls = type(d)
        kind = kind_of.get(cls)
        if kind is None:
            kind = kind_of[cls] = cls.__name__.lower()
        times.append(when)
        kinds.append(kind)
        if cls is Start or cls is Resume:
            alloc, plan = d.allocation, d.plan
            jobs.append(d.job_id or None)
        else:
            alloc, plan = getattr(d, "allocation", None), getattr(d, "plan", None)
            jobs.append(getattr(d, "job_id", None) or getattr(d, "for_job", None))
        if alloc is not None:
            gpus.append(alloc.total)
            held = alloc.nodes
            if len(held) == 1 and alloc.gpus[0] <= most:
                nodes_col.append(_SEP + labels[held[0]][alloc.gpus[0]])
            else:
                nodes_col.append("".join(_SEP + f"{names[n]}:{g}" for n, g in zip(held, alloc.gpus)))
        else:
            gpus.append(None)
            nodes = getattr(d, "nodes", None)
            nodes_col.append(None if nodes is None else "".join(_SEP + names[n] for n in nodes))
        plans.append(None if plan is None else f"{plan.dp}x{plan.tp}x{plan.pp}")  # dp×tp×pp
        reasons.append(d.reason)
    return times, kinds, jobs, gpus, nodes_col, plans, reasons


def write_decision_log(decisions: list[tuple[float, Decision]], topology: Topology, path: Path) -> None:
    decision_frame(decisions, topology).write_ndjson(path)
