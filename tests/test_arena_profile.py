"""The Arena profile-database speed model, on a tiny database in Arena's schema."""

from __future__ import annotations

import json
import pickle

import pytest

from loom.core.jobs import Job
from loom.core.protocols import SPEED_MODELS
from loom.errors import LoomInputError
from loom.hardware.clusters import load_cluster
from loom.hardware.state import Allocation
from loom.placement.best_fit import BestFit
from loom.policies.fcfs import FCFS
from loom.sim.arena_profile import ArenaProfileSpeed
from loom.sim.engine import Simulation
from loom.workload.job import JobSpec

# Arena layout: optimal/{model}_{params}_{batch}/{hosts}_{gpu}_{hosts}_n_{per_host}_d -> seconds
DB = {
    "optimal": {
        "bert_760M_128": {
            "1_a100_1_n_4_d": 0.50,
            "2_a100_2_n_4_d": 0.30,
            "1_a100_1_n_2_d": 0.90,
            "1_v100_1_n_4_d": 1.00,
            "1_v100_1_n_8_d": 0.60,
            "1_a10_1_n_2_d": 2.00,
            "1_1080ti_1_n_4_d": 3.00,  # a testbed type Loom does not know: skipped
            "1_a40_1_n_2_d": 0.0,  # Arena's out-of-memory marker: treated as missing
        },
        "wide_resnet_500M_256": {"1_a100_1_n_4_d": 0.40},
    },
    "all": {
        "bert_760M_128": {"1_a100_1_n_4_d": {"(1, 4, 1)": (0.3, 0.1, 0.0, 0.55), "(2, 2, 1)": (0.3, 0.05, 0.1, 0.52)}},
    },
}


def arena_job(jid="j", gpus=4, gpu_type="A100-40GB", model="bert__760M", iterations=1000, batch=128, t=0.0):
    return JobSpec(job_id=jid, submit_time=t, gpus=gpus, duration=None, gpu_type=gpu_type, model=model,
                   iterations=iterations, batch_size=batch)


@pytest.fixture(scope="module")
def arena():
    return load_cluster("arena-1280")


@pytest.fixture
def db_path(tmp_path):
    path = tmp_path / "prof_database.pkl"
    path.write_bytes(pickle.dumps(DB))
    return path


def nodes_of(topology, gpu_type, count):
    tid = topology.type_id(gpu_type)
    return [i for i in range(topology.num_nodes) if topology.node_type[i] == tid][:count]


def test_registered_and_loads_arena_schema(db_path):
    speed = SPEED_MODELS.get("arena-profile")(path=str(db_path))
    assert isinstance(speed, ArenaProfileSpeed) and speed.table == "optimal"
    assert speed.lookup("bert__760M", 128, "A100-40GB", 2, 4) == pytest.approx(0.30)
    assert speed.lookup("wide_resnet__500M", 256, "A100-40GB", 1, 4) == pytest.approx(0.40)
    assert "1080ti" in speed.unmapped_gpu_types
    assert speed.lookup("bert__760M", 128, "A40", 1, 2) is None  # 0.0 = infeasible


def test_all_table_takes_the_fastest_plan(db_path):
    speed = ArenaProfileSpeed(path=str(db_path), table="all")
    assert speed.lookup("bert__760M", 128, "A100-40GB", 1, 4) == pytest.approx(0.52)


def test_prepare_scales_iterations_like_arena(arena, db_path):
    speed = ArenaProfileSpeed(path=str(db_path))
    specs = speed.prepare([arena_job(), arena_job("v", gpu_type="V100"),
                           arena_job("d", gpus=2)], arena)
    assert specs[0].duration == pytest.approx(1000 * 0.2 * 0.50)
    assert specs[1].duration == pytest.approx(1000 * 0.2 * 1.00)
    assert specs[2].duration == pytest.approx(1000 * 0.2 * 0.90)
    full = ArenaProfileSpeed(path=str(db_path), iteration_scale=1.0).prepare([arena_job()], arena)
    assert full[0].duration == pytest.approx(1000 * 0.50)
    assert not speed.fallbacks


