"""Deep property profile: every Hypothesis property test with at least 10,000 random examples.

    nice -n 10 python3 bench/property_profile.py [--examples 10000] [--tests PATTERN] [--seed S]
        [--workers 2] [--include-pinned] [--order-from PREV.json] [--json OUT]

CI runs each property on the same fixed examples every time (`PROPERTY_SETTINGS` in
tests/simharness.py: 100 derandomised examples; a few tests set their own count). This script
runs them all much harder, in one `python3 -m pytest` subprocess:

    LOOM_DEEP_EXAMPLES=N python3 -m pytest -p no:randomly -p no:cacheprovider -n W \\
        -p property_profile --hypothesis-profile=deep --hypothesis-seed=S FILES [-k PATTERN]

- FILES: every tests/*.py with an `@given` test; only the Hypothesis tests in them are run (the
  plugin half of this file deselects the rest).
- `--hypothesis-profile=deep` is registered in tests/conftest.py: N examples per test (the
  `--examples`, 10,000 by default), randomised (not derandomised), no deadline, no example
  database, `HealthCheck.too_slow` suppressed, `print_blob` on. A conftest hook puts those settings
  on top of each test's own `@settings`, so hard-coded CI counts do not cap the deep run. Without
  the profile (CI) nothing changes.
- `--hypothesis-seed=S`: every test draws from seed S (random unless `--seed`; printed first, so
  a failure is reproducible: rerun with `--seed S --tests NAME`).
- Tests pinned to a seed in the code (`@seed(k)`: today the four 2,500-case slices with which the
  slow tier runs `test_async_lifecycle_invariants` 10,000 times) are fixed CI slices of a property
  that runs here anyway with a fresh seed; they are listed as not run unless `--include-pinned`
  (then each runs N examples from its own pinned seed).

Examples are counted, not assumed: the plugin half of this file (loaded into pytest and its
xdist workers with `-p property_profile`) records Hypothesis' own statistics for each test (the
valid examples of the generate and target phases, invalid ones, distinct failures, why it
stopped) and the wall time of the call, including shrinking. A test that stopped short of N says
why: "all" when Hypothesis ran out of inputs ("nothing left to do": the strategy has fewer than N
distinct inputs and each ran once, an exhaustive check).

Output on stdout: a markdown header (date, command, machine, commit, Hypothesis version, seed)
and one row per test: examples run, whether they reached N, invalid examples, failures, wall
time and CPU time of the test (on a shared machine CPU time is the comparable figure), a note;
for a failing test, the falsifying example and `@reproduce_failure` blob follow the table.
`--json OUT` writes the rows, the header and any failure text. Progress on stderr. Exit code 1
if any test failed, 2 if one ran fewer examples than asked for without exhausting its strategy.

Run it with `nice -n 10` on a shared machine; wall times are then an upper bound. `--order-from`
takes an earlier `--json` and starts its slowest tests first, so that no long test starts last.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shlex
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
STATS_ENV = "LOOM_PROPERTY_STATS"  # set by the runner: the plugin appends one JSON line per test
EXAMPLES_ENV = "LOOM_DEEP_EXAMPLES"  # read by tests/conftest.py's deep profile
PINNED_ENV = "LOOM_PROPERTY_INCLUDE_PINNED"  # also run tests pinned to a seed in the code
ORDER_ENV = "LOOM_PROPERTY_ORDER"  # JSON list of node ids, slowest first: run in that order


# ============================================================================ pytest plugin half
# Active only inside the subprocess the runner starts (STATS_ENV set); importing it elsewhere or
# loading it without the variable does nothing.
def _plugin_on() -> bool:
    return bool(os.environ.get(STATS_ENV))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Keep only the Hypothesis tests of the selected files; leave out (and list) the ones the code
    pins to a seed unless PINNED_ENV is set."""
    if not _plugin_on():
        return
    from hypothesis import is_hypothesis_test

    def fn(item):
        obj = getattr(item, "obj", None)
        return getattr(obj, "__func__", obj)

    def pinned(item):
        return getattr(fn(item), "_hypothesis_internal_use_seed", None)

    include_pinned = bool(os.environ.get(PINNED_ENV))
    keep = [i for i in items if is_hypothesis_test(fn(i)) and (include_pinned or pinned(i) is None)]
    drop = [i for i in items if i not in keep]
    left_out = [{"nodeid": i.nodeid, "outcome": "not run", "pinned_seed": pinned(i), "wall": 0.0}
                for i in drop if is_hypothesis_test(fn(i))]
    if left_out:  # every xdist worker collects: the runner keeps one row per test
        with open(os.environ[STATS_ENV], "a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in left_out))
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    if os.environ.get(ORDER_ENV):  # slowest first, so that no long test starts last (same in every worker)
        rank = {nodeid: k for k, nodeid in enumerate(json.loads(os.environ[ORDER_ENV]))}
        items.sort(key=lambda i: rank.get(i.nodeid, -1))


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_call(item):
    """Innermost wrapper: Hypothesis' raw statistics for this test (its pytest plugin installs the
    statistics collector outside this wrapper; ours records the dict, then passes it on)."""
    if not _plugin_on():
        yield
        return
    from hypothesis.statistics import collector

    outer = collector.value
    seen: list[dict] = []

    def note(stats):
        seen.append(stats)
        if outer is not None:
            outer(stats)

    t0, c0 = time.perf_counter(), time.process_time()
    with collector.with_value(note):
        outcome = yield
    wall = time.perf_counter() - t0
    item._loom_stats = _summarise(seen[-1] if seen else None, wall, outcome.excinfo is None)
    item._loom_stats["cpu"] = time.process_time() - c0  # what the test cost, whatever else ran
    own = getattr(getattr(item.obj, "__func__", item.obj), "_hypothesis_internal_use_settings", None)
    item._loom_stats["max_examples"] = getattr(own, "max_examples", None)
    item._loom_stats["derandomize"] = getattr(own, "derandomize", None)
    item._loom_stats["pinned_seed"] = getattr(getattr(item.obj, "__func__", item.obj),
                                              "_hypothesis_internal_use_seed", None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if not _plugin_on() or report.when != "call":
        return
    row = dict(getattr(item, "_loom_stats", None) or _summarise(None, report.duration, report.passed))
    row.update(nodeid=item.nodeid, outcome=report.outcome, duration=report.duration)
    if report.failed:
        row["failure"] = report.longreprtext
        row["hypothesis"] = "\n".join(text for name, text in report.sections if name == "Hypothesis")
    with open(os.environ[STATS_ENV], "a") as f:  # one short write per test: workers do not interleave
        f.write(json.dumps(row) + "\n")


def _summarise(stats: dict | None, wall: float, passed: bool) -> dict:
    if stats is None:
        return {"examples": None, "invalid": None, "failing": None, "distinct_failures": 0,
                "stopped_because": "no Hypothesis statistics recorded", "wall": wall, "passed": passed,
                "phases": {}}
    valid = invalid = failing = 0
    phases = {}
    for phase in ("generate", "target"):  # what settings.max_examples counts (no database: no reuse)
        d = stats.get(f"{phase}-phase", {})
        cases = d.get("test-cases", [])
        v = sum(c["status"] == "valid" for c in cases)
        valid += v
        invalid += sum(c["status"] in ("invalid", "overrun") for c in cases)
        failing += sum(c["status"] == "interesting" for c in cases)
        if cases:
            phases[phase] = {"valid": v, "seconds": d.get("duration-seconds")}
    for phase in ("explicit", "shrink"):
        d = stats.get(f"{phase}-phase", {})
        if d.get("test-cases"):
            phases[phase] = {"cases": len(d["test-cases"]), "seconds": d.get("duration-seconds")}
    distinct = max((stats.get(f"{p}-phase", {}).get("distinct-failures", 0)
                    for p in ("explicit", "reuse", "generate", "target", "shrink")), default=0)
    return {"examples": valid, "invalid": invalid, "failing": failing, "distinct_failures": distinct,
            "stopped_because": stats.get("stopped-because", ""), "wall": wall, "passed": passed,
            "phases": phases}


# ============================================================================ runner half
def property_files() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                  if re.search(r"^\s*@given\(", p.read_text(), re.MULTILINE))


def short(nodeid: str) -> str:
    path, _, name = nodeid.partition("::")
    return f"{Path(path).stem}::{name}"


def fmt_s(s: float) -> str:
    return f"{s:,.0f}" if s >= 100 else f"{s:.1f}"


def verdict(row: dict, target: int) -> tuple[str, str]:
    """(reached target?, note) for one test."""
    n = row.get("examples")
    why = row.get("stopped_because") or ""
    if n is None:
        return "✗", why
    if n >= target:
        return "✓", ""
    if row.get("outcome") == "failed":
        return "—", "stopped at the first failure (then shrank)"
    if why == "nothing left to do":
        return "all", f"exhaustive: the strategy has only {n:,} distinct inputs and every one ran"
    return "✗", why


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=10_000, help="examples per property (10,000)")
    ap.add_argument("--tests", default=None, help="pytest -k expression selecting tests")
    ap.add_argument("--seed", type=int, default=None, help="Hypothesis seed (random by default)")
    ap.add_argument("--workers", default="2", help="pytest-xdist workers (-n), 2 by default")
    ap.add_argument("--files", default=None, help="comma-separated test files (default: all with @given)")
    ap.add_argument("--include-pinned", action="store_true",
                    help="also run tests pinned to a seed in the code (@seed), left out by default")
    ap.add_argument("--order-from", type=Path, default=None,
                    help="a previous --json: start its slowest tests first (shorter tail)")
    ap.add_argument("--json", type=Path, default=None, help="also write rows + header as JSON")
    args = ap.parse_args()

    seed = args.seed if args.seed is not None else secrets.randbits(32)
    files = args.files.split(",") if args.files else property_files()
    print(f"# seed {seed}: reproduce with --seed {seed}", file=sys.stderr, flush=True)

    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as tmp:
        stats_path = Path(tmp.name)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider",
           "-n", str(args.workers), "-p", "property_profile", "--hypothesis-profile=deep",
           f"--hypothesis-seed={seed}", "-q", "--no-header", "-rN", "--tb=short", *files]
    if args.tests:
        cmd += ["-k", args.tests]
    env = dict(os.environ, **{EXAMPLES_ENV: str(args.examples), STATS_ENV: str(stats_path)})
    if args.include_pinned:
        env[PINNED_ENV] = "1"
    if args.order_from:
        prev = json.loads(args.order_from.read_text())["rows"]
        env[ORDER_ENV] = json.dumps([r["nodeid"] for r in sorted(prev, key=lambda r: -r.get("wall", 0))])
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(BENCH), str(ROOT), env.get("PYTHONPATH")) if x)
    shown = (f"{EXAMPLES_ENV}={args.examples} "
             + shlex.join(["python3", *cmd[1:]]).replace(str(ROOT) + "/", ""))
    print(f"# {shown}", file=sys.stderr, flush=True)
    print(f"# per-test results as they finish: {stats_path}", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, check=False)
    total = time.perf_counter() - t0
    sys.stderr.write(proc.stdout[-4000:])
    by_id: dict[str, dict] = {}
    for line in stats_path.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            if r["outcome"] != "not run" or r["nodeid"] not in by_id:
                by_id[r["nodeid"]] = r
    stats_path.unlink(missing_ok=True)
    rows = sorted(by_id.values(), key=lambda r: r["nodeid"])
    if not rows:
        print(proc.stdout, file=sys.stderr)
        print("no property test ran", file=sys.stderr)
        return 1

    import hypothesis
    from benchinfo import machine

    from loom.run import git_commit

    commit = git_commit()
    this = shlex.join(["python3", "bench/property_profile.py", *sys.argv[1:]])
    lines = [
        (f"Date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC. Machine: {machine()}. "
         f"Commit: {(commit or 'unknown')[:10]} (with the working tree's changes). "
         f"Hypothesis {hypothesis.__version__}."),
        "",
        (f"Command: `{this}` → `{shown}`. Seed {seed}; {args.examples:,} examples asked per test; "
         f"{args.workers} xdist workers; total wall {total / 60:.1f} min."),
        "",
        f"| property test | examples run | ≥ {args.examples:,} | invalid | failures | wall s | CPU s | note |",
        "| :--- | ---: | :---: | ---: | ---: | ---: | ---: | :--- |",
    ]
    failed = short_unexplained = 0
    for r in rows:
        if r["outcome"] == "not run":
            lines.append(f"| `{short(r['nodeid'])}` | not run | | | | | | pinned to @seed({r['pinned_seed']}) "
                         "in the code: a fixed CI slice (`--include-pinned` runs it) |")
            continue
        ok, note = verdict(r, args.examples)
        if r.get("pinned_seed") is not None:
            note = "; ".join(x for x in (note, f"@seed({r['pinned_seed']}) in the code") if x)
        n = r.get("examples")
        fails = r.get("distinct_failures") or (1 if r["outcome"] == "failed" else 0)
        failed += r["outcome"] == "failed"
        short_unexplained += ok == "✗"
        lines.append(f"| `{short(r['nodeid'])}` | {'—' if n is None else f'{n:,}'} | {ok} | "
                     f"{r.get('invalid') or 0:,} | {fails} | {fmt_s(r['wall'])} | "
                     f"{fmt_s(r['cpu']) if r.get('cpu') is not None else '—'} | {note} |")
    examples = sum(r.get("examples") or 0 for r in rows)
    wall = sum(r["wall"] for r in rows)
    cpu = sum(r.get("cpu") or 0 for r in rows)
    ran = sum(r["outcome"] != "not run" for r in rows)
    lines += ["", (f"{ran} property tests run, {examples:,} examples, {failed} failing; "
                   f"{wall / 60:.1f} test-minutes of wall time ({cpu / 60:.1f} CPU-minutes) over "
                   f"{args.workers} workers, {total / 60:.1f} min wall in all.")]
    for r in rows:
        if r["outcome"] == "failed":
            lines += ["", f"#### Failure: `{short(r['nodeid'])}` (seed {seed})", "", "```",
                      (r.get("failure") or "").strip()[-6000:], "```"]
    text = "\n".join(lines)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"seed": seed, "examples": args.examples, "command": this,
                                         "pytest_command": shown, "machine": machine(),
                                         "commit": commit, "hypothesis": hypothesis.__version__,
                                         "total_wall_s": total, "pytest_exit": proc.returncode,
                                         "rows": rows, "markdown": text}, indent=1))
    if proc.returncode not in (0, 1):  # 1 = some test failed, reported above
        print(f"pytest exited {proc.returncode}", file=sys.stderr)
    return 1 if failed or proc.returncode not in (0, 1) else 2 if short_unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
