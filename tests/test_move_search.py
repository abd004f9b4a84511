"""The exact move search for gavel-arena's admission MIP: its optimum, tie-break order and
answer shape against brute force over every placement, and its node limit."""

from __future__ import annotations

from itertools import combinations, product

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loom.policies.move_search import JobGroup, NoGainProofs, SearchLimit, solve_moves

SIZES = (1, 2, 4, 8)


def brute_force(groups, target_size, target_values, caps, k):
    """max (value, −moves, −target type) over every target type and every ≤ k moved jobs."""
    T = len(caps)
    jobs = [g for g, grp in enumerate(groups) for _ in range(grp.count)]
    base = sum(grp.values[grp.current] * grp.count for grp in groups)
    used = [0] * T
    for grp in groups:
        used[grp.current] += grp.size * grp.count
    best = None
    for m in range(min(k, len(jobs)) + 1):
        for moved in combinations(range(len(jobs)), m):
            grps = [groups[jobs[j]] for j in moved]
            for dsts in product(*[[t for t in range(T) if t != g.current] for g in grps]):
                load, gain = list(used), 0
                for g, d in zip(grps, dsts):
                    load[g.current] -= g.size
                    load[d] += g.size
                    gain += g.values[d] - g.values[g.current]
                for t in range(T):
                    fits = all(load[u] + (target_size if u == t else 0) <= caps[u] for u in range(T))
                    key = (base + gain + target_values[t], -m, -t)
                    if fits and (best is None or key > best):
                        best = key
    return best


@st.composite
def instances(draw):
    T = draw(st.integers(2, 4))
    k = draw(st.integers(0, 3))
    n_groups = draw(st.integers(0, 4))
    groups = []
    for _ in range(n_groups):
        values = tuple(draw(st.lists(st.integers(0, 50), min_size=T, max_size=T)))
        groups.append(JobGroup(draw(st.integers(1, 3)), draw(st.sampled_from(SIZES)),
                               draw(st.integers(0, T - 1)), values))
    target_values = tuple(draw(st.lists(st.integers(0, 50), min_size=T, max_size=T)))
    penalty = sum(max(g.values) for g in groups) + max(target_values) + 1
    if draw(st.booleans()):  # Arena's "cannot run there": a penalty only forced placements pay
        infeasible = draw(st.lists(st.tuples(st.integers(-1, n_groups - 1), st.integers(0, T - 1)), max_size=4))
        for g, t in infeasible:
            if g < 0:
                target_values = tuple(-penalty if u == t else v for u, v in enumerate(target_values))
            else:
                grp = groups[g]
                groups[g] = JobGroup(grp.count, grp.size, grp.current,
                                     tuple(-penalty if u == t else v for u, v in enumerate(grp.values)))
    used = [0] * T
    for g in groups:
        used[g.current] += g.size * g.count
    caps = [max(u + draw(st.integers(-2, 6)), 0) for u in used]  # tight; sometimes already over
    return groups, draw(st.sampled_from(SIZES)), target_values, caps, k


def check_answer(found, groups, target_size, target_values, caps, k):
    T = len(caps)
    assert all(sum(row) == g.count and min(row) >= 0 for row, g in zip(found.counts, groups))
    moves = sum(g.count - row[g.current] for row, g in zip(found.counts, groups))
    load = [sum(g.size * row[t] for row, g in zip(found.counts, groups)) for t in range(T)]
    load[found.target_type] += target_size
    assert moves == found.moves <= k
    assert all(x <= c for x, c in zip(load, caps))
    value = sum(v * n for row, g in zip(found.counts, groups) for v, n in zip(g.values, row))
    assert value + target_values[found.target_type] == found.value


@settings(max_examples=400, deadline=None)
@given(instances())
def test_matches_brute_force(instance):
    groups, size, values, caps, k = instance
    expected = brute_force(groups, size, values, caps, k)
    found = solve_moves(groups, size, values, caps, k)
    if expected is None:
        assert found is None
        return
    assert found is not None and (found.value, -found.moves, -found.target_type) == expected
    check_answer(found, groups, size, values, caps, k)


def test_a_gaining_swap_through_a_full_type():
    # type 1 is full; moving the size-4 job (gains 10) needs the two size-2 jobs (lose 1 each) out
    groups = [JobGroup(1, 4, 0, (0, 10, 0)), JobGroup(2, 2, 1, (4, 5, 0))]
    found = solve_moves(groups, 2, (0, 0, 1), [8, 4, 2], 3)
    assert (found.value, found.moves, found.target_type) == (18 + 1, 3, 2)
    assert found.counts == [[0, 1, 0], [2, 0, 0]]
    # with two moves allowed the swap cannot happen: nobody moves
    found = solve_moves(groups, 2, (0, 0, 1), [8, 4, 2], 2)
    assert (found.moves, found.target_type, found.counts) == (0, 2, [[1, 0, 0], [0, 2, 0]])


