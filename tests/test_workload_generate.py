"""Synthetic Acme workloads: `loom.workload.generate` and `loom workload generate|validate`."""

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from loom.cli import workload as workload_cli
from loom.errors import LoomInputError
from loom.paths import shared_traces_dir
from loom.perf.presets import preset_names
from loom.workload.generate import generate, validate, write_csv
from loom.workload.job import FinalStatus, JobClass
from loom.workload.loaders import load_trace
from loom.workload.profiles import get_profile, profile_names

runner = CliRunner()


def _cli() -> typer.Typer:
    app = typer.Typer(pretty_exceptions_enable=False)
    workload_cli.register(app)

    @app.command()
    def _noop() -> None:  # a second command keeps `workload` a sub-command group
        pass

    return app


@pytest.fixture(scope="module")
def kalos60():
    return generate("acme-kalos", 60, seed=0)


@pytest.fixture(scope="module")
def seren30():
    return generate("acme-seren", 30, seed=0)


def _arrays(jobs):
    cls = np.array([j.job_class.value for j in jobs])
    gpus = np.array([j.gpus for j in jobs])
    dur = np.array([j.duration for j in jobs])
    return cls, gpus, dur, gpus * dur


def test_profiles_known():
    assert {"acme-kalos", "acme-seren"} <= set(profile_names())
    assert get_profile("acme-kalos").cluster == "acme-kalos"


def test_deterministic_per_seed():
    a, b = generate("acme-kalos", 5, seed=7), generate("acme-kalos", 5, seed=7)
    assert a == b and len(a) > 100
    assert generate("acme-kalos", 5, seed=8) != a
    assert [j.submit_time for j in a] == sorted(j.submit_time for j in a)
    assert len({j.job_id for j in a}) == len(a)


def test_kalos_class_shares(kalos60):
    cls, gpus, dur, gt = _arrays(kalos60)
    assert abs(len(kalos60) / 60 - 19907 / 183) < 0.1 * 19907 / 183
    assert abs(gt[cls == "pretrain"].sum() / gt.sum() - 0.94) < 0.05
    assert abs((cls == "pretrain").mean() - 0.032) < 0.01
    assert abs((cls == "eval").mean() - 0.929) < 0.02
    assert gt[cls == "eval"].sum() / gt.sum() < 0.02
    assert gpus[cls == "eval"].max() <= 4
    pre = gpus[cls == "pretrain"]
    assert pre.min() > 100 and (pre % 8 == 0).all() and pre.max() <= 1024
    assert 120 / 1.5 <= np.median(dur) <= 120 * 1.5
    failed = np.array([j.final_status == FinalStatus.FAILED for j in kalos60])
    assert abs(failed.mean() - 0.40) < 0.05
    assert all(j.final_status != FinalStatus.UNKNOWN for j in kalos60)


def test_failed_jobs_end_early(kalos60):
    cls, _, dur, _ = _arrays(kalos60)
    status = np.array([j.final_status.value for j in kalos60])
    for c in ("eval", "debug"):
        done = dur[(cls == c) & (status == "completed")]
        fail = dur[(cls == c) & (status == "failed")]
        assert np.median(fail) < 0.5 * np.median(done)


def test_pretrain_jobs_have_models_and_are_not_preemptible(kalos60):
    names = set(preset_names())
    pre = [j for j in kalos60 if j.job_class == JobClass.PRETRAIN]
    assert pre and all(j.model in names and not j.preemptible for j in pre)
    assert all(j.announce_time is not None and j.announce_time <= j.submit_time for j in pre)
    assert max(j.priority for j in kalos60) == pre[0].priority
    assert any(j.preemptible for j in kalos60 if j.job_class in (JobClass.EVAL, JobClass.DEBUG))


def test_eval_batches_follow_pretraining(kalos60):
    evals = [j for j in kalos60 if j.job_class == JobClass.EVAL and j.model is not None]
    assert len(evals) > 100  # checkpoint evaluations carry the pretrained model's name
    pretrain: dict = {}
    for j in kalos60:  # sorted by submit time: keep each (user, model)'s first pretraining job
        if j.job_class == JobClass.PRETRAIN:
            pretrain.setdefault((j.user, j.model), j.submit_time)
    assert all(any(u == e.user and m == e.model and t < e.submit_time for (u, m), t in pretrain.items())
               for e in evals[:50])


def test_users_and_vcs(kalos60):
    vcs = {j.vc for j in kalos60}
    assert 3 <= len(vcs) <= 10
    users = [j.user for j in kalos60 if j.vc == "llm-eval"]
    counts = sorted((users.count(u) for u in set(users)), reverse=True)
    assert counts[0] > 3 * counts[-1]  # Zipf-like


