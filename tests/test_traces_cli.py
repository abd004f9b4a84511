import json
import os

from typer.testing import CliRunner

from loom.cli.main import app
from loom.workload.loaders import load_trace

runner = CliRunner()
GEN = "job_id,submit_time,gpus,duration,vc,job_class\n"


def test_validate_ok(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOM_CACHE", str(tmp_path / "cache"))
    p = tmp_path / "t.csv"
    p.write_text(GEN + "a,0,1,10,v1,sft\nb,5,8,20,v2,pretrain\n")
    result = runner.invoke(app, ["traces", "validate", f"csv:{p}"])
    assert result.exit_code == 0 and "ok: 2 jobs" in result.output


def test_validate_bad_file_exit_2(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOM_CACHE", str(tmp_path / "cache"))
    p = tmp_path / "t.csv"
    p.write_text(GEN + "a,0,1,10,v1,sft\nb,5,8,-20,v2,pretrain\n")
    result = runner.invoke(app, ["traces", "validate", f"csv:{p}"])
    assert result.exit_code == 2
    assert "line 3" in result.output and "duration" in result.output and "Traceback" not in result.output
    result = runner.invoke(app, ["traces", "validate", "no-such-trace"])
    assert result.exit_code == 2 and "unknown trace" in result.output


def test_stats_json_and_table(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOM_CACHE", str(tmp_path / "cache"))
    p = tmp_path / "t.csv"
    p.write_text(GEN + "a,0,1,10,v1,sft\nb,86400,8,20,v2,pretrain\n")
    result = runner.invoke(app, ["traces", "stats", f"csv:{p}", "--json"])
    assert result.exit_code == 0, result.output
    s = json.loads(result.output)
    assert s["jobs"] == 2 and s["span_days"] == 1.0 and s["gpu_size_histogram"] == {"1": 1, "8": 1}
    assert abs(s["gpu_time_share_by_size"]["5-8"] - 160 / 170) < 1e-9
    assert s["per_class"]["sft"]["jobs"] == 1 and s["per_vc"]["v2"]["gpu_seconds"] == 160
    result = runner.invoke(app, ["traces", "stats", f"csv:{p}"])
    assert result.exit_code == 0 and "GPU-size histogram" in result.output and "per VC" in result.output


def test_cache_hit_and_invalidation(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("LOOM_CACHE", str(cache))
    p = tmp_path / "t.csv"
    p.write_text("job_id,submit_time,gpus,duration,gpu_types,gpu_fraction,job_class\n"
                 "a,3,1,10,A40|A10,0.5,eval\nb,1,2,0,,,\n")
    first = load_trace(f"csv:{p}")
    files = list(cache.glob("*.parquet"))
    assert len(files) == 1
    again = load_trace(f"csv:{p}")
    assert again == first and again == load_trace(f"csv:{p}", cache=False)
    assert again[1].gpu_types == ("A40", "A10") and again[1].job_class.value == "eval"
    # editing the source (new mtime) invalidates
    p.write_text("job_id,submit_time,gpus,duration\nc,0,4,5\n")
    st = os.stat(p)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert [j.job_id for j in load_trace(f"csv:{p}")] == ["c"]
    # a corrupt cache file is ignored and rewritten
    for f in cache.glob("*.parquet"):
        f.write_bytes(b"garbage")
    assert [j.job_id for j in load_trace(f"csv:{p}")] == ["c"]
    assert [j.job_id for j in load_trace(f"csv:{p}")] == ["c"]


def test_cache_keeps_skip_counts(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOM_CACHE", str(tmp_path / "cache"))
    p = tmp_path / "pods.csv"
    p.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
                 "scheduled_time\np0,1,1,1,1000,,LS,Running,0,100,0\np1,1,1,0,0,,LS,Running,0,100,0\n")
    from loom.workload import cache

    reads = []
    read_cache = cache.read_cache
    monkeypatch.setattr(cache, "read_cache", lambda target: reads.append(target) or read_cache(target))
    assert load_trace(f"alibaba-pods:{p}").skipped == {"cpu-only": 1}
    assert not reads and list((tmp_path / "cache").glob("*.parquet")), "the first load did not write the cache"
    assert load_trace(f"alibaba-pods:{p}").skipped == {"cpu-only": 1}
    assert len(reads) == 1, "the second load did not come from the cache"
