"""Small versions of the core-equivalence scenarios give the same jobs and decisions as commit 39ddf71.

The golden dumps in tests/data/golden/ were written by that version with
`python bench/core_equivalence.py --write-golden tests/data/golden` (the
scenario builders and the comparison live in that script, so that the bench
can run them against any previous checkout). Each job's final state (PENDING
and SUSPENDED both count as waiting), first start, end time and counters, and
each logged decision (type, job, nodes, GPUs, plan, pause), in order; the
Preempts the old engine logged for failures are not part of the dumps. Floats
match to a relative 1e-9 (absolute 1e-6). Regenerate only on purpose: a
change here means the simulator's results changed.

The two arena dumps price jobs with the performance estimator, so they were
rewritten (same scenarios, same engine) when issue 22's memory model changed
what fits — sequence parallelism by default, MLP activations scaled to
ffn_hidden (the arena's MoE presets have f = 8h), the allocator allowance. The
engine matched 39ddf71's dumps up to that commit's parent.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

_ROOT = Path(__file__).resolve().parents[1]
_PATH = _ROOT / "bench" / "core_equivalence.py"
_spec = importlib.util.spec_from_file_location("core_equivalence", _PATH)
assert _spec is not None and _spec.loader is not None
ce = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ce)

GOLDEN = _ROOT / "tests" / "data" / "golden"


def _describe(diff: dict[str, Any]) -> str:
    lines = [(f"{diff['jobs_differing']} of {diff['jobs']} jobs and {diff['decisions_differing']} of "
              f"{diff['decisions']} decisions differ from the golden dump")]
    if diff["first_job"]:
        first = diff["first_job"]
        lines += [f"first job: {first['job_id']}", f"  golden:  {first['previous']}",
                  f"  current: {first['current']}"]
    if diff["first_decision"]:
        first = diff["first_decision"]
        lines += [f"first decision: #{first['index']}", f"  golden:  {first['previous']}",
                  f"  current: {first['current']}"]
    return "\n".join(lines)


@pytest.mark.parametrize("scenario", ce.SCENARIOS)
def test_matches_golden(scenario: str) -> None:
    golden = json.loads((GOLDEN / f"{scenario}.json").read_text())
    assert golden["size"] == ce.SMALL[scenario], "SMALL changed: regenerate the golden dumps from the reference"
    current = ce.run_scenario(scenario, **golden["size"])
    diff = ce.compare(golden, current)
    assert not diff["jobs_differing"] and not diff["decisions_differing"], _describe(diff)


def test_golden_dumps_exercise_what_they_pin() -> None:
    """The small scenarios are not trivial: Philly jobs queue, the Arena policies move and resize
    jobs, Kalos has node failures with recovery (Resume), job failures and preemptions."""
    load = {s: json.loads((GOLDEN / f"{s}.json").read_text()) for s in ce.SCENARIOS}
    from loom.workload.loaders import load_trace

    submit = {s.job_id: s.submit_time for s in load_trace("philly")[: ce.SMALL["philly-fcfs"]["jobs"]]}
    queued = sum(1 for j, r in load["philly-fcfs"]["jobs"].items() if r[1] > submit[j])
    assert queued > len(submit) // 10
    kinds = {s: {d[1] for d in g["decisions"]} for s, g in load.items()}
    assert {"Start", "Migrate", "Resize"} <= kinds["arena-crius"]
    assert {"Start", "Migrate"} <= kinds["arena-gavel-arena"]
    assert {"Start", "Resume", "Preempt"} <= kinds["kalos-faults"]
    states = {r[0] for r in load["kalos-faults"]["jobs"].values()}
    assert {"FINISHED", "FAILED"} <= states
    assert sum(r[6] for r in load["kalos-faults"]["jobs"].values()) > 0  # failures counted


def test_compare_names_the_first_difference() -> None:
    dump = {"jobs": {"a": ["FINISHED", 0.0, 10.0, 0, 0, 0, 0, 10.0], "b": ["PENDING", None, None, 1, 0, 0, 0, 5.0]},
            "decisions": [[0.0, "Start", "a", [1], [1], None, None]]}
    renamed = json.loads(json.dumps(dump))
    renamed["jobs"]["b"][0] = "SUSPENDED"  # the new lifecycle's name for a preempted, waiting job
    renamed["jobs"]["a"][2] = 10.0 + 1e-9  # float noise within tolerance
    assert not ce.compare(dump, renamed)["jobs_differing"]
    changed = json.loads(json.dumps(dump))
    changed["decisions"][0][3] = [2]
    changed["jobs"]["a"][1] = 1.0
    diff = ce.compare(dump, changed)
    assert diff["jobs_differing"] == 1 and diff["first_job"]["job_id"] == "a"
    assert diff["first_job"]["current"]["first_start"] == 1.0
    assert diff["decisions_differing"] == 1 and diff["first_decision"]["current"]["nodes"] == [2]
