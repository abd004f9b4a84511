"""JCT predictor (loom.predict): leakage, determinism, save/load, quantiles, sim plug-in, CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from loom.cli.predict import register
from loom.core.protocols import PLACERS, POLICIES
from loom.hardware.clos import clos
from loom.predict import (
    JctPredictor,
    RecentHistoryBaseline,
    duration_bin,
    killed_early,
    runtime_estimator,
)
from loom.predict import features as F
from loom.predict.evaluate import evaluate_specs, metrics, time_split
from loom.sim.engine import Simulation
from loom.workload.job import FinalStatus, JobClass, JobSpec

FAST = {"n_bags": 2, "num_rounds": 15}


def synthetic(n: int = 600, seed: int = 0, users: int = 8) -> list[JobSpec]:
    """Duration depends on the user (log-normal around 2^u × 5 min), GPUs on the user too."""
    rng = np.random.default_rng(seed)
    specs = []
    t = 0.0
    for i in range(n):
        t += float(rng.exponential(600.0))
        u = int(rng.integers(0, users))
        dur = float(300.0 * 2 ** (u * 0.7) * rng.lognormal(0.0, 0.3))
        specs.append(JobSpec(job_id=f"j{i}", submit_time=t, gpus=1 + (u % 3) * 3, duration=dur, user=f"u{u}",
                             vc=f"vc{u % 2}", job_class=JobClass.SFT if u % 2 else JobClass.EVAL,
                             final_status=FinalStatus.COMPLETED))
    return specs


@pytest.fixture(scope="module")
def trained() -> tuple[JctPredictor, list[JobSpec], list[JobSpec]]:
    split = time_split(synthetic(), 0.7)
    return JctPredictor(seed=3, **FAST).fit(split.train), split.train, split.test


def test_bins_and_kill_rule():
    assert duration_bin(0.0) == 0 and duration_bin(599.9) == 0 and duration_bin(600.0) == 1
    assert duration_bin(10**7) == F.MAX_BIN
    assert list(duration_bin(np.array([0.0, 1200.0, 1e9]))) == [0, 2, F.MAX_BIN]
    short_cancel = JobSpec("a", 0.0, 1, duration=100.0, final_status=FinalStatus.CANCELLED)
    long_cancel = JobSpec("b", 0.0, 1, duration=7200.0, final_status=FinalStatus.CANCELLED)
    failed = JobSpec("c", 0.0, 1, duration=10.0, final_status=FinalStatus.FAILED)
    assert killed_early(short_cancel) and not killed_early(long_cancel) and not killed_early(failed)
    assert F.training_jobs([short_cancel, long_cancel, failed]) == [long_cancel, failed]


def test_history_features_ignore_jobs_finishing_after_submit():
    base = [JobSpec("a", 0.0, 1, duration=100.0, user="u"), JobSpec("b", 10.0, 1, duration=50.0, user="u")]
    q = JobSpec("q", 200.0, 1, duration=5.0, user="u")
    later = JobSpec("c", 150.0, 1, duration=10_000.0, user="u")  # submitted before q, ends after q's submit
    future = JobSpec("d", 300.0, 1, duration=1.0, user="u")  # submitted after q
    vocab = F.build_vocab(base)
    x1 = F.feature_matrix([q], base, vocab)
    x2 = F.feature_matrix([q], base + [later, future, q], vocab)
    names = F.feature_names()
    col = {n: i for i, n in enumerate(names)}
    for stat in ("n", "mean", "med", "last", "std"):
        assert x1[0, col[f"h_user_{stat}"]] == x2[0, col[f"h_user_{stat}"]]
    assert x1[0, col["h_user_mean"]] == pytest.approx(np.mean(np.log1p([100.0, 50.0])))
    # `later` is submitted before q and still running: visible as unfinished, its duration is not
    assert x2[0, col["h_user_unfinished"]] == 1 and x1[0, col["h_user_unfinished"]] == 0
    # a job's own duration never enters its features
    x3 = F.feature_matrix([q], [q], vocab)
    assert x3[0, col["h_user_n"]] == 0 and np.isnan(x3[0, col["h_user_mean"]])


def test_deterministic_per_seed(trained):
    model, train, test = trained
    again = JctPredictor(seed=3, **FAST).fit(train)
    p1, p2 = model.predict(test, history=test), again.predict(test, history=test)
    assert np.array_equal(p1.expected_bin, p2.expected_bin) and np.array_equal(p1.quantiles[0.9], p2.quantiles[0.9])
    other = JctPredictor(seed=4, **FAST).fit(train).predict(test, history=test)
    assert not np.array_equal(p1.expected_bin, other.expected_bin)


@pytest.mark.parametrize("mode", ["classify", "regress"])
def test_save_load_round_trip_and_quantiles_ordered(tmp_path, trained, mode):
    _, train, test = trained
    model = trained[0] if mode == "classify" else JctPredictor(mode=mode, seed=1, **FAST).fit(train)
    path = model.save(tmp_path / "m.json")
    text = path.read_text()
    assert json.loads(text)["format"] == "loom-jct-predictor"
    back = JctPredictor.load(path)
    p1, p2 = model.predict(test, history=test), back.predict(test, history=test)
    for a, b in ((p1.bin, p2.bin), (p1.expected_bin, p2.expected_bin), (p1.seconds, p2.seconds),
                 (p1.quantiles[0.5], p2.quantiles[0.5]), (p1.quantiles[0.9], p2.quantiles[0.9])):
        assert np.array_equal(a, b)
    assert np.all(p1.quantiles[0.5] <= p1.quantiles[0.9] + 1e-9)
    assert np.all(p1.quantiles[0.5] >= 0) and np.all((p1.bin >= 0) & (p1.bin <= F.MAX_BIN))


def test_beats_global_median_when_duration_depends_on_user(trained):
    model, train, test = trained
    pred = model.predict(test, history=test)
    true = duration_bin(np.array([s.duration for s in test])).astype(float)
    global_bin = duration_bin(float(np.median([s.duration for s in train])))
    rmse_global = float(np.sqrt(np.mean((global_bin - true) ** 2)))
    m = metrics(pred, test)
    assert m["rmse_bins"] < 0.7 * rmse_global
    assert m["within1"] > 0.55 and 0.75 <= m["cov_p90"] <= 1.0


def test_evaluate_reports_model_and_baseline():
    res = evaluate_specs(synthetic(300, seed=2), modes=("classify", "regress"), n_bags=2)
    assert set(res["results"]) == {"gbm-classify", "gbm-regress", "baseline"}
    assert res["train_jobs"] == 210 and res["test_jobs"] == 90
    for row in res["results"].values():
        assert 0 <= row["acc"] <= row["within1"] <= 1 and 0 <= row["cov_p50"] <= row["cov_p90"] <= 1
    base = RecentHistoryBaseline().fit(synthetic(50)).predict(synthetic(50))
    assert np.all(base.quantiles[0.5] <= base.quantiles[0.9])


def test_runtime_estimator_plugs_into_simulation(trained):
    model, _, test = trained
    topo = clos("t", minipods=1, nodes=4, gpus_per_node=8, gpu_type="A100-80GB", nodes_per_leaf=2)
    specs = test[:40]
    for est in (runtime_estimator(model, quantile=0.9, specs=specs), runtime_estimator(model, quantile=0.5)):
        for policy in ("sjf", "easy"):
            sim = Simulation(topo, specs, POLICIES.get(policy)(), PLACERS.get("best-fit")(), runtime_estimate=est)
            result = sim.run()
            assert len(result.jobs) == 40 and all(j.end_time is not None for j in result.jobs)
        job = result.jobs[0]
        assert est(job) >= 60.0  # finished: remaining belief floors at 60 s
    batch = runtime_estimator(model, quantile=0.9, specs=specs)
    fresh = Simulation(topo, specs, POLICIES.get("fcfs")(), PLACERS.get("best-fit")()).jobs
    p90 = model.predict(specs, history=specs).quantiles[0.9]
    assert [batch(j) for j in fresh[:5]] == pytest.approx([max(v, 60.0) for v in p90[:5]])


def _cli() -> typer.Typer:
    app = typer.Typer(pretty_exceptions_enable=False)

    @app.callback()
    def _root() -> None:
        pass

    register(app)
    return app


def test_cli_train_eval_and_errors(tmp_path):
    runner = CliRunner()
    app = _cli()
    csv = tmp_path / "t.csv"
    rows = ["job_id,submit_time,gpus,duration,user,vc,job_class,final_status"]
    rows += [f"{s.job_id},{s.submit_time},{s.gpus},{s.duration},{s.user},{s.vc},{s.job_class.value},"
             f"{s.final_status.value}" for s in synthetic(200, seed=5)]
    csv.write_text("\n".join(rows) + "\n")
    out = tmp_path / "m.json"
    r = runner.invoke(app, ["predict", "train", "--trace", f"csv:{csv}", "--out", str(out), "--bags", "2"])
    assert r.exit_code == 0, r.output
    assert out.is_file() and "trained classify" in r.output
    r = runner.invoke(app, ["predict", "eval", "--trace", f"csv:{csv}", "--model", str(out), "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output)
    assert set(res["results"]) == {"gbm-classify", "baseline"} and res["test_jobs"] == 60
    r = runner.invoke(app, ["predict", "eval", "--trace", f"csv:{csv}", "--bags", "1"])
    assert r.exit_code == 0 and "RMSE" in r.output and "baseline" in r.output and "gbm-classify" in r.output
    for args, msg in (
        (["predict", "eval", "--trace", "no-such-trace"], "unknown trace"),
        (["predict", "eval", "--trace", f"csv:{csv}", "--model", str(tmp_path / "missing.json")], "not found"),
        (["predict", "train", "--trace", f"csv:{csv}", "--out", str(out), "--mode", "bogus"], "unknown mode"),
    ):
        r = runner.invoke(app, args)
        assert r.exit_code == 2, r.output
        assert msg in r.output and "Traceback" not in r.output
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = runner.invoke(app, ["predict", "eval", "--trace", f"csv:{csv}", "--model", str(bad)])
    assert r.exit_code == 2 and "not valid JSON" in r.output
    bad.write_text(json.dumps({"format": "loom-jct-predictor", "version": 1, "mode": "classify"}))
    r = runner.invoke(app, ["predict", "eval", "--trace", f"csv:{csv}", "--model", str(bad)])
    assert r.exit_code == 2 and "corrupt" in r.output and "Traceback" not in r.output


def test_real_trace_slice_history_has_no_leak():
    from loom.errors import LoomInputError
    from loom.paths import shared_traces_dir
    from loom.workload.loaders import NAMED_TRACES, load_trace

    try:  # shared traces are optional: skip only when the file is absent; a loader error fails
        path = shared_traces_dir() / NAMED_TRACES["philly-vc"][1]
    except LoomInputError:
        pytest.skip("shared traces folder not available")
    if not path.is_file():
        pytest.skip(f"philly-vc trace not available: {path}")
    jobs = list(load_trace("philly-vc"))[:800]
    vocab = F.build_vocab(jobs)
    col = F.feature_names().index("h_vc_n")
    x = F.feature_matrix(jobs, jobs, vocab)
    for i in (100, 400, 799):
        t, vc = jobs[i].submit_time, jobs[i].vc
        finished = sum(1 for s in jobs if s.vc == vc and s.submit_time + s.duration < t and s.job_id != jobs[i].job_id)
        assert x[i, col] == pytest.approx(np.log1p(finished))