def test_daily_cycle_correlates_with_venus(kalos60, seren30):
    hours = get_profile("acme-kalos").hour_of_day
    for jobs, lowest in ((kalos60, 0.5), (seren30, 0.9)):
        t = np.array([j.submit_time for j in jobs])
        hourly = np.bincount(((t % 86400) // 3600).astype(int), minlength=24)
        assert np.corrcoef(hourly, hours)[0, 1] > lowest


def test_venus_factors_match_shared_series():
    try:
        path = shared_traces_dir() / "helios" / "Venus_cluster_throughput.csv"
    except LoomInputError:
        pytest.skip("shared traces folder not available")
    if not path.is_file():
        pytest.skip("shared Venus series not available")
    import polars as pl

    df = pl.read_csv(path, try_parse_dates=True).with_columns(pl.col("time").dt.hour().alias("h"))
    by_hour = df.group_by("h").agg(pl.col("submit_gpu_job").sum()).sort("h")["submit_gpu_job"].to_numpy()
    assert np.allclose(by_hour / by_hour.mean(), get_profile("acme-kalos").hour_of_day, atol=2e-3)


def test_seren_calibration(seren30):
    jobs = seren30
    cls, gpus, dur, gt = _arrays(jobs)
    assert abs(len(jobs) - 30 * 663813 / 183) < 0.05 * 30 * 663813 / 183
    assert abs(gt[cls == "pretrain"].sum() / gt.sum() - 0.695) < 0.12
    assert 122 / 1.5 <= np.median(dur) <= 122 * 1.5
    assert np.median(gpus) == 1 and abs(gpus.mean() - 5.68) < 1.5
    failed = np.mean([j.final_status == FinalStatus.FAILED for j in jobs])
    assert abs(failed - 0.429) < 0.05


def test_csv_round_trip(tmp_path):
    jobs = generate("acme-kalos", 3, seed=1)
    path = write_csv(jobs, tmp_path / "k.csv")
    assert list(load_trace(f"csv:{path}", cache=False)) == jobs


def test_scale_multiplies_job_count():
    small, big = generate("acme-seren", 2, seed=0), generate("acme-seren", 2, seed=0, scale=2.0)
    assert 1.8 < len(big) / len(small) < 2.2


def test_validate_rows(kalos60):
    rows = validate(kalos60, "acme-kalos", days=60)
    by = {r["metric"]: r for r in rows}
    assert {"metric", "generated", "published", "relation", "source"} <= set(rows[0])
    assert by["median run time (s)"]["published"] == 124.0
    assert by["job share: eval"]["published"] == pytest.approx(0.929)
    assert abs(by["GPU jobs per day"]["generated"] - len(kalos60) / 60) < 1e-9
    assert any(m.startswith("GPU-size histogram") for m in by)


def test_bad_arguments_raise_input_errors():
    with pytest.raises(LoomInputError, match="unknown workload profile"):
        generate("acme-nope", 1, 0)
    with pytest.raises(LoomInputError, match="days must be > 0"):
        generate("acme-kalos", 0, 0)
    with pytest.raises(LoomInputError, match="scale must be > 0"):
        generate("acme-kalos", 1, 0, scale=-1)


def test_cli_generate_and_validate(tmp_path):
    out = tmp_path / "sub" / "kalos.csv"
    app = _cli()
    result = runner.invoke(app, ["workload", "generate", "--profile", "acme-kalos", "--days", "3", "--seed", "2",
                                 "--out", str(out), "--validate"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert out.is_file() and "generated vs published" in result.output and "median run time" in result.output
    assert list(load_trace(f"csv:{out}", cache=False)) == generate("acme-kalos", 3, seed=2)
    result = runner.invoke(app, ["workload", "validate", str(out), "--profile", "acme-kalos"], terminal_width=200)
    assert result.exit_code == 0 and "fraction failed" in result.output
    result = runner.invoke(app, ["workload", "validate", f"csv:{out}", "--profile", "acme-kalos", "--json"])
    assert result.exit_code == 0 and '"metric"' in result.output


@pytest.mark.parametrize("args, message", [
    (["--profile", "acme-nope", "--days", "1"], "unknown workload profile"),
    (["--profile", "acme-kalos", "--days", "0"], "days must be > 0"),
    (["--profile", "acme-kalos", "--days", "-2"], "days must be > 0"),
    (["--profile", "acme-kalos", "--days", "1", "--scale", "0"], "scale must be > 0"),
    (["--profile", "acme-kalos", "--days", "1", "--outcomes", "maybe"], "outcomes must be one of"),
])
def test_cli_bad_arguments(tmp_path, args, message):
    result = runner.invoke(_cli(), ["workload", "generate", *args, "--out", str(tmp_path / "x.csv")])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "x.csv").exists()


@pytest.mark.parametrize("profile", ["acme-kalos", "acme-seren"])
def test_would_be_outcomes_change_only_failed_and_cancelled_jobs(profile):
    days = 10 if profile == "acme-kalos" else 1
    rec, wb = generate(profile, days, seed=5), generate(profile, days, seed=5, outcomes="would-be")
    assert len(rec) == len(wb)
    changed = 0
    for r, w in zip(rec, wb):
        assert w.final_status == FinalStatus.COMPLETED
        assert (r.job_id, r.submit_time, r.gpus, r.job_class, r.user, r.vc, r.model, r.preemptible, r.priority,
                r.announce_time) == (w.job_id, w.submit_time, w.gpus, w.job_class, w.user, w.vc, w.model,
                                     w.preemptible, w.priority, w.announce_time)
        if r.final_status == FinalStatus.COMPLETED:
            assert r.duration == w.duration
        else:
            assert w.duration >= r.duration
            changed += w.duration > r.duration
    assert changed > 0.8 * sum(r.final_status != FinalStatus.COMPLETED for r in rec)
    assert generate(profile, days, seed=5, outcomes="would-be") == wb
    with pytest.raises(LoomInputError) as err:
        generate(profile, 1, outcomes="would be")
    assert err.value.field == "outcomes"


def test_cli_generate_would_be(tmp_path):
    out = tmp_path / "wb.csv"
    result = runner.invoke(_cli(), ["workload", "generate", "--profile", "acme-kalos", "--days", "2", "--seed", "1",
                                    "--outcomes", "would-be", "--out", str(out)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert list(load_trace(f"csv:{out}", cache=False)) == generate("acme-kalos", 2, seed=1, outcomes="would-be")
