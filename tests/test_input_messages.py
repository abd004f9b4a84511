"""User mistakes through the `loom` command: exit status 2 and one clear line naming the
file, line or field, never a traceback. Also plain trace paths and `loom traces list`."""

from __future__ import annotations

import bz2
import gzip
import json
import os

import pytest
from typer.testing import CliRunner

from loom.cli.main import app

runner = CliRunner()
GENERIC = "job_id,submit_time,gpus,duration\na,0,1,10\nb,5,8,20\n"
ARENA = ("job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,gpu_type\n"
         "1,0,100,bert__2.6B,500,32,4,a100\n")
ELASTICFLOW = ("job_id,submit_time,real_iteration,model_name,ddl,batch_size,num_gpu,real_duration,duration,iteration\n"
               "0,0,10,bert,100,32,2,60,60,10\n")


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch):
    monkeypatch.setenv("LOOM_CACHE", "off")


def loom(*args: str):
    return runner.invoke(app, list(args))


def assert_user_error(result, *expected: str) -> None:
    """Status 2, no traceback, one `error:` line holding every expected text."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for text in expected:
        assert text in lines[0], (text, lines[0])


# ---------------------------------------------------------------- 1. plain trace paths
def test_validate_accepts_a_plain_path_and_says_which_format(tmp_path):
    generic = tmp_path / "jobs.csv"
    generic.write_text(GENERIC)
    arena = tmp_path / "arena.csv"
    arena.write_text(ARENA)
    res = loom("traces", "validate", str(generic))
    assert res.exit_code == 0 and "ok: 2 jobs" in res.output and "format csv" in res.output, res.output
    res = loom("traces", "validate", str(arena))
    assert res.exit_code == 0 and "ok: 1 jobs" in res.output and "format arena" in res.output, res.output
    res = loom("traces", "stats", str(generic), "--json")
    assert res.exit_code == 0 and json.loads(res.output)["jobs"] == 2


def test_format_prefix_names_and_gzip_still_work(tmp_path, monkeypatch):
    generic = tmp_path / "jobs.csv"
    generic.write_text(GENERIC)
    assert "ok: 2 jobs" in loom("traces", "validate", f"csv:{generic}").output
    (tmp_path / "philly").mkdir()
    (tmp_path / "philly" / "elasticflow_philly_103959.csv").write_text(ELASTICFLOW)
    monkeypatch.setenv("LOOM_TRACES", str(tmp_path))
    res = loom("traces", "validate", "philly-elasticflow")
    assert res.exit_code == 0 and "ok: 1 jobs" in res.output and "format" not in res.output, res.output
    packed = tmp_path / "jobs.csv.gz"
    packed.write_bytes(gzip.compress(GENERIC.encode()))
    res = loom("traces", "validate", str(packed))
    assert res.exit_code == 0 and "ok: 2 jobs" in res.output and "format csv" in res.output, res.output


def test_plain_path_mistakes_are_clear(tmp_path):
    odd = tmp_path / "odd.csv"
    odd.write_text("job_id,submit_time,gpus\na,0,1\n")
    assert_user_error(loom("traces", "validate", str(odd)), str(odd), "line 1", "cannot tell the trace format",
                      "closest: csv (missing duration)", "FORMAT:PATH")
    assert_user_error(loom("traces", "validate", str(tmp_path / "gone.csv")), "gone.csv", "trace file not found")
    assert_user_error(loom("traces", "validate", "phily"), "unknown trace 'phily'", "did you mean 'philly'")
    assert_user_error(loom("traces", "validate", "csvv:/x.csv"), "unknown trace format 'csvv'")


# ---------------------------------------------------------------- 2. loom traces list
def test_traces_list_shows_present_and_missing_files(tmp_path, monkeypatch):
    (tmp_path / "philly").mkdir()
    (tmp_path / "philly" / "elasticflow_philly_103959.csv").write_text(ELASTICFLOW)
    monkeypatch.setenv("LOOM_TRACES", str(tmp_path))
    res = loom("traces", "list", "--json")
    assert res.exit_code == 0, res.output
    rows = {row["name"]: row for row in json.loads(res.output)}
    assert rows["philly-elasticflow"]["present"] is True and rows["philly-elasticflow"]["format"] == "elasticflow"
    assert rows["philly"]["present"] is False and rows["philly"]["file"] == "philly/rfold_philly_trace.csv"
    assert {"sia-philly-w1", "sia-saturn-w10", "acme-kalos-large"} <= set(rows)
    table = loom("traces", "list")
    assert table.exit_code == 0 and "present" in table.output and "missing" in table.output
    assert "philly-elasticflow" in table.output


def test_traces_list_with_cached_job_count(tmp_path, monkeypatch):
    (tmp_path / "philly").mkdir()
    (tmp_path / "philly" / "elasticflow_philly_103959.csv").write_text(ELASTICFLOW)
    monkeypatch.setenv("LOOM_TRACES", str(tmp_path))
    monkeypatch.setenv("LOOM_CACHE", str(tmp_path / "cache"))
    rows = {r["name"]: r for r in json.loads(loom("traces", "list", "--json").output)}
    assert rows["philly-elasticflow"]["jobs"] is None  # never parsed: not counted (that would be slow)
    assert loom("traces", "validate", "philly-elasticflow").exit_code == 0
    rows = {r["name"]: r for r in json.loads(loom("traces", "list", "--json").output)}
    assert rows["philly-elasticflow"]["jobs"] == 1


# ---------------------------------------------------------------- 3. LOOM_TRACES
def test_loom_traces_pointing_nowhere_is_an_error(tmp_path, monkeypatch):
    missing = tmp_path / "no-such-dir"
    monkeypatch.setenv("LOOM_TRACES", str(missing))
    assert_user_error(loom("traces", "validate", "philly"), "LOOM_TRACES", str(missing), "does not exist")
    generic = tmp_path / "jobs.csv"  # a trace given by path does not need the folder
    generic.write_text(GENERIC)
    assert loom("traces", "validate", str(generic)).exit_code == 0
    res = loom("traces", "list", "--json")  # listing still works, and says why all are missing
    assert res.exit_code == 0 and "LOOM_TRACES" in res.output
    assert not any(row["present"] for row in json.loads(res.output[res.output.index("["):]))


# ---------------------------------------------------------------- 4. config keys and lines
@pytest.mark.parametrize(("content", "expected"), [
    ("seed: 1\npolcy: fcfs\n", ":2: unknown key 'polcy' at the top level; did you mean 'policy'?"),
    ("policy: fcfs\noutputs:\n  dirr: x\n",
     ":3: unknown key 'dirr' in section 'outputs' (outputs.dirr); did you mean 'dir'?"),
    ("outputs:\n  extra: 1\n", ":2: unknown key 'extra' in section 'outputs' (outputs.extra); known keys: dir"),
    ("policy:\n  name: fcfs\n  parms: {}\n",
     ":3: unknown key 'parms' in section 'policy' (policy.parms); did you mean 'params'?"),
    ("failures:\n  - node: n0\n    at: 5\n    repiar_after: 3\n",
     ":4: unknown key 'repiar_after' in section 'failures[0]'"),
    ("seed: 0\nround_interval_s: -5\n", ":2: field 'round_interval_s': Input should be greater than 0, got -5"),
    ("policy: fcfs\npolicy: easy\n", ":2: key 'policy' appears twice in one section (first at line 1)"),
])
def test_config_errors_name_file_line_and_suggestion(tmp_path, content, expected):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(content)
    assert_user_error(loom("simulate", "--config", str(cfg), "-q"), f"{cfg}{expected}")


def test_binary_config_is_a_clear_error(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00")
    assert_user_error(loom("simulate", "--config", str(cfg), "-q"), f"{cfg} is not UTF-8 text")


def test_config_error_from_a_flag_says_command_line(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("seed: 1\n")
    assert_user_error(loom("simulate", "--config", str(cfg), "--round-interval", "-5", "-q"),
                      "command line: field 'round_interval_s'")


# ---------------------------------------------------------------- 5. GPU-type suggestions
def test_gpu_type_suggests_names_containing_the_text_first():
    res = loom("estimate", "--gpu-type", "A100", "--gpus", "8", "--model", "gpt3-175b", "--global-batch", "64")
    assert_user_error(res, "unknown GPU type 'A100'", "did you mean A100-40GB, A100-80GB")
    res = loom("estimate", "--gpu-type", "80GB", "--gpus", "8", "--model", "gpt3-175b", "--global-batch", "64")
    assert_user_error(res, "did you mean A100-80GB")


# ---------------------------------------------------------------- 6. files that are not comma-separated text
def test_semicolon_tab_binary_and_compressed_files_say_why(tmp_path):
    semi = tmp_path / "semi.csv"
    semi.write_text(GENERIC.replace(",", ";"))
    expected = f"{semi} looks semicolon-separated (header has ';'); Loom reads comma-separated CSV"
    assert_user_error(loom("traces", "validate", f"csv:{semi}"), expected)
    assert_user_error(loom("traces", "validate", str(semi)), expected)
    tabs = tmp_path / "tabs.csv"
    tabs.write_text(GENERIC.replace(",", "\t"))
    assert_user_error(loom("traces", "validate", f"csv:{tabs}"), "looks tab-separated")
    binary = tmp_path / "blob.csv"
    binary.write_bytes(bytes(range(256)) * 8 + os.urandom(512))
    assert_user_error(loom("traces", "validate", f"rfold:{binary}"), f"{binary} is not text (binary or compressed?)")
    packed = tmp_path / "jobs.csv.bz2"
    packed.write_bytes(bz2.compress(GENERIC.encode()))
    assert_user_error(loom("traces", "validate", f"csv:{packed}"), "is bzip2-compressed; decompress it first")
    latin = tmp_path / "latin.csv"
    latin.write_bytes(b"job_id,submit_time,gpus,duration\nj\xe9,0,1,10\n")
    assert_user_error(loom("traces", "validate", f"csv:{latin}"), "is not UTF-8 text (line 2")
