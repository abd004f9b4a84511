"""Fuzzed trace and topology files give located `LoomInputError`s, never tracebacks.

Every case starts from a small valid seed file per format (traces: rfold,
sia-philly, alibaba-pods, arena, acme, csv; topologies: yaml, tiers-csv, slurm,
philly, alibaba-nodes, pai-machines, zhejianglab) and applies one mutation:
dropped or renamed columns, truncated rows, cells of the wrong type, negative
or huge numbers, empty files, duplicates, unicode garbage, binary blobs, and
for topologies also cycles, unknown parents, bad hostlists, unknown GPU types...

The cases are built deterministically at import time (a seeded `random.Random`
only picks which data row to mutate) and listed through `pytest.mark.parametrize`
so each one is visible by id. A case either loads (then it must return jobs /
nodes) or raises `LoomInputError` whose text names the file and, where we know
which line or column we broke, that line and column. Any other exception fails.

Cases that expose a real loom bug are marked `xfail(strict=True)` with the bug
in the reason (see KNOWN_BUGS); the suite stays green and flips to XPASS
(a failure) once the bug is fixed, so the mark must then be removed.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fuzzcases import ALL_CASES, CLUSTER_CASES, KNOWN_BUGS, TRACE_CASES, Case
from loom.cli.main import app
from loom.errors import LoomInputError
from loom.hardware.clusters import load_cluster
from loom.workload.loaders import load_trace

_load_cluster = load_cluster.__wrapped__  # bypass the lru_cache: every case is a fresh file anyway



def _param(case: Case):
    marks = list(case.marks)
    if case.id in KNOWN_BUGS:
        marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[case.id]))
    return pytest.param(case, id=case.id, marks=marks)


def _write(directory: Path, case: Case, tag: str = "") -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", case.id)
    path = directory / f"{safe}{tag}{case.suffix}"
    if isinstance(case.content, bytes):
        path.write_bytes(case.content)
    else:
        path.write_bytes(case.content.encode("utf-8"))
    return path


def _spec(case: Case, path: Path) -> str:
    return f"{case.fmt}:{path}{case.query}"


def _load(case: Case, path: Path):
    if case.kind == "trace":
        return load_trace(_spec(case, path), cache=False)
    return _load_cluster(_spec(case, path))


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch):
    monkeypatch.setenv("LOOM_CACHE", "off")


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory) -> Path:
    """One directory for all cases (file names are the unique case ids): far cheaper than tmp_path per case."""
    return tmp_path_factory.mktemp("fuzz")


def test_case_count():
    ids = [c.id for c in ALL_CASES]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    assert len(ALL_CASES) >= 200


@pytest.mark.parametrize("case", [_param(c) for c in ALL_CASES])
def test_fuzzed_input(fuzz_dir, case: Case):
    path = _write(fuzz_dir, case)
    try:
        result = _load(case, path)
    except LoomInputError as err:
        text = str(err)
        assert case.expect != "ok", f"valid input was refused: {text}"
        assert str(path) in text, f"error does not name the file: {text}"
        assert err.source is not None and str(path) in err.source, text
        if case.line is not None:
            assert err.line == case.line and f"line {case.line}" in text, f"expected line {case.line}: {text}"
        if case.fields:
            assert err.field in case.fields, f"expected a field in {case.fields}: {text}"
            assert f"field '{err.field}'" in text
        if case.words:
            assert case.words in text, text
        return
    assert case.expect != "err", f"bad input was accepted: {result!r:.300}"
    if case.kind == "trace":
        if case.id.endswith("-header-only"):
            assert len(result) == 0
        else:
            assert len(result) > 0
    else:
        assert result.num_nodes > 0


# ------------------------------------------------------- resource limits
# Huge node counts are refused by a count limit (1,000,000 nodes) before anything is expanded; a
# count under the limit loads. What is checked is the outcome, not how long it took.
HUGE_CASES = [
    pytest.param("slurm", "SwitchName=s0 Nodes=n[0-999999]-m[0-999999]\n", "?gpu_type=H100", ".conf",
                 "expands to more than 1,000,000 hosts", id="slurm-hostlist-product-1e12"),
    pytest.param("yaml", "name: x\ntiers: [{name: leaf}]\nnodes:\n"
                         "  - {path: [l0], count: 1000000000000, gpu_type: H100, gpus: 8}\n", "", ".yaml",
                 "expected an integer from 1 to 1,000,000", id="yaml-count-1e12"),
    pytest.param("slurm", "SwitchName=s0 Nodes=n[0-999]-m[0-99]\n", "?gpu_type=H100", ".conf",
                 1000 * 100, id="slurm-hostlist-product-1e5"),
]


@pytest.mark.parametrize(("fmt", "text", "query", "suffix", "expected"), HUGE_CASES)
def test_huge_counts_are_refused_by_the_limit(tmp_path, fmt, text, query, suffix, expected):
    """Above the limit: a located error that names the limit; below it: every node is built."""
    path = tmp_path / f"c{suffix}"
    path.write_text(text)
    if isinstance(expected, str):
        with pytest.raises(LoomInputError) as info:
            _load_cluster(f"{fmt}:{path}{query}")
        assert str(path) in str(info.value) and expected in str(info.value)
    else:
        assert _load_cluster(f"{fmt}:{path}{query}").num_nodes == expected


# -------------------------------------------------------------- CLI sample
runner = CliRunner()
CLI_SAMPLE = [c for cases in (TRACE_CASES, CLUSTER_CASES)
              for c in [c for c in random.Random(7).sample(cases, len(cases))
                        if c.expect == "err" and c.id not in KNOWN_BUGS][:12]]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CLI_SAMPLE])
def test_cli_reports_one_line(fuzz_dir, case: Case):
    path = _write(fuzz_dir, case, "-cli")
    if case.kind == "trace":
        args = ["traces", "validate", _spec(case, path), "--no-cache"]
    else:
        args = ["clusters", "show", _spec(case, path)]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error:"), result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert str(path) in result.output.replace("\n", "")