def test_rate_is_time_ratio_with_locality_penalty(arena, db_path):
    speed = ArenaProfileSpeed(path=str(db_path))
    job = Job(speed.prepare([arena_job()], arena)[0], 0)
    a100 = nodes_of(arena, "A100-40GB", 4)
    assert speed.rate(job, Allocation(a100[:1], [4]), arena) == pytest.approx(1.0)
    assert speed.rate(job, Allocation(a100[:2], [4, 4]), arena) == pytest.approx(0.50 / 0.30)
    # 2 + 2 on two nodes is not profiled: packed 1×4 entry slowed by 0.9 ** log2(4 / 2)
    assert speed.rate(job, Allocation(a100[:2], [2, 2]), arena) == pytest.approx(0.50 / (0.50 / 0.9))
    v100 = nodes_of(arena, "V100", 1)
    assert speed.rate(job, Allocation(v100, [4]), arena) == pytest.approx(0.50 / 1.00)
    assert not speed.fallbacks


def test_missing_entry_falls_back_to_the_estimator_and_is_counted(arena, db_path):
    speed = ArenaProfileSpeed(path=str(db_path))
    (spec,) = speed.prepare([arena_job(gpu_type="A40", gpus=2)], arena)
    assert spec.duration and spec.duration > 0
    assert ("bert__760M", 128, "A40", 2) in speed.fallbacks
    job = Job(speed.prepare([arena_job()], arena)[0], 0)
    a100 = nodes_of(arena, "A100-40GB", 2)
    rate = speed.rate(job, Allocation(a100[:1], [1]), arena)  # 1 × A100 not profiled
    assert 0 < rate < 1
    assert ("bert__760M", 128, "A100-40GB", 1) in speed.fallbacks
    strict = ArenaProfileSpeed(path=str(db_path), fallback="error")
    with pytest.raises(LoomInputError, match="A40"):
        strict.prepare([arena_job(gpu_type="A40", gpus=2)], arena)


def test_missing_path_names_the_field():
    with pytest.raises(LoomInputError, match=r"speed_model\.params\.path"):
        ArenaProfileSpeed()
    with pytest.raises(LoomInputError, match=r"speed_model\.params\.path"):
        SPEED_MODELS.get("arena-profile")()


def test_unreadable_or_malformed_file_names_the_file(tmp_path):
    missing = tmp_path / "nope.pkl"
    with pytest.raises(LoomInputError, match="nope.pkl"):
        ArenaProfileSpeed(path=str(missing))
    garbage = tmp_path / "garbage.pkl"
    garbage.write_bytes(b"not a pickle at all")
    with pytest.raises(LoomInputError, match="garbage.pkl"):
        ArenaProfileSpeed(path=str(garbage))
    wrong = tmp_path / "wrong.pkl"
    wrong.write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(LoomInputError, match="wrong.pkl"):
        ArenaProfileSpeed(path=str(wrong))
    bad_key = tmp_path / "badkey.pkl"
    bad_key.write_bytes(pickle.dumps({"optimal": {"bert_760M_128": {"a100 x4": 0.5}}}))
    with pytest.raises(LoomInputError, match="badkey.pkl.*a100 x4"):
        ArenaProfileSpeed(path=str(bad_key))
    bad_value = tmp_path / "badvalue.pkl"
    bad_value.write_bytes(pickle.dumps({"optimal": {"bert_760M_128": {"1_a100_1_n_4_d": "fast"}}}))
    with pytest.raises(LoomInputError, match="badvalue.pkl"):
        ArenaProfileSpeed(path=str(bad_value))


def test_revision_json_layout(tmp_path, arena):
    path = tmp_path / "prof_database_revision.json"
    path.write_text(json.dumps({"optimal": {"bert_760M_256": {"1_h100_1_n_8_d": [5, 6.1, 1.2, 6.0, 1.2, 10.1]}}}))
    speed = ArenaProfileSpeed(path=str(path))
    assert speed.lookup("bert__760M", 256, "H100", 1, 8) == pytest.approx(6.1)


def test_simulation_finishes_jobs(arena, db_path):
    speed = ArenaProfileSpeed(path=str(db_path))
    specs = [arena_job("a"), arena_job("b", gpu_type="A10", gpus=2, t=5.0), arena_job("c", gpus=8, t=10.0)]
    derived = {s.job_id: s.duration for s in ArenaProfileSpeed(path=str(db_path)).prepare(specs, arena)}
    result = Simulation(arena, specs, FCFS(), BestFit(), speed).run()
    assert {job.job_id for job in result.jobs} == {"a", "b", "c"}
    for job in result.jobs:
        assert job.end_time is not None
        assert job.end_time - job.first_start == pytest.approx(derived[job.job_id])
