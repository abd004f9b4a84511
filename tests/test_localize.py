"""Fault localisation on emulated nodes (loom.localize, `loom localize`): Acme's two-round pairwise test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from itertools import combinations

import pytest

from loom.errors import LoomInputError
from loom.localize import AgentHub, Fault, Localisation, localize, spawn_launcher
from loom.localize.judge import SlowJudge
from loom.localize.model import GroupTest
from loom.localize.strategy import first_round_groups, round_robin
from loom.localize.trials import leftover_processes, run_trials

T = 2.0  # test timeout: a hung node costs a round about T + 0.5 s
SMALL = 1 << 16


def nodes(n: int) -> list[str]:
    return [f"n{i}" for i in range(n)]


@pytest.fixture(scope="module")
def hub():
    with AgentHub() as h:
        yield h
    assert leftover_processes(os.getpid()) == []


# ------------------------------------------------------------------ pure parts
def test_first_round_pairs_with_one_triple_when_odd():
    assert first_round_groups(nodes(4)) == [("n0", "n1"), ("n2", "n3")]
    assert first_round_groups(nodes(5)) == [("n0", "n1"), ("n2", "n3", "n4")]
    assert first_round_groups(nodes(3)) == [("n0", "n1", "n2")]


@pytest.mark.parametrize("n", [2, 3, 6, 7])
def test_round_robin_covers_every_pair_once_in_disjoint_rounds(n):
    rounds = round_robin(nodes(n))
    pairs = [frozenset(p) for r in rounds for p in r]
    assert sorted(map(sorted, pairs)) == sorted(map(sorted, map(frozenset, combinations(nodes(n), 2))))
    assert all(len({x for p in r for x in p}) == 2 * len(r) for r in rounds)


def test_fault_parse_and_errors():
    assert Fault.parse("slow:0.5") == Fault("slow", 0.5)
    assert Fault.parse("hang").spec() == "hang"
    with pytest.raises(LoomInputError, match="unknown fault kind 'boom'"):
        Fault.parse("boom")
    with pytest.raises(LoomInputError, match="not one of the 4 nodes"):
        localize(nodes(4), {"n9": "hang"})
    with pytest.raises(LoomInputError, match="at least 2 nodes"):
        localize(["n0"])


def test_slow_rule_is_relative_to_the_lower_median_with_an_absolute_ceiling():
    judge = SlowJudge(slow_after_s=1.0)
    groups = [GroupTest(("a", str(i)), "pass", "", 0.01) for i in range(3)] + [GroupTest(("b", "c"), "pass", "", 0.4)]
    assert [g.outcome for g in judge.judge(groups)] == ["pass", "pass", "pass", "slow"]
    alone = SlowJudge(slow_after_s=1.0)  # one pair: no median to compare with, only the ceiling
    assert alone.judge([GroupTest(("a", "b"), "pass", "", 1.5)])[0].outcome == "slow"


# ------------------------------------------------------------------ live agents
def test_each_fault_kind_is_found_and_attributed(hub):
    res = localize(nodes(5), {"n1": "wrong", "n3": "crash"}, timeout_s=T, tensor_bytes=SMALL, hub=hub)
    assert res.faulty == ("n1", "n3") and res.conclusive
    assert res.suspects_round1 == ("n0", "n1", "n2", "n3", "n4")
    assert "wrong data from n1" in res.reason() and "n3 crashed" in res.reason()
    res = localize(nodes(4), {"n2": "hang"}, timeout_s=T, tensor_bytes=SMALL, hub=hub)
    assert res.faulty == ("n2",)
    assert [r.name for r in res.rounds] == ["round 1", "round 2"] and res.tests == 4
    assert "n2 did not answer (hang)" in res.reason() and res.reason().endswith("→ faulty: n2")
    res = localize(nodes(5), {"n4": "slow:0.6"}, timeout_s=T, tensor_bytes=SMALL, hub=hub)
    assert res.faulty == ("n4",)
    assert res.rounds[0].groups[1].outcome == "slow"


def test_both_nodes_of_a_pair_and_more_suspects_than_healthy_partners(hub):
    res = localize(nodes(4), {"n0": "hang", "n1": "crash"}, timeout_s=T, tensor_bytes=SMALL, hub=hub)
    assert res.faulty == ("n0", "n1")
    res = localize(nodes(5), {"n0": "wrong", "n2": "crash"}, timeout_s=T, tensor_bytes=SMALL, hub=hub)
    assert res.faulty == ("n0", "n2")  # 5 suspects, 0 healthy after round 1: cross-pairing finds partners
    assert any(r.name.startswith("cross-pairing") for r in res.rounds)


def test_no_healthy_node_is_said_not_guessed(hub):
    res = localize(nodes(2), {"n0": "slow"}, timeout_s=T, tensor_bytes=SMALL, hub=hub)
    assert res.faulty == () and res.undetermined == ("n0", "n1") and not res.conclusive
    assert "no healthy node" in res.reason()
    res = localize(nodes(2), {"n1": "wrong"}, timeout_s=T, tensor_bytes=SMALL, hub=hub)
    assert res.faulty == ("n1",) and res.conclusive  # the receiver names the sender of wrong data
    assert "presumed healthy" in res.reason()


def test_all_pairs_baseline(hub):
    res = localize(nodes(4), {"n2": "wrong"}, method="all-pairs", timeout_s=T, tensor_bytes=SMALL, hub=hub)
    assert res.faulty == ("n2",) and res.tests == 6 and len(res.rounds) == 3


def test_a_launcher_starts_agents_with_their_nodes_environment():
    started = []

    def launcher(node, argv, env):
        started.append((node, env.get("LOOM_NODE_FAULT")))
        return spawn_launcher(node, argv, env)

    res = localize(nodes(3), node_env={"n1": {"LOOM_NODE_FAULT": "wrong"}}, timeout_s=T, tensor_bytes=SMALL,
                   launcher=launcher)
    assert isinstance(res, Localisation) and res.faulty == ("n1",)
    assert ("n1", "wrong") in started and ("n0", None) in started
    assert leftover_processes(os.getpid(), role="agent") == []


def test_importing_the_api_and_the_cli_imports_no_torch():
    code = "import sys, loom.localize, loom.cli.localize; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# ------------------------------------------------------------------ the CLI
def _loom(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loom.cli.main", "localize", *args], check=False,
                          capture_output=True, text=True, timeout=120)


def test_cli_json():
    proc = subprocess.Popen([sys.executable, "-m", "loom.cli.main", "localize", "--nodes", "4", "--faulty",
                             "n3:crash", "--timeout", "2", "--tensor-bytes", "4096", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    data = json.loads(out)
    assert data["faulty"] == ["n3"] and data["injected"] == {"n3": "crash"} and data["conclusive"]
    assert data["rounds"][0]["name"] == "round 1" and data["tests"] == 4
    assert leftover_processes(proc.pid) == []


def test_cli_table():
    res = _loom("--nodes", "a,b,c", "--random-faults", "1", "--seed", "1", "--timeout", "2", "--tensor-bytes", "4096")
    assert res.returncode == 0, res.stderr
    assert "round 1" in res.stdout and "faulty:" in res.stdout and "tests in" in res.stdout


@pytest.mark.parametrize("args, message", [
    (["--nodes", "1"], "at least 2 nodes"),
    (["--nodes", "4", "--faulty", "n7:hang"], "'n7' is not one of the nodes"),
    (["--faulty", "n1:boom"], "unknown fault kind 'boom'"),
    (["--method", "star"], "unknown method 'star'"),
])
def test_cli_bad_input_is_one_line_and_exit_2(args, message):
    res = _loom(*args)
    assert res.returncode == 2 and message in res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------ accuracy
@pytest.mark.slow
def test_thirty_random_trials_are_all_exact():
    """2..12 nodes (odd counts too), 1-3 faulty, sometimes both nodes of a pair, every kind."""
    before = set(leftover_processes(os.getpid()))  # the module's hub, if another test started it
    results = run_trials(30, seed=0, timeout_s=T, tensor_bytes=SMALL)
    wrong = [(r.trial.faults, r.result.reason()) for r in results if not r.exact]
    assert wrong == []
    kinds = {k for r in results for k in r.trial.faults.values()}
    assert kinds == {"hang", "crash", "wrong", "slow"}
    assert any(len(r.trial.nodes) % 2 for r in results) and any(len(r.trial.nodes) == 2 for r in results)
    assert any(any(f"n{2 * i}" in r.trial.faults and f"n{2 * i + 1}" in r.trial.faults for i in range(6))
               for r in results)
    assert set(leftover_processes(os.getpid())) - before == set()
