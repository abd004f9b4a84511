"""The decision log as JSON lines: one decision per line, with its reason."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa

from loom.core.decisions import Decision
from loom.hardware.topology import Topology


def decision_frame(decisions: list[tuple[float, Decision]], topology: Topology) -> pl.DataFrame:
    names = topology.node_names
    cols: dict[str, list] = {"time": [], "decision": [], "job": [], "gpus": [], "plan": [], "reason": []}
    # `nodes` (a list per decision) is built as one flat Arrow list array: a Python list per row
    # costs polars more than everything else in the log together
    flat: list[str] = []
    offsets, missing = [0], []
    for when, d in decisions:
        alloc = getattr(d, "allocation", None)
        nodes = getattr(d, "nodes", None)
        cols["time"].append(when)
        cols["decision"].append(type(d).__name__.lower())
        cols["job"].append(getattr(d, "job_id", None) or getattr(d, "for_job", None))
        cols["gpus"].append(alloc.total if alloc is not None else None)
        if alloc is not None:
            flat.extend(f"{names[n]}:{g}" for n, g in zip(alloc.nodes, alloc.gpus))
        elif nodes is not None:
            flat.extend(names[n] for n in nodes)
        offsets.append(len(flat))
        missing.append(alloc is None and nodes is None)
        plan = getattr(d, "plan", None)
        cols["plan"].append(None if plan is None else f"{plan.dp}x{plan.tp}x{plan.pp}")  # dp×tp×pp
        cols["reason"].append(d.reason)
    frame = pl.DataFrame(cols, schema={"time": pl.Float64, "decision": pl.Utf8, "job": pl.Utf8, "gpus": pl.Int64,
                                       "plan": pl.Utf8, "reason": pl.Utf8})
    nodes_col = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(flat, pa.string()),
                                         mask=pa.array(missing, pa.bool_()))
    nodes_series = pl.Series("nodes", pl.from_arrow(nodes_col), dtype=pl.List(pl.Utf8))
    return frame.insert_column(4, nodes_series)


def write_decision_log(decisions: list[tuple[float, Decision]], topology: Topology, path: Path) -> None:
    decision_frame(decisions, topology).write_ndjson(path)
