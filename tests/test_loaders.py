import pytest
from conftest import write_file as _write

from loom.errors import LoomInputError
from loom.workload.job import FinalStatus, JobClass
from loom.workload.loaders import load_trace

SIA = "timestamp,duration,num_gpus,gpu_time,cluster\n"
ALI = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
ARENA = "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,gpu_type\n"
ACME = ("job_id,user,node_num,gpu_num,cpu_num,mem_per_pod_GB,shared_mem_per_pod,type,state,submit_time,start_time,"
        "end_time,fail_time,stop_time,duration,queue,gpu_time\n")
GEN = "job_id,submit_time,gpus,duration\n"


@pytest.fixture(autouse=True)
def _no_cache(no_trace_cache):
    """Loaders are tested on the source files, never on cached copies."""


def test_sia_philly(tmp_path):
    p = _write(tmp_path, SIA + "2017-10-09 07:01:55,66.0,1,66.0,11cb48\n2017-10-09 06:13:03,0,2,0,6214e9\n")
    jobs = load_trace(f"sia-philly:{p}")
    assert [(j.job_id, j.submit_time, j.gpus, j.duration, j.vc) for j in jobs] == [
        ("1", 0.0, 2, 0.0, "6214e9"), ("0", 2932.0, 1, 66.0, "11cb48")]


def test_alibaba_pods(tmp_path):
    p = _write(tmp_path, ALI
               + "p0,12000,16384,1,1000,,LS,Running,0,100,0\n"
               + "p1,6000,12288,1,460,T4,BE,Succeeded,10,200,50\n"
               + "p2,6000,12288,2,1000,V100M16|V100M32,Burstable,Failed,20,300,30\n"
               + "p3,6000,12288,0,0,,LS,Running,5,300,6\n"
               + "p4,6000,12288,1,1000,,LS,Pending,7,9,\n")
    jobs = load_trace(f"alibaba-pods:{p}")
    assert jobs.skipped == {"cpu-only": 1, "never scheduled": 1}
    a, b, c = jobs
    assert (a.job_id, a.duration, a.gpu_fraction, a.gpu_type, a.preemptible) == ("p0", 100, None, None, False)
    assert (b.gpus, b.gpu_fraction, b.gpu_type, b.gpu_types, b.preemptible, b.final_status, b.duration) == (
        1, 0.46, "T4", ("T4",), True, FinalStatus.COMPLETED, 150)
    assert (c.gpus, c.gpu_type, c.gpu_types, c.final_status, c.cpu_milli, c.memory_mib) == (
        2, None, ("V100-16GB", "V100"), FinalStatus.FAILED, 6000, 12288)


def test_alibaba_negative_duration(tmp_path):
    p = _write(tmp_path, ALI + "p0,1,1,1,1000,,LS,Running,0,100,0\np1,1,1,1,1000,,LS,Running,10,20,50\n")
    with pytest.raises(LoomInputError, match=r"line 3, field 'deletion_time'.*negative duration"):
        load_trace(f"alibaba-pods:{p}")


def test_arena(tmp_path):
    p = _write(tmp_path, ARENA + "a,10,100,bert__2.6B,50.5,256,4,a40\nb,5,7,moe__10B,,,1,A100\n")
    b, a = load_trace(f"arena:{p}")
    assert (a.model, a.iterations, a.batch_size, a.deadline, a.gpus, a.gpu_type, a.duration) == (
        "bert__2.6B", 100, 256, 50.5, 4, "A40", None)
    assert (b.gpu_type, b.batch_size, b.deadline) == ("A100-40GB", None, None)


def test_arena_unknown_gpu(tmp_path):
    p = _write(tmp_path, ARENA + "a,10,100,bert,50,256,4,h100\n")
    with pytest.raises(LoomInputError, match=r"line 2, field 'gpu_type'.*unknown GPU type"):
        load_trace(f"arena:{p}")


def test_acme(tmp_path):
    p = _write(tmp_path, ACME
               + "j1,u1,8,64,960,1000,100.0,Pretrain,COMPLETED,2023-05-17 11:00:58+00:00,"
                 "2023-05-17 11:01:08+00:00,2023-05-17 11:01:16+00:00,,,18,10.0,1152.0\n"
               + "j2,u2,1,8,1,1,1,Evaluation,FAILED,2023-05-17 11:00:00+00:00,"
                 "2023-05-17 11:00:00+00:00,2023-05-17 12:00:00+00:00,,,,,\n"
               + "j3,u2,1,0,1,1,1,Other,COMPLETED,2023-05-17 11:00:00+00:00,"
                 "2023-05-17 11:00:00+00:00,2023-05-17 12:00:00+00:00,,,,,\n"
               + "j4,u3,1,1,1,1,1,MLLM,CANCELLED,2023-05-17 11:30:00+00:00,,,,,,,\n"
               + "j5,u3,1,1,1,1,1,SFT,NODE_FAIL,2023-05-17 11:30:00+00:00,2023-05-17 11:30:00+00:00,"
                 "2023-05-17 11:30:00+00:00,,,,,\n")
    jobs = load_trace(f"acme:{p}")
    assert jobs.skipped == {"cpu-only": 1, "never started": 1}
    j2, j1, j5 = jobs
    assert (j2.submit_time, j2.duration, j2.job_class, j2.final_status, j2.gpus, j2.user) == (
        0.0, 3600.0, JobClass.EVAL, FinalStatus.FAILED, 8, "u2")
    assert (j1.submit_time, j1.duration, j1.job_class, j1.final_status) == (
        58.0, 8.0, JobClass.PRETRAIN, FinalStatus.COMPLETED)
    assert (j5.job_class, j5.final_status, j5.duration) == (JobClass.SFT, FinalStatus.FAILED, 0.0)


