"""The run summary grouped into sections, each value with its unit, for the report.

One format per kind of value, the same as the terminal's summary table: durations as seconds
with a human form ("1,234 s (20.6 min)"), shares as percentages, GPU time in GPU-hours, energy in
kWh, the engine's speed as a plain rate (events/s). Every key of `summary.json` lands in a
section: known keys by the table below, a policy's own counters (prefixed with its name) under
"policy", anything else under "other", formatted by its name's suffix — nothing is dropped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

Fmt = Callable[[Any], str]
ORDER = ("run", "workload", "time", "utilisation", "energy", "failures and recovery", "fairness", "policy",
         "engine", "other")
TITLES = {"run": "Run", "workload": "Workload", "time": "Time", "utilisation": "Utilisation", "energy": "Energy",
          "failures and recovery": "Failures and recovery", "fairness": "Fairness", "policy": "Policy counters",
          "engine": "Engine", "other": "Other"}


# ------------------------------------------------------------------ formats
def fmt_count(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.1f}"


def fmt_seconds(value: float) -> str:
    """`12,345 s (3.4 h)`; short durations without the human form (`42.0 s`, `0.079 s`)."""
    size = abs(value)
    text = f"{value:,.0f} s" if size >= 100 else f"{value:.1f} s" if size >= 1 or size == 0 else f"{value:.3f} s"
    for unit, scale in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if size >= scale:
            return f"{text} ({value / scale:.1f} {unit})"
    return text


def fmt_short_seconds(value: float | None) -> str:
    """A duration in its largest whole unit, for table cells: `0 s`, `42.0 s`, `20.6 min`, `3.2 d`."""
    if value is None:
        return "—"
    for unit, scale in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if abs(value) >= scale:
            return f"{value / scale:,.1f} {unit}"
    return "0 s" if value == 0 else f"{value:.1f} s"


def fmt_percent(value: float) -> str:
    return f"{100 * value:.1f} %"


def fmt_pct(value: float) -> str:  # already in percent
    return f"{value:.1f} %"


def fmt_gpu_hours(value: float) -> str:
    return f"{value:,.1f} GPU-h"


def fmt_gpu_seconds(value: float) -> str:
    return f"{value / 3600:,.1f} GPU-h"


def fmt_kwh(value: float) -> str:
    return f"{value:,.1f} kWh"


def fmt_ms(value: float) -> str:
    return f"{value:,.3f} ms"


def fmt_rate(value: float) -> str:
    return f"{value:,.0f} events/s"


def fmt_ratio(value: float) -> str:
    return f"{value:.3f}"


def fmt_dropped(value: Any) -> str:
    if not isinstance(value, dict):
        return fmt_any("dropped", value)
    reasons = value.get("reasons") or {}
    why = "; ".join(f"{n:,} {reason}" for reason, n in reasons.items())
    return f"{value.get('count', 0):,}" + (f" ({why})" if why else "")


def fmt_reasons(value: Any) -> str:
    if isinstance(value, dict):
        return "; ".join(f"{n:,} {reason}" for reason, n in value.items()) or "none"
    return fmt_any("", value)


def fmt_warnings(value: Any) -> str:
    n = len(value) if isinstance(value, list) else 0
    return f"{n} (listed at the top)" if n else "none"


def fmt_load(value: Any) -> str:
    if isinstance(value, dict):
        return f"arrivals ×{value.get('load', 1):g}, replayed {value.get('repeat', 1)}×"
    return fmt_any("", value)


def fmt_per_vc(value: Any) -> str:
    if not isinstance(value, list):
        return fmt_any("", value)
    parts = [f"{r.get('vc')}: {100 * r['normalized_share']:.0f} %" for r in value
             if isinstance(r, dict) and r.get("normalized_share") is not None]
    return f"{len(value)} VCs; used ÷ entitled " + ", ".join(parts) if parts else f"{len(value)} VCs"


def fmt_any(key: str, value: Any) -> str:
    """A value of an unknown key, by its name's suffix."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, (dict, list)):
        text = json.dumps(value, separators=(", ", ": "), default=str)
        return text if len(text) <= 300 else text[:297] + "…"
    if not isinstance(value, (int, float)):
        return str(value)
    rules: tuple[tuple[Callable[[str], bool], Fmt], ...] = (
        (lambda k: k.endswith("_ms"), fmt_ms), (lambda k: k.endswith("per_s"), lambda v: f"{v:,.1f} /s"),
        (lambda k: k.endswith("_s") or "_s_" in k, fmt_seconds), (lambda k: k.endswith("_kwh"), fmt_kwh),
        (lambda k: "gpu_hours" in k, fmt_gpu_hours), (lambda k: k.endswith("gpu_seconds"), fmt_gpu_seconds),
        (lambda k: k.endswith("_pct"), fmt_pct),
        (lambda k: k.endswith(("_fraction", "_share", "utilization", "utilisation")), fmt_percent))
    for test, fmt in rules:
        if test(key):
            return fmt(value)
    return fmt_count(value)


# ------------------------------------------------------------------ the known keys
def _rows(section: str, *rows: tuple[str, str, Fmt]) -> dict[str, tuple[str, str, Fmt]]:
    return {key: (section, label, fmt) for key, label, fmt in rows}


