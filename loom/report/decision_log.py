"""The decision log as JSON lines: one decision per line, with its reason."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from loom.core.decisions import Decision
from loom.hardware.topology import Topology


def decision_frame(decisions: list[tuple[float, Decision]], topology: Topology) -> pl.DataFrame:
    names = topology.node_names
    cols: dict[str, list] = {"time": [], "decision": [], "job": [], "gpus": [], "nodes": [], "plan": [],
                             "reason": []}
    for when, d in decisions:
        alloc = getattr(d, "allocation", None)
        nodes = getattr(d, "nodes", None)
        cols["time"].append(when)
        cols["decision"].append(type(d).__name__.lower())
        cols["job"].append(getattr(d, "job_id", None) or getattr(d, "for_job", None))
        cols["gpus"].append(alloc.total if alloc is not None else None)
        if alloc is not None:
            cols["nodes"].append([f"{names[n]}:{g}" for n, g in zip(alloc.nodes, alloc.gpus)])
        elif nodes is not None:
            cols["nodes"].append([names[n] for n in nodes])
        else:
            cols["nodes"].append(None)
        plan = getattr(d, "plan", None)
        cols["plan"].append(None if plan is None else f"{plan.dp}x{plan.tp}x{plan.pp}")  # dp×tp×pp
        cols["reason"].append(d.reason)
    return pl.DataFrame(cols, schema={"time": pl.Float64, "decision": pl.Utf8, "job": pl.Utf8, "gpus": pl.Int64,
                                      "nodes": pl.List(pl.Utf8), "plan": pl.Utf8, "reason": pl.Utf8})


def write_decision_log(decisions: list[tuple[float, Decision]], topology: Topology, path: Path) -> None:
    decision_frame(decisions, topology).write_ndjson(path)