def test_ties_prefer_fewer_moves_then_earliest_type():
    groups = [JobGroup(1, 1, 0, (5, 5))]
    found = solve_moves(groups, 1, (3, 3), [2, 2], 3)
    assert (found.moves, found.target_type) == (0, 0)


def test_no_room_anywhere_is_none():
    assert solve_moves([JobGroup(2, 4, 0, (1, 1))], 8, (1, 1), [8, 4], 3) is None


def test_node_limit_hands_the_instance_back():
    groups = [JobGroup(3, s, t, (1, 9, 2)) for s in SIZES for t in range(3)]
    caps = [sum(s * 3 for s in SIZES) + 8] * 3
    with pytest.raises(SearchLimit):
        solve_moves(groups, 4, (0, 5, 1), caps, 3, node_limit=0)
    assert solve_moves(groups, 4, (0, 5, 1), caps, 3) is not None


def _place(groups, size, where, values):
    """The groups once a target of `size` GPUs runs on type `where`."""
    for i, g in enumerate(groups):
        if (g.size, g.current, g.values) == (size, where, values):
            return [*groups[:i], g._replace(count=g.count + 1), *groups[i + 1:]]
    return [*groups, JobGroup(1, size, where, values)]


@settings(max_examples=150, deadline=None)
@given(instances(), st.lists(st.tuples(st.sampled_from(SIZES), st.lists(st.integers(0, 3), min_size=4,
                                                                          max_size=4)), min_size=1, max_size=8))
def test_proofs_never_change_an_answer(instance, targets):
    """A run of admissions against one job set: answers from `NoGainProofs` (with their carry to
    the grown set after each placement) equal a fresh search's."""
    groups, _, _, caps, k = instance
    proofs = NoGainProofs(k)
    for size, values in targets:
        values = tuple(values[:len(caps)])
        found = proofs.solve(groups, size, values, caps)
        fresh = solve_moves(groups, size, values, caps, k)
        assert (found is None) == (fresh is None)
        if found is None:
            continue
        assert (found.value, found.moves, found.target_type) == (fresh.value, fresh.moves, fresh.target_type)
        check_answer(found, groups, size, values, caps, k)
        if found.moves == 0:
            proofs.placed()
            groups = _place(groups, size, found.target_type, values)


def test_proofs_answer_larger_targets_without_a_search():
    # type 1 is full of jobs that would gain on type 0, which is full too: no move gains
    groups = [JobGroup(2, 4, 1, (9, 5, 0)), JobGroup(2, 4, 0, (9, 1, 0))]
    caps = [8, 8, 16]
    proofs = NoGainProofs(3)
    assert proofs.solve(groups, 2, (0, 0, 0), caps).target_type == 2 and proofs.answered == 0
    assert proofs.solve(groups, 4, (0, 0, 0), caps).target_type == 2 and proofs.answered == 1
    assert proofs.solve(groups, 1, (0, 0, 0), caps) is not None and proofs.answered == 1  # smaller: searched
    # placed where it is best: the proofs carry to the grown set
    proofs.solve(groups, 4, (0, 0, 3), caps)
    proofs.placed()
    grown = _place(groups, 4, 2, (0, 0, 3))
    assert proofs.solve(grown, 8, (0, 0, 0), caps).target_type == 2 and proofs.answered == 3
    # a different set (a job has ended): nothing is known about it
    assert proofs.solve(grown[1:], 4, (0, 0, 0), caps) is not None and proofs.answered == 3


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 2), st.sampled_from(SIZES), st.integers(0, 2),
                          st.lists(st.integers(0, 9), min_size=3, max_size=3)), max_size=3),
       st.sampled_from(SIZES), st.integers(4, 6), st.integers(-2, 6))
def test_more_moves_than_three(rows, target_size, k, slack):
    """Any number of moves (Arena's is 3): still brute force's optimum, or handed back."""
    groups = [JobGroup(n, size, cur, tuple(v)) for n, size, cur, v in rows]
    used = [sum(g.size * g.count for g in groups if g.current == t) for t in range(3)]
    caps = [max(u + slack, 0) for u in used]
    expected = brute_force(groups, target_size, (1, 2, 3), caps, k)
    try:
        found = solve_moves(groups, target_size, (1, 2, 3), caps, k)
    except SearchLimit:
        return
    assert (None if found is None else (found.value, -found.moves, -found.target_type)) == expected