KNOWN: dict[str, tuple[str, str, Fmt]] = {
    **_rows("workload", ("trace_jobs", "jobs in the trace", fmt_count),
            ("dropped", "dropped before the run", fmt_dropped), ("load_scaling", "load scaling", fmt_load),
            ("jobs", "jobs simulated", fmt_count), ("finished", "finished", fmt_count),
            ("rejected", "rejected", fmt_count), ("rejected_reasons", "rejected, by reason", fmt_reasons),
            ("failed", "failed", fmt_count), ("unfinished", "unfinished", fmt_count),
            ("warnings", "sanity warnings", fmt_warnings)),
    **_rows("time", ("avg_jct_s", "JCT, mean", fmt_seconds), ("p50_jct_s", "JCT, median", fmt_seconds),
            ("p99_jct_s", "JCT, p99", fmt_seconds), ("avg_queue_s", "queueing delay, mean", fmt_seconds),
            ("p50_queue_s", "queueing delay, median", fmt_seconds),
            ("p99_queue_s", "queueing delay, p99", fmt_seconds), ("makespan_s", "makespan", fmt_seconds),
            ("avg_setup_s", "launch set-up, mean", fmt_seconds)),
    **_rows("utilisation", ("gpu_utilization", "GPU utilisation", fmt_percent),
            ("busy_gpu_seconds", "busy GPU time", fmt_gpu_seconds), ("preemptions", "preemptions", fmt_count),
            ("launch_failures", "launch failures", fmt_count)),
    **_rows("energy", ("energy_busy_kwh", "busy GPUs", fmt_kwh), ("energy_idle_kwh", "idle GPUs", fmt_kwh),
            ("energy_kwh", "total", fmt_kwh)),
    **_rows("failures and recovery",
            ("failure_evictions", "jobs stopped by failures", fmt_count),
            ("goodput_fraction", "goodput (share of busy GPU time)", fmt_percent),
            ("goodput_gpu_hours", "goodput", fmt_gpu_hours),
            ("gpu_hours_lost_to_failures", "lost to failures (re-done)", fmt_gpu_hours),
            ("gpu_hours_paused", "restart and resize pauses", fmt_gpu_hours),
            ("gpu_hours_checkpointing", "checkpointing", fmt_gpu_hours),
            ("gpu_hours_in_failed_jobs", "in jobs that failed for good", fmt_gpu_hours),
            ("recoveries", "recoveries", fmt_count),
            ("recoveries_handed_to_policy", "recoveries handed to the policy", fmt_count),
            ("recovery_s_median", "recovery time, median", fmt_seconds),
            ("recovery_s_max", "recovery time, max", fmt_seconds),
            ("gpu_hours_held_recovering", "held idle while recovering", fmt_gpu_hours),
            ("restarts_per_failed_job", "restarts per job hit", fmt_count),
            ("spares_used", "spare nodes used", fmt_count),
            ("minipods_before_mean", "minipods per job before recovery, mean", fmt_count),
            ("minipods_after_mean", "minipods per job after recovery, mean", fmt_count),
            ("recoveries_spread_grew", "recoveries that spread the job", fmt_count),
            ("recoveries_spread_grew_pct", "recoveries that spread the job, share", fmt_pct)),
    **_rows("fairness", ("quota_jain_index", "Jain's index over VCs' used ÷ entitled GPU time", fmt_ratio),
            ("quota_per_vc", "per VC", fmt_per_vc)),
    **_rows("engine", ("decisions", "decisions", fmt_count), ("events", "events", fmt_count),
            ("rounds", "scheduling rounds", fmt_count), ("setup_wall_s", "set-up wall time", fmt_seconds),
            ("sim_wall_s", "simulation wall time", fmt_seconds), ("events_per_s", "simulation speed", fmt_rate),
            ("decision_ms_median", "decision latency, median", fmt_ms),
            ("decision_ms_p99", "decision latency, p99", fmt_ms),
            ("decision_ms_max", "decision latency, max", fmt_ms)),
}


def summary_sections(summary: dict[str, Any], run_rows: list[tuple[str, str]],
                     policy: str = "") -> list[tuple[str, list[tuple[str, str]]]]:
    """(title, [(label, value)]) per non-empty section, in `ORDER`; `run_rows` open the list."""
    sections: dict[str, list[tuple[str, str]]] = {name: [] for name in ORDER}
    sections["run"] = list(run_rows)
    known = [k for k in KNOWN if k in summary]
    failures_shown = any(KNOWN[k][0] == "failures and recovery" and k != "failure_evictions" for k in known) \
        or bool(summary.get("failure_evictions"))
    for key in known:
        section, label, fmt = KNOWN[key]
        if section == "failures and recovery" and not failures_shown:  # a run without failures: one zero
            section = "utilisation"
        sections[section].append((label, _safe(fmt, key, summary[key])))
    prefix = f"{policy}_" if policy else None
    for key, value in summary.items():
        if key in KNOWN:
            continue
        if prefix and key.startswith(prefix):
            sections["policy"].append((key[len(prefix):].replace("_", " "), fmt_any(key, value)))
        else:
            sections["other"].append((key, fmt_any(key, value)))
    return [(TITLES[name] + (f" ({policy})" if name == "policy" and policy else ""), rows)
            for name, rows in sections.items() if rows]


def _safe(fmt: Fmt, key: str, value: Any) -> str:
    """A known key with an unexpected value type is still shown, by its name."""
    try:
        return fmt(value)
    except (TypeError, ValueError, KeyError, AttributeError):
        return fmt_any(key, value)
