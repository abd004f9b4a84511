"""bench/slurm_fidelity.py: the workload, the phase and error arithmetic and the simulation
(fast, no cluster), and one small end-to-end run on a real Slurm cluster (slurm + slow tiers)."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path

import pytest

from loom.hardware.importers.slurm import tree_topology
from loom.service.backends.slurmtest import missing_requirements

_PATH = Path(__file__).resolve().parents[1] / "bench" / "slurm_fidelity.py"
sys.path.insert(0, str(_PATH.parent))  # its `benchinfo` import
_spec = importlib.util.spec_from_file_location("slurm_fidelity", _PATH)
assert _spec is not None and _spec.loader is not None
sf = importlib.util.module_from_spec(_spec)
sys.modules["slurm_fidelity"] = sf  # dataclasses look their module up there
_spec.loader.exec_module(sf)

TREE = ("SwitchName=leaf0 Nodes=n[0-3]\nSwitchName=leaf1 Nodes=n[4-7]\n"
        "SwitchName=spine0 Switches=leaf[0-1]\nSwitchName=core Switches=spine0\n")


def _topology():
    """8 nodes x 8 GPUs under two leaves (the test cluster's tree, halved)."""
    return tree_topology(TREE, source="test", gpus_of=lambda _h: ("A100-80GB", 8), name="t")


def _rec(submit: float, decision: float, up: float, end: float) -> dict[str, float]:
    return {"submit": submit, "decision": decision, "up": up, "end": end, "state": "FINISHED", "starts": 1}


# ------------------------------------------------------------------ the workload
def test_the_workload_is_seeded_mixed_and_in_arrival_order():
    jobs = sf.workload(50, 21, train=10, gap=0.35)
    assert jobs == sf.workload(50, 21, train=10, gap=0.35) and jobs != sf.workload(50, 22, train=10, gap=0.35)
    assert [j["id"] for j in jobs] == [f"j{i:03d}" for i in range(50)]
    assert all(a["at"] < b["at"] for a, b in itertools.pairwise(jobs))
    train = [j for j in jobs if j["kind"] == "train"]
    assert len(train) == 10 and all(j["procs"] in (1, 2) and j["gpus"] == j["procs"] and j["duration"] is None
                                    and j["iters"] in (100, 200) for j in train)
    sleep = [j for j in jobs if j["kind"] == "sleep"]
    assert all(3 <= j["duration"] <= 10 and (j["gpus"] in (1, 2, 4, 8) or j["gpus"] in (16, 24, 32)) for j in sleep)
    classes = {sf.job_class(j) for j in jobs}
    assert classes == {"sleep-1node", "sleep-multi", "train"}
    assert 0.2 < jobs[-1]["at"] / 50 < 0.5  # the mean gap, roughly
    assert sf.shape(train[0]) == f"{train[0]['procs']}p{train[0]['iters']}i"


# ------------------------------------------------------------------ phases and errors
def test_phases_split_the_jct_and_mape_is_relative_to_live():
    p = sf.phases(_rec(1.0, 3.0, 3.5, 9.5))
    assert p == {"wait": 2.0, "launch": 0.5, "run": 6.0, "jct": 8.5}
    assert sf.mape({"a": 10.0, "b": 20.0}, {"a": 11.0, "b": 18.0}) == pytest.approx(10.0)
    assert sf.mape({"a": 10.0, "b": 5.0}, {"a": 10.0}) == 0.0  # only jobs in both
    with pytest.raises(ValueError):
        sf.mape({"a": 1.0}, {"b": 1.0})


def test_the_model_takes_class_medians_never_a_jobs_own_figures():
    jobs = [{"id": "a", "kind": "sleep", "gpus": 1, "duration": 4.0},
            {"id": "b", "kind": "sleep", "gpus": 2, "duration": 5.0},
            {"id": "c", "kind": "sleep", "gpus": 4, "duration": 6.0},
            {"id": "m", "kind": "sleep", "gpus": 16, "duration": 5.0},
            {"id": "t", "kind": "train", "gpus": 1, "procs": 1, "iters": 100, "duration": None},
            {"id": "u", "kind": "train", "gpus": 2, "procs": 1, "iters": 100, "duration": None}]
    live = {"a": _rec(0, 0, 0.5, 4.8), "b": _rec(0, 1, 1.6, 7.1), "c": _rec(0, 0, 0.7, 7.4),
            "m": _rec(0, 2, 3.0, 8.5), "t": _rec(0, 0, 8.0, 12.0), "u": _rec(0, 0, 10.0, 16.0)}
    launch, run, med = sf.model_from_live(jobs, live)
    assert med["launch_s"] == {"sleep-1node": pytest.approx(0.6), "sleep-multi": 1.0, "train": 9.0}
    assert med["overrun_s"]["sleep-1node"] == pytest.approx(0.5)  # overruns 0.3, 0.5, 0.7
    assert launch["a"] == launch["b"] == launch["c"] == pytest.approx(0.6)
    assert run["a"] == pytest.approx(4.5) and run["m"] == pytest.approx(5.5)
    assert run["t"] == run["u"] == pytest.approx(5.0)  # one shape: median of 4 and 6
    o_launch, o_run = sf.oracle_from_live(live)
    assert o_launch["b"] == pytest.approx(0.6) and o_run["u"] == pytest.approx(6.0)


def test_compare_breaks_the_error_down_by_phase_and_class():
    jobs = [{"id": "a", "kind": "sleep", "gpus": 1, "duration": 4.0},
            {"id": "t", "kind": "train", "gpus": 1, "procs": 1, "iters": 100, "duration": None}]
    live = {"a": _rec(0, 0, 1, 5), "t": _rec(0, 0, 8, 10)}
    sim = {"a": _rec(0, 2, 3, 7), "t": _rec(0, 0, 8, 10)}  # a waited 2 s longer in the simulation
    out = sf.compare(jobs, live, sim)
    assert out["all"]["jct_mape_pct"] == pytest.approx(20.0)  # (2/5 + 0) / 2
    assert out["sleep-1node"]["jct_mape_pct"] == pytest.approx(40.0) and out["train"]["jct_mape_pct"] == 0.0
    assert out["all"]["wait"]["diff_s"] == pytest.approx(1.0)
    assert out["all"]["wait"]["abs_pct_of_jct"] == pytest.approx(20.0)
    assert out["all"]["launch"]["abs_pct_of_jct"] == 0.0 and "sleep-multi" not in out
    assert sf.culprit(out["all"]) == "wait"
    with pytest.raises(ValueError, match="not in both"):
        sf.compare(jobs, live, {"a": sim["a"]})
    assert "| all | wait |" in sf.table({"class_medians": out, "per_job_oracle": out})


# ------------------------------------------------------------------ the simulation
def test_the_simulation_holds_each_job_starting_for_its_launch_then_runs_it():
    jobs = [{"id": "a", "gpus": 64}, {"id": "b", "gpus": 8}, {"id": "c", "gpus": 8}]
    submits = {"a": 0.0, "b": 0.5, "c": 0.6}
    launch = {"a": 2.0, "b": 1.0, "c": 0.0}
    run = {"a": 3.0, "b": 4.0, "c": 1.0}
    out = sf.simulate(jobs, submits, launch, run, _topology(), "first-fit")
    assert out["a"] == {"submit": 0.0, "decision": 0.0, "up": 2.0, "end": 5.0}
    assert out["b"] == {"submit": 0.5, "decision": 5.0, "up": 6.0, "end": 10.0}  # FCFS: waits for a's GPUs
    assert out["c"]["decision"] == 5.0 and out["c"]["end"] == 6.0
    assert sf.PerJobLaunch(per_job={"a": 0.0}).instant and not sf.PerJobLaunch(per_job={"a": 1.0}).instant


def test_fidelity_of_a_live_run_against_itself_through_the_oracle():
    """A 'live' run that is itself a simulation: the per-job oracle reproduces it exactly."""
    jobs = [{"id": f"j{i}", "kind": "sleep", "gpus": g, "duration": d, "at": 0.3 * i}
            for i, (g, d) in enumerate([(8, 4.0), (16, 3.0), (4, 5.0), (32, 2.0), (2, 3.0), (8, 6.0)])]
    submits = {j["id"]: j["at"] for j in jobs}
    truth = sf.simulate(jobs, submits, {j["id"]: 0.4 + 0.1 * i for i, j in enumerate(jobs)},
                        {j["id"]: j["duration"] + 0.2 for j in jobs}, _topology(), "arnold")
    live = {j: {**r, "state": "FINISHED", "starts": 1, "slurm_running": r["decision"] + 0.3} for j, r in truth.items()}
    result = sf.fidelity(jobs, live, _topology(), "arnold")
    assert result["finished"] == 6 and result["per_job_oracle"]["all"]["jct_mape_pct"] == pytest.approx(0.0, abs=1e-9)
    assert result["class_medians"]["all"]["jct_mape_pct"] < 25.0
    assert result["decision_to_slurm_running_median_s"] == pytest.approx(0.3)


# ------------------------------------------------------------------ a real cluster
@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.skipif(missing_requirements() is not None, reason=str(missing_requirements()))
def test_a_small_workload_through_slurm_and_the_simulator(tmp_path):
    from loom.service.backends.slurmcli import SlurmCLI
    from loom.service.backends.slurmtest import SlurmCluster

    jobs = sf.workload(8, 5, train=1, gap=0.3)
    for job in jobs:  # short: the structure is under test, not the figures
        if job["kind"] == "sleep":
            job["duration"] = 1.5
        else:
            job["iters"] = 20
    with SlurmCluster() as cluster:
        env = cluster.env()
        cli = SlurmCLI(tuple(cluster._ns([])), {"SLURM_CONF": env["SLURM_CONF"], "MUNGE_SOCKET": env["MUNGE_SOCKET"]})
        live, topology, round_s = sf.run_live(cli, jobs, tmp_path / "loom", "arnold", timeout_s=120)
    assert all(r["state"] == "FINISHED" for r in live.values()) and set(live) == {j["id"] for j in jobs}
    assert all(r["slurm_running"] is not None and r["decision"] <= r["slurm_running"] <= r["end"]
               for r in live.values())
    result = sf.fidelity(jobs, live, topology, "arnold", round_s)
    assert result["finished"] == 8 and result["live_round_s"]["rounds"] == len(round_s) > 0 and set(result["sim"]) == set(live) == set(result["oracle"])
    for name in ("class_medians", "per_job_oracle"):
        assert result[name]["all"]["jobs"] == 8 and result[name]["all"]["jct_mape_pct"] >= 0.0
    assert "| train |" in sf.table(result)
