"""HTML tables of the report: the summary cards, per-group tables and the decision log (its
reasons reworded in plain words). Every table sits in a container that scrolls on its own, so
the page never scrolls sideways."""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import polars as pl

from loom.report.sections import fmt_count, fmt_percent, fmt_short_seconds

esc = html.escape
MAX_NODES_SHOWN = 4


def wrap(table: str, cls: str = "tablewrap") -> str:
    return f"<div class='{cls}'>{table}</div>"


def cards(sections: list[tuple[str, list[tuple[str, str]]]]) -> str:
    """The summary: one card (heading + two-column table) per section."""
    out = []
    for title, rows in sections:
        body = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows)
        out.append(f"<section class='card'><h3>{esc(title)}</h3><table class='kv'>{body}</table></section>")
    return "<div class='cards'>" + "".join(out) + "</div>"


def simple_table(head: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "num",
                 text_cols: set[int] | frozenset[int] = frozenset()) -> str:
    """Pre-formatted cells, numbers right-aligned; the first column and `text_cols` left-aligned."""
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td class='l'>{esc(c)}</td>" if i in text_cols else f"<td>{esc(c)}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return wrap(f"<table class='{cls}'><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>")


# column → (heading, format) of the per-group tables
GROUP_COLUMNS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "jobs": ("jobs", fmt_count), "no_wait_share": ("did not wait", lambda v: fmt_percent(v)),
    "queue_mean_s": ("queueing mean", fmt_short_seconds), "queue_p50_s": ("queueing p50", fmt_short_seconds),
    "queue_p99_s": ("queueing p99", fmt_short_seconds),
    "slowdown_mean": ("slowdown mean", lambda v: f"{v:,.2f}"), "slowdown_p50": ("slowdown p50", lambda v: f"{v:,.2f}"),
    "slowdown_p99": ("slowdown p99", lambda v: f"{v:,.2f}"),
    "jct_mean_s": ("JCT mean", fmt_short_seconds), "jct_p99_s": ("JCT p99", fmt_short_seconds),
    "gpu_hours": ("GPU-hours", lambda v: f"{v:,.1f}"), "gpu_hours_share": ("GPU-hour share", fmt_percent),
}


def group_table(frame: pl.DataFrame) -> str:
    """A per-class / per-VC table (`loom.report.jobstats.group_table`)."""
    first = frame.columns[0]
    head = [first.replace("_", " ")] + [GROUP_COLUMNS[c][0] for c in frame.columns[1:]]
    rows = []
    for row in frame.iter_rows(named=True):
        cells = [str(row[first])]
        for col in frame.columns[1:]:
            value = row[col]
            cells.append("—" if value is None else GROUP_COLUMNS[col][1](value))
        rows.append(cells)
    return simple_table(head, rows)


# ------------------------------------------------------------------ the decision log
_REWORDS: tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], str]], ...] = (
    (re.compile(r"\b1 (node|job|GPU|switch)\(e?s\)"), lambda m: f"1 {m[1]}"),
    (re.compile(r"\b(\d[\d,]*) (node|job|GPU)\(s\)"), lambda m: f"{m[1]} {m[2]}s"),
    (re.compile(r"\b(\d[\d,]*) (switch)\(es\)"), lambda m: f"{m[1]} {m[2]}es"),
    (re.compile(r"^queue position 0$"), lambda m: "head of the queue"),
    (re.compile(r"^queue position (\d+)"), lambda m: f"position {m[1]} in the queue (0 = head)"),
    (re.compile(r"^([\w-]+) on (\d+ nodes?)$"), lambda m: f"placed by {m[1]} on {m[2]}"),
    (re.compile(r"(\d+(?:\.\d+)?)s\b"), lambda m: f"{m[1]} s"),
)


@lru_cache(maxsize=4096)
def plain_reason(reason: str | None) -> tuple[str, tuple[str, ...]]:
    """(who decided, its reasons as short sentences): 'fcfs: queue position 3; best-fit on 2 node(s)'
    → ('fcfs', ['position 3 in the queue (0 = head)', 'placed by best-fit on 2 nodes'])."""
    if not reason:
        return "", ()
    head, sep, rest = reason.partition(": ")
    who = head if sep and re.fullmatch(r"[\w-]+", head) else ""
    clauses = [c.strip() for c in (rest if who else reason).split("; ") if c.strip()]
    out = []
    for clause in clauses:
        for pattern, repl in _REWORDS:
            clause = pattern.sub(repl, clause)
        out.append(clause)
    return who, tuple(out)


def escaped(column: str) -> pl.Expr:
    """HTML-escaped text of a string column (as `html.escape`), null as ''."""
    expr = pl.col(column).fill_null("")
    for char, entity in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ('"', "&quot;"), ("'", "&#x27;")):
        expr = expr.str.replace_all(char, entity, literal=True)
    return expr.alias(column)


@lru_cache(maxsize=4096)
def reason_html(reason: str | None) -> str:
    who, why = plain_reason(reason)
    text = " · ".join(esc(c) for c in why)
    return (f"<span class='who'>{esc(who)}</span> " if who else "") + text


def decision_table(frame: pl.DataFrame) -> str:
    if frame.is_empty():
        return "<p class='note'>No decisions.</p>"
    more = pl.col("nodes").list.len().cast(pl.Int64) - MAX_NODES_SHOWN
    cols = frame.select(
        "seq", "time", escaped("decision"), escaped("job"), pl.col("gpus"), "reason",
        pl.when(pl.col("nodes").list.len() > 0).then(
            pl.col("nodes").list.head(MAX_NODES_SHOWN).list.join(", ")
            + pl.when(more > 0).then(pl.format(" … (+{} more)", more)).otherwise(pl.lit(""))
        ).otherwise(pl.lit("")).alias("nodes"))
    cols = cols.with_columns(escaped("nodes"))
    rows = [f"<tr data-job='{job}'><td>{seq:,}</td><td>{t:,.1f}</td><td class='k {kind}'>{kind}</td><td>{job}</td>"
            f"<td>{'' if gpus is None else gpus}</td><td>{nodes}</td><td class='why'>{reason_html(reason)}</td></tr>"
            for seq, t, kind, job, gpus, reason, nodes in cols.iter_rows()]
    head = "".join(f"<th class='{c}'>{h}</th>" for c, h in (
        ("c-seq", "#"), ("c-time", "time (s)"), ("c-kind", "decision"), ("c-job", "job"), ("c-gpus", "GPUs"),
        ("c-nodes", "nodes (node:GPUs)"), ("c-why", "why")))
    return wrap(f"<table id='declog'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>",
                "tablewrap declog")
