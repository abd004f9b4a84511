"""`loom compare` v2: runs grouped by trace, ratios only within a trace group, a stable colour per policy,
page-width tables and comparison.json."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from loom.cli.main import app

runner = CliRunner()

# two tiny traces; trace B's jobs last 10× longer, so a ratio mixing the traces would be ~10×, not ~1×
JOBS = [(0, 64, 300), (5, 128, 200), (9, 1, 50), (12, 96, 150), (14, 8, 10), (15, 144, 30), (16, 2, 20)]


def _trace(path, scale):
    path.write_text("job_id,submit_time,gpus,duration\n"
                    + "".join(f"j{i},{t},{g},{d * scale}\n" for i, (t, g, d) in enumerate(JOBS)))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cmp2")
    traces = {"A": _trace(tmp / "a.csv", 1), "B": _trace(tmp / "b.csv", 10)}
    dirs = {}
    # B's first run (its baseline) is sjf, A's is fcfs
    for name, trace, policy in (("a-fcfs", "A", "fcfs"), ("b-sjf", "B", "sjf"), ("a-sjf", "A", "sjf"),
                                ("b-fcfs", "B", "fcfs")):
        out = tmp / name
        res = runner.invoke(app, ["simulate", "--trace", f"csv:{traces[trace]}", "--cluster", "arnold-i",
                                  "--policy", policy, "--out", str(out), "-q", "--no-report"])
        assert res.exit_code == 0, res.output
        dirs[name] = out
    return dirs


def _summary(d):
    return json.loads((d / "summary.json").read_text())


def test_comparison_json_groups_by_trace(runs, tmp_path):
    page = tmp_path / "out" / "cmp.html"
    order = ["a-fcfs", "b-sjf", "a-sjf", "b-fcfs"]
    res = runner.invoke(app, ["compare", *(str(runs[n]) for n in order), "--out", str(page)])
    assert res.exit_code == 0, res.output
    data = json.loads((page.parent / "comparison.json").read_text())
    groups = data["groups"]
    assert len(groups) == 2
    by_base = {g["baseline"]: g for g in groups}
    assert set(by_base) == {"a-fcfs", "b-sjf"}
    a, b = by_base["a-fcfs"], by_base["b-sjf"]
    assert a["trace"].endswith("a.csv") and b["trace"].endswith("b.csv")
    assert [r["label"] for r in a["runs"]] == ["a-fcfs", "a-sjf"]
    assert [r["label"] for r in b["runs"]] == ["b-sjf", "b-fcfs"]
    for group in groups:
        for r in group["runs"]:
            assert set(r) >= {"label", "policy", "placer", "metrics", "ratios", "baseline", "colour"}
            assert r["placer"] == "best-fit"
            assert r["baseline"] == (r["label"] == group["baseline"])
            assert r["policy"] == r["label"].split("-")[1]
            summary = _summary(runs[r["label"]])
            assert r["metrics"]["avg_jct_s"] == pytest.approx(summary["avg_jct_s"])
    # ratios: within the group only
    base_b = _summary(runs["b-sjf"])["avg_jct_s"]
    fcfs_b = _summary(runs["b-fcfs"])["avg_jct_s"]
    fcfs_a = _summary(runs["a-fcfs"])["avg_jct_s"]
    sjf_a = _summary(runs["a-sjf"])["avg_jct_s"]
    ratios = {r["label"]: r["ratios"] for g in groups for r in g["runs"]}
    assert ratios["b-fcfs"]["avg_jct_s"] == pytest.approx(fcfs_b / base_b)
    assert ratios["a-sjf"]["avg_jct_s"] == pytest.approx(sjf_a / fcfs_a)
    assert ratios["a-fcfs"]["avg_jct_s"] == pytest.approx(1.0)
    assert ratios["b-sjf"]["avg_jct_s"] == pytest.approx(1.0)
    # a cross-trace ratio would be several × off: make sure none slipped in
    assert fcfs_b / fcfs_a > 3
    for r in ratios.values():
        assert r["avg_jct_s"] < 3
    # the HTML names each group's baseline and the terminal output too
    text = page.read_text()
    assert "Baseline: <b>a-fcfs</b>" in text and "Baseline: <b>b-sjf</b>" in text
    flat = " ".join(res.output.split())  # rich wraps long titles
    assert "baseline a-fcfs" in flat and "baseline b-sjf" in flat


def test_policy_colour_is_the_same_in_every_panel(runs, tmp_path):
    page = tmp_path / "cmp.html"
    res = runner.invoke(app, ["compare", *(str(d) for d in runs.values()), "-o", str(page)])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "comparison.json").read_text())
    colours = data["policy_colours"]
    assert set(colours) == {"fcfs", "sjf"} and colours["fcfs"] != colours["sjf"]
    lines = data["plot_lines"]  # read back from the drawn matplotlib lines
    panels = {line["panel"] for line in lines}
    assert len(panels) == 4  # JCT + queueing delay, for each of the two traces
    for policy in ("fcfs", "sjf"):
        drawn = {line["colour"] for line in lines if line["policy"] == policy}
        assert drawn == {colours[policy].upper()}
        assert {line["panel"] for line in lines if line["policy"] == policy} == panels
    for group in data["groups"]:
        for r in group["runs"]:
            assert r["colour"] == colours[r["policy"]]
    # the HTML table headers carry the same colour for a policy in every table
    heads = re.findall(r"<th data-policy='([^']+)' style='border-top:5px solid (#[0-9A-Fa-f]{6})'", page.read_text())
    assert len(heads) == 4
    for policy, colour in heads:
        assert colour == colours[policy]
    # the mapping is stable: the same whatever order the runs are given in
    other = tmp_path / "rev" / "c.png"
    assert runner.invoke(app, ["compare", *(str(d) for d in reversed(list(runs.values()))), "-o",
                               str(other)]).exit_code == 0
    assert json.loads((other.parent / "comparison.json").read_text())["policy_colours"] == colours


def test_tables_fit_the_page(runs, tmp_path):
    # 12 runs on one trace: split into several tables, each at most MAX_RUNS_PER_TABLE run columns, fixed layout
    from loom.report.compare import MAX_RUNS_PER_TABLE

    dirs = [runs["a-fcfs"], runs["a-sjf"]] * 6
    page = tmp_path / "wide.html"
    res = runner.invoke(app, ["compare", *(str(d) for d in dirs), "-o", str(page)])
    assert res.exit_code == 0, res.output
    text = page.read_text()
    tables = re.findall(r"<table>(.*?)</table>", text, re.DOTALL)
    assert len(tables) == -(-12 // MAX_RUNS_PER_TABLE)
    for t in tables:
        header = t.split("</tr>")[0]
        assert 1 <= header.count("data-policy=") <= MAX_RUNS_PER_TABLE
    assert "table-layout:fixed" in text and "width:100%" in text
    # numbers carry units
    assert re.search(r"<td>[\d,.]+ s", text) and re.search(r"<td>[\d.]+ %", text)
    assert "JCT, mean (s)" in text
    # the terminal tables are split the same way
    assert res.output.count("trace csv:") == len(tables)
