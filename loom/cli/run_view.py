"""What `loom simulate` shows: the progress bar, then a status line per writing stage, the
summary table (human labels, one unit format per kind of value) and the lines that say
which jobs were dropped or rejected and why.

Progress, status and notes go to stderr; the table and the outputs line to stdout (with
`--json`, stdout carries the summary JSON alone).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.status import Status
from rich.table import Table

from loom.run import DROP_LIMIT, DROP_RECORDED_FAILED, Dropped, rejection_kind


class RunDisplay:
    """A progress bar over the trace's span while simulating, then a spinner naming the file being
    written (a plain line when stderr is not a terminal); nothing at all when not `enabled`."""

    def __init__(self, console: Console, enabled: bool) -> None:
        self.console = console
        self.enabled = enabled
        self._bar: Progress | None = None
        self._status: Status | None = None

    def __enter__(self) -> RunDisplay:
        if self.enabled and self.console.is_terminal:  # a bar drawn to a pipe shows nothing but a blank line
            self._bar = Progress(TextColumn("[bold]simulating"), BarColumn(),
                                 TextColumn("{task.percentage:>3.0f}% of trace span"), TimeElapsedColumn(),
                                 console=self.console, transient=True)
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def factory(self, sim: Any) -> Callable[[float], None] | None:
        """The simulation's progress callback (fraction of the arrival span covered)."""
        bar = self._bar
        if bar is None:
            return None
        task = bar.add_task("sim", total=1.0)
        first = sim.jobs[0].spec.submit_time if sim.jobs else 0.0
        span = max(1.0, (sim.jobs[-1].spec.submit_time - first) if sim.jobs else 1.0)
        return lambda now: bar.update(task, completed=min(1.0, (now - first) / span))

    def stage(self, text: str) -> None:
        """The simulation is over; say what is being written now."""
        if not self.enabled:
            return
        self._stop()
        if self.console.is_terminal:
            self._status = self.console.status(text)
            self._status.start()
        else:
            self.console.print(text, highlight=False)

    def _stop(self) -> None:
        for live in (self._bar, self._status):
            if live is not None:
                live.stop()
        self._bar = self._status = None


# ------------------------------------------------------------------ the summary table
def fmt_count(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"


def fmt_seconds(value: float) -> str:
    """`12,345 s (3.4 h)`; short durations without the human form (`42.0 s`, `0.079 s`)."""
    size = abs(value)
    text = f"{value:,.0f} s" if size >= 100 else f"{value:.1f} s" if size >= 1 or size == 0 else f"{value:.3f} s"
    for unit, scale in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if size >= scale:
            return f"{text} ({value / scale:.1f} {unit})"
    return text


def fmt_percent(value: float) -> str:
    return f"{100 * value:.1f} %"


def fmt_ms(value: float) -> str:
    return f"{value:,.3f} ms"


def fmt_gpu_hours(value: float) -> str:
    return f"{value:,.1f} GPU-h"


def fmt_rate(value: float) -> str:
    return f"{value:,.0f} events/s"


# summary key → (label, format); rows are shown in this order when the run has the key
SUMMARY_ROWS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("trace_jobs", "jobs in the trace", fmt_count),
    ("dropped", "dropped before the run", lambda d: fmt_count(d["count"])),
    ("jobs", "jobs simulated", fmt_count),
    ("finished", "finished", fmt_count),
    ("rejected", "rejected", fmt_count),
    ("failed", "failed", fmt_count),
    ("unfinished", "unfinished", fmt_count),
    ("avg_jct_s", "JCT, mean", fmt_seconds),
    ("p50_jct_s", "JCT, median", fmt_seconds),
    ("p99_jct_s", "JCT, p99", fmt_seconds),
    ("avg_queue_s", "queueing delay, mean", fmt_seconds),
    ("p50_queue_s", "queueing delay, median", fmt_seconds),
    ("p99_queue_s", "queueing delay, p99", fmt_seconds),
    ("makespan_s", "makespan", fmt_seconds),
    ("gpu_utilization", "GPU utilisation", fmt_percent),
    ("preemptions", "preemptions", fmt_count),
    ("goodput_fraction", "goodput (share of busy GPU time)", fmt_percent),
    ("gpu_hours_lost_to_failures", "GPU time lost to failures", fmt_gpu_hours),
    ("gpu_hours_checkpointing", "GPU time checkpointing", fmt_gpu_hours),
    ("recoveries", "recoveries", fmt_count),
    ("recovery_s_median", "recovery time, median", fmt_seconds),
    ("avg_setup_s", "launch set-up, mean", fmt_seconds),
    ("launch_failures", "launch failures", fmt_count),
    ("sim_wall_s", "simulation wall time", fmt_seconds),
    ("events_per_s", "simulation speed", fmt_rate),
    ("decision_ms_median", "decision latency, median", fmt_ms),
    ("decision_ms_p99", "decision latency, p99", fmt_ms),
)


def summary_table(stats: dict[str, Any]) -> Table:
    table = Table(title="summary", show_header=False)
    table.add_column("metric", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    hidden = {"trace_jobs", "dropped"} if not (stats.get("dropped") or {}).get("count") else set()
    for key, label, fmt in SUMMARY_ROWS:
        value = stats.get(key)
        if value is not None and key not in hidden:
            table.add_row(label, fmt(value))
    return table


# ------------------------------------------------------------------ dropped and rejected jobs
def dropped_line(dropped: Dropped, limit: int | None) -> str | None:
    """`dropped 283 of 804 jobs: recorded as failed in the trace (…)` (None: nothing was dropped)."""
    if not dropped.count:
        return None
    why = [(count, _drop_reason(reason, limit)) for reason, count in dropped.reasons.items()]
    body = why[0][1] if len(why) == 1 else "; ".join(f"{count:,} {text}" for count, text in why)
    return f"dropped {dropped.count:,} of {dropped.trace_jobs:,} jobs: {body}"


def _drop_reason(reason: str, limit: int | None) -> str:
    if reason == DROP_RECORDED_FAILED:
        return ("recorded as failed in the trace (recorded_failures: drop; "
                "--recorded-failures keep to replay them)")
    if reason == DROP_LIMIT:
        return f"after the first {limit:,} by arrival (--limit / limit_jobs)"
    return f"{reason} (rows the trace format skips; docs/TRACES.md)"


def rejections_line(result: Any) -> str | None:
    """A line naming the most frequent reason jobs were rejected (None: none were), so a run
    whose jobs could not be priced or placed says why without opening jobs.parquet."""
    from collections import Counter

    from loom.core.jobs import JobState

    rejected = [job.reason for job in result.jobs if job.state is JobState.REJECTED]
    if not rejected:
        return None
    kinds = Counter(rejection_kind(reason) for reason in rejected)  # reasons differ in their details
    kind, count = kinds.most_common(1)[0]
    example = next(reason for reason in rejected if rejection_kind(reason) == kind)
    return f"{len(rejected):,} job(s) rejected; {count:,} of them like this one: {example}"