def test_acme_end_before_start(tmp_path):
    p = _write(tmp_path, ACME + "j1,u1,1,1,1,1,1,SFT,FAILED,2023-05-17 11:00:00+00:00,"
               "2023-05-17 11:00:10+00:00,2023-05-17 11:00:00+00:00,,,,,\n")
    with pytest.raises(LoomInputError, match=r"line 2, field 'end_time'.*negative duration"):
        load_trace(f"acme:{p}")


def test_generic_csv(tmp_path):
    p = _write(tmp_path, "job_id,submit_time,gpus,duration,job_class,final_status,preemptible,gpu_types,priority\n"
               "a,5,2,10,sft,completed,true,A100-80GB,3\nb,1,1,0,,,,A40|A10,\n")
    b, a = load_trace(f"csv:{p}")
    assert (a.gpus, a.job_class, a.final_status, a.preemptible, a.gpu_type, a.priority) == (
        2, JobClass.SFT, FinalStatus.COMPLETED, True, "A100-80GB", 3)
    assert (b.duration, b.job_class, b.preemptible, b.gpu_type, b.gpu_types, b.priority) == (
        0.0, JobClass.UNKNOWN, False, None, ("A40", "A10"), 0)


def test_generic_csv_unknown_column(tmp_path):
    p = _write(tmp_path, "job_id,submit_time,gpus,duration,gpu_tpye\na,0,1,1,A40\n")
    with pytest.raises(LoomInputError, match=r"line 1, field 'gpu_tpye'.*unknown columns"):
        load_trace(f"csv:{p}")


@pytest.mark.parametrize("fmt, header, good, bad, field, message", [
    ("csv", GEN, "a,0,1,1\n", "b,x,1,1\n", "submit_time", "not a number"),
    ("csv", GEN, "a,0,1,1\n", "b,0,1.5,1\n", "gpus", "not an integer"),
    ("csv", GEN, "a,0,1,1\n", "b,0,1,-1\n", "duration", "negative duration"),
    ("csv", GEN, "a,0,1,1\n", "b,0,0,1\n", "gpus", "≥ 1"),
    ("csv", GEN, "a,0,1,1\n", "b,0,1\n", "duration", "missing value"),
    ("csv", GEN, "a,0,1,1\n", "a,0,1,1\n", "job_id", "duplicate"),
    ("sia-philly", SIA, "2017-10-09 07:01:55,6,1,6,x\n", "yesterday,6,1,6,x\n", "timestamp", "not a timestamp"),
    ("sia-philly", SIA, "2017-10-09 07:01:55,6,1,6,x\n", "2017-10-09 07:01:55,-6,1,6,x\n", "duration", "negative"),
    ("alibaba-pods", ALI, "p0,1,1,1,1000,,LS,Running,0,100,0\n", "p1,1,1,two,1000,,LS,Running,0,100,0\n",
     "num_gpu", "not an integer"),
    ("arena", ARENA, "a,1,1,m,5,1,1,a40\n", "b,1,1,m,5,1,-1,a40\n", "num_gpu", "≥ 1"),
    ("rfold", "#job id,arrival time (sec),topology,shape,size,duration (sec)\n", "0,0,CLOS,1,1,5\n",
     "1,0,CLOS,1,1,-5\n", "duration (sec)", "negative duration"),
])
def test_bad_rows_are_located(tmp_path, fmt, header, good, bad, field, message):
    p = _write(tmp_path, header + good + bad)
    with pytest.raises(LoomInputError) as err:
        load_trace(f"{fmt}:{p}")
    text = str(err.value)
    assert str(p) in text and "line 3" in text and f"field '{field}'" in text and message in text, text


@pytest.mark.parametrize("fmt", ["csv", "sia-philly", "alibaba-pods", "arena", "acme", "rfold"])
def test_empty_file_and_missing_column(tmp_path, fmt):
    p = _write(tmp_path, "")
    with pytest.raises(LoomInputError, match=r"line 1.*empty file"):
        load_trace(f"{fmt}:{p}")
    p = _write(tmp_path, "job_id\nx\n", "m.csv")
    with pytest.raises(LoomInputError, match=r"line 1.*missing columns"):
        load_trace(f"{fmt}:{p}")


def test_too_many_fields_is_located(tmp_path):
    p = _write(tmp_path, GEN + "a,0,1,1\nb,0,1,1,9,9\n")
    with pytest.raises(LoomInputError, match=r"line 3.*fields"):
        load_trace(f"csv:{p}")


def test_rfold_fractional_size(tmp_path):
    p = _write(tmp_path, "#job id,arrival time (sec),topology,shape,size,duration (sec)\n0,0,CLOS,0.5,0.5,5\n"
               "1,1,CLOS,2,2.0,5\n")
    a, b = load_trace(f"rfold:{p}")
    assert (a.gpus, a.gpu_fraction, b.gpus, b.gpu_fraction) == (1, 0.5, 2, None)


EXPECTED = {  # README row counts minus documented skips
    "philly": 111_549, "philly-vc": 82_247, "alibaba-rfold": 4_334,
    "alibaba-v2023": 8_152 - 1_088 - 861, "alibaba-v2023-default": 8_152 - 1_088 - 861,
    "arena-philly": 1_938, "arena-pai": 125, "arena-venus": 438,
}


# named traces added by later loaders are tested in tests/test_more_loaders.py
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_named_traces_load(name):
    jobs = load_trace(name)
    assert len(jobs) == EXPECTED[name]
    if name in ("alibaba-v2023", "alibaba-v2023-default"):
        assert jobs.skipped == {"cpu-only": 1_088, "never scheduled": 861}
    if name == "alibaba-v2023":
        assert sum(1 for j in jobs if j.gpu_types) > 0
