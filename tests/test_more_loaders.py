"""Loaders added for ElasticFlow, Sia workloads, Tethys (Acme-Kalos) and the Alibaba multi-GPU pod bag."""

import pytest
from conftest import write_file as _write

from loom.errors import LoomInputError
from loom.workload.job import JobClass
from loom.workload.loaders import NAMED_TRACES, load_trace

EF = "job_id,submit_time,real_iteration,model_name,ddl,batch_size,num_gpu,real_duration,duration,iteration\n"
SIA = "name,time,application,num_replicas,batch_size\n"
TETHYS = ("job_id,arrival_time,num_iteration,iteration_computing_time,iteration_networking_time,gpu_workers,ps,"
          "gpu_per_worker,cpu_per_gpu_worker,cpu_per_ps_worker,tensorsizes,profiled_network\n")
ALI = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"


@pytest.fixture(autouse=True)
def _no_cache(no_trace_cache):
    """Loaders are tested on the source files, never on cached copies."""


def test_elasticflow(tmp_path):
    p = _write(tmp_path, EF + "0,100,1282877,vgg16,771220,256,1,976570,900000,1282000\n"
                              "1,0,118680,bert,281132,64,4,23487,23487,118680\n")
    b, a = load_trace(f"elasticflow:{p}")
    assert (a.job_id, a.submit_time, a.gpus, a.duration, a.model, a.deadline, a.iterations, a.batch_size, a.vc) == (
        "0", 100.0, 1, 976570.0, "vgg16", 771220.0, 1282877, 256, "103959")
    assert (b.job_id, b.gpus, b.model, b.duration) == ("1", 4, "bert", 23487.0)


def test_elasticflow_deadline_before_submit(tmp_path):
    p = _write(tmp_path, EF + "0,0,10,vgg16,50,256,1,40,40,10\n1,100,10,bert,99,64,4,40,40,10\n")
    with pytest.raises(LoomInputError, match=r"t\.csv.*line 3, field 'ddl'.*deadline before submission"):
        load_trace(f"elasticflow:{p}")


def test_elasticflow_negative_duration(tmp_path):
    p = _write(tmp_path, EF + "0,0,10,vgg16,50,256,1,-4,40,10\n")
    with pytest.raises(LoomInputError, match=r"t\.csv.*line 2, field 'real_duration'.*negative duration"):
        load_trace(f"elasticflow:{p}")


def test_sia_workload(tmp_path):
    p = _write(tmp_path, SIA + "cifar10-0,401.0,cifar10,12,4096\nbert-1,107,bert,6,64\n")
    b, a = load_trace(f"sia-workload:{p}")
    assert (a.job_id, a.submit_time, a.gpus, a.model, a.batch_size, a.duration) == (
        "cifar10-0", 401.0, 12, "cifar10", 4096, None)
    assert (b.job_id, b.submit_time, b.gpus, b.model, b.batch_size) == ("bert-1", 107.0, 6, "bert", 64)


def test_sia_workload_bad_replicas(tmp_path):
    p = _write(tmp_path, SIA + "a,1,cifar10,2,64\nb,2,cifar10,0,64\n")
    with pytest.raises(LoomInputError, match=r"t\.csv.*line 3, field 'num_replicas'.*must be ≥ 1"):
        load_trace(f"sia-workload:{p}")


def test_tethys(tmp_path):
    p = _write(tmp_path, TETHYS + "0,0.0,208,0.5,0.25,8,0,8.0,15.0,15.0,10.0,500\n"
                                  "1,313.0,100,0.5,0.75,1,0,2.0,15.0,15.0,10.0,1000\n")
    a, b = load_trace(f"tethys:{p}")
    assert (a.job_id, a.submit_time, a.gpus, a.iterations, a.duration, a.job_class) == (
        "0", 0.0, 64, 208, 156.0, JobClass.UNKNOWN)
    assert (b.submit_time, b.gpus, b.duration) == (313.0, 2, 125.0)


def test_tethys_fractional_gpus_per_worker(tmp_path):
    p = _write(tmp_path, TETHYS + "0,0.0,208,0.5,0.25,8,0,8.5,15.0,15.0,10.0,500\n")
    with pytest.raises(LoomInputError, match=r"t\.csv.*line 2, field 'gpu_per_worker'.*not an integer"):
        load_trace(f"tethys:{p}")


def test_alibaba_multigpu(tmp_path):
    p = _write(tmp_path, ALI + "p0,12000,16384,1,1000\np1,6000,12288,1,460\np2,4000,0,0,0\np3,88000,327680,8,1000\n")
    jobs = load_trace(f"alibaba-multigpu:{p}")
    assert jobs.skipped == {"cpu-only": 1}
    assert [(j.job_id, j.submit_time, j.gpus, j.duration, j.gpu_fraction, j.cpu_milli, j.memory_mib) for j in jobs] == [
        ("p0", 0.0, 1, None, None, 12000, 16384), ("p1", 0.0, 1, None, 0.46, 6000, 12288),
        ("p3", 0.0, 8, None, None, 88000, 327680)]


def test_alibaba_multigpu_bad_number(tmp_path):
    p = _write(tmp_path, ALI + "p0,12000,16384,1,1000\np1,6000,12288,two,460\n")
    with pytest.raises(LoomInputError, match=r"t\.csv.*line 3, field 'num_gpu'.*not an integer"):
        load_trace(f"alibaba-multigpu:{p}")


EXPECTED = {  # README row counts (minus documented skips)
    "philly-elasticflow": 876,
    "acme-kalos-large": 319,
    "alibaba-v2023-multigpu": 9_061 - 1_088,
    **{f"sia-philly-w{i}": 160 for i in range(1, 9)},
    **{f"sia-saturn-w{i}": 160 for i in range(1, 11)},
}
KALOS_SIZES = {1: 29, 2: 41, 8: 19, 16: 11, 32: 14, 64: 22, 96: 3, 128: 3, 256: 52, 296: 1, 320: 1, 496: 4,
               504: 7, 512: 73, 1016: 1, 1024: 38}


def test_named_traces_registered():
    assert set(EXPECTED) <= set(NAMED_TRACES)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_named_traces_load(name):
    jobs = load_trace(name)
    assert len(jobs) == EXPECTED[name]
    if name == "alibaba-v2023-multigpu":
        assert jobs.skipped == {"cpu-only": 1_088}
        sizes = {g: sum(1 for j in jobs if j.gpus == g) for g in (2, 4, 8)}
        assert sizes == {2: 222, 4: 206, 8: 556}
        assert all(j.submit_time == 0 and j.duration is None for j in jobs)
    elif name == "acme-kalos-large":
        sizes: dict[int, int] = {}
        for j in jobs:
            sizes[j.gpus] = sizes.get(j.gpus, 0) + 1
        assert sizes == KALOS_SIZES
        durations = sorted(j.duration for j in jobs)
        assert durations[len(durations) // 2] == pytest.approx(500, rel=0.05)  # README: p50 ≈ 500 s
        assert durations[-1] / 86400 == pytest.approx(18, rel=0.05)  # max ≈ 18 days
        assert jobs[-1].submit_time / 86400 == pytest.approx(90, rel=0.01)  # 90-day span
    elif name == "philly-elasticflow":
        assert {j.gpus for j in jobs} == {1, 2, 4}
        assert all(j.deadline >= j.submit_time and j.vc == "103959" and j.model for j in jobs)
        assert jobs[-1].submit_time / 86400 == pytest.approx(91.6, abs=0.1)
    else:
        assert all(j.duration is None and j.model and j.batch_size for j in jobs)
        assert jobs[-1].submit_time <= 8 * 3600
