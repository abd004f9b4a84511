"""An exact search for gavel-arena's admission MIP, much quicker than CP-SAT on it.

The MIP (see `loom.policies.gavel_arena`): admitted jobs sit on GPU types; a new
job (the target) must go on some type; at most `k` admitted jobs may change
type; no type may hold more GPUs than it has; maximise the summed throughput,
then prefer fewer changes, then the target's earliest type. CP-SAT proves these
small models optimal at its root node, but each call still costs ~3 ms of fixed
work, and the policy solves thousands of them.

The search here uses what CP-SAT does not know: a solution is the target's type
plus a set of at most `k` *moves* (one job to another type), and moves whose
(from type, to type, job size) agree differ only in gain, so only the best `k`
of each such *signature* can matter. The search is depth first over multisets
of signatures, driven by deficits:

* at a node where every type fits, only moves that gain are branched on (a set
  whose remaining moves all lose is worse than stopping), in signature order;
* at a node where a type is over its capacity, only moves out of that type are
  branched on (some such move is in every completion).

A node is cut when an upper bound on any completion cannot beat the best
solution so far: per over-full type, the best gain of at most `R` moves out of
it that free the deficit (from per-type tables over job sizes, each job at its
best destination), plus the best gain of the remaining slots. The first
solution is the target on its best type with nobody moving, which is optimal in
most calls; then the search only has to prove it.

Results equal CP-SAT's optimum in objective and tie-break order (tested on
random instances); which of several equally good jobs moves may differ, as it
may between any two solvers. A node limit turns a hard instance over to the
caller (`SearchLimit`), which then uses CP-SAT.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from math import prod
from typing import NamedTuple

_ASSIGNMENTS_LIMIT = 4096  # job assignments `_exact` may try for one set of moves


class SearchLimit(Exception):
    """The search visited more nodes than allowed (or a set of moves had more job assignments
    to try than `_ASSIGNMENTS_LIMIT`); solve the instance another way."""


class JobGroup(NamedTuple):  # a NamedTuple: callers make dozens per solve
    """Admitted jobs alike in size, current type and throughput per type."""

    count: int
    size: int
    current: int
    values: tuple[int, ...]


@dataclass(frozen=True)
class Admission:
    """An optimal answer: the target's type and each group's jobs per type."""

    target_type: int
    counts: list[list[int]]
    value: int
    moves: int


class _Signature(NamedTuple):  # a NamedTuple: made ~100 times per solve
    top: int  # gain of its best candidate
    src: int
    dst: int
    size: int
    candidates: tuple[tuple[int, int], ...]  # (gain, group), best first, at most k


def solve_moves(groups: list[JobGroup], target_size: int, target_values: tuple[int, ...],
                caps: list[int], max_moves: int, node_limit: int = 20_000) -> Admission | None:
    """The optimum of the admission MIP, or None if no placement fits."""
    return _Search(groups, target_size, target_values, caps, max_moves, node_limit).run()


class _Search:
    def __init__(self, groups: list[JobGroup], target_size: int, target_values: tuple[int, ...],
                 caps: list[int], k: int, node_limit: int) -> None:
        self.groups, self.size, self.tv, self.k = groups, target_size, target_values, k
        self.T = len(caps)
        self.node_limit, self.nodes = node_limit, 0
        self.free = list(caps)
        self.base = 0
        by_signature: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
        self.best_out: list[dict[int, list[int]]] = [{} for _ in caps]  # type → size → gains
        for g, grp in enumerate(groups):
            self.free[grp.current] -= grp.size * grp.count
            here = grp.values[grp.current]
            self.base += here * grp.count
            copies = min(grp.count, k)
            gains = [grp.values[t] - here for t in range(self.T) if t != grp.current]
            for t in range(self.T):
                if t != grp.current:
                    by_signature.setdefault((grp.current, t, grp.size), []).extend(
                        [(grp.values[t] - here, g)] * copies)
            if gains:
                self.best_out[grp.current].setdefault(grp.size, []).extend([max(gains)] * copies)
        sigs = []
        for (src, dst, size), cands in by_signature.items():
            if not cands:  # k = 0: nobody may move
                continue
            cands.sort(key=lambda c: -c[0])
            sigs.append(_Signature(cands[0][0], src, dst, size, tuple(cands[:k])))
        sigs.sort(key=lambda s: -s.top)
        self.sigs = sigs
        self.out_of: list[list[int]] = [[i for i, s in enumerate(sigs) if s.src == t] for t in range(self.T)]
        self.gaining = [i for i, s in enumerate(sigs) if s.top > 0]
        self.max_gain = sigs[0].top if self.gaining else 0
        self.max_into: list[int | None] = [None] * self.T
        self.max_elsewhere: list[int] = [0] * self.T  # best gain of a move neither into nor out of t
        self.min_into: list[int] = [0] * self.T
        for s in sigs:
            if self.max_into[s.dst] is None or s.top > self.max_into[s.dst]:  # type: ignore[operator]
                self.max_into[s.dst] = s.top
            self.min_into[s.dst] = min(self.min_into[s.dst] or s.size, s.size)
            for t in range(self.T):
                if t not in (s.src, s.dst):
                    self.max_elsewhere[t] = max(self.max_elsewhere[t], s.top)
        self.tables: list[tuple[list[list[int | None]], int] | None] = [None] * self.T
        self.memo: dict[tuple, object] = {}
        self.best: tuple[tuple[int, int, int], int, list[tuple[int, int]]] | None = None
        self.best_key: tuple = (float("-inf"),)  # self.best's key; compared inline in the hot loops

    # -- bounds ------------------------------------------------------------------
    def _table(self, t: int) -> tuple[list[list[int | None]], int]:
        """best[m][D]: the most gain of ≤ m moves out of t freeing ≥ D GPUs (None: impossible)."""
        k = self.k
        sizes = [(s, sorted(gs, reverse=True)[:k]) for s, gs in self.best_out[t].items()]
        most = sum(sorted((s for s, gs in sizes for _ in gs), reverse=True)[:k])
        exact: list[list[int | None]] = [[None] * (most + 1) for _ in range(k + 1)]

        def walk(i: int, m: int, freed: int, gain: int) -> None:
            if m and (exact[m][freed] is None or gain > exact[m][freed]):  # type: ignore[operator]
                exact[m][freed] = gain
            if i == len(sizes) or m == k:
                return
            walk(i + 1, m, freed, gain)
            size, gains = sizes[i]
            for c in range(1, min(len(gains), k - m) + 1):
                gain += gains[c - 1]
                walk(i + 1, m + c, freed + c * size, gain)
        walk(0, 0, 0, 0)
        best: list[list[int | None]] = [[None] * (most + 1)]
        for m in range(1, k + 1):
            row: list[int | None] = [None] * (most + 1)
            run = None
            for d in range(most, -1, -1):
                x = exact[m][d]
                if x is not None and (run is None or x > run):
                    run = x
                y = best[m - 1][d]
                row[d] = run if y is None or (run is not None and run > y) else y
            best.append(row)
        return best, most

    def _fix(self, t: int, deficit: int, slots: int) -> tuple[int, int] | None:
        """(fewest moves, most gain) to free `deficit` GPUs on t with ≤ slots moves; None: impossible."""
        key = (t, deficit, slots)
        if key in self.memo:
            return self.memo[key]  # type: ignore[return-value]
        if self.tables[t] is None:
            self.tables[t] = self._table(t)
        best, most = self.tables[t]  # type: ignore[misc]
        res = None
        if deficit <= most and best[slots][deficit] is not None:
            fewest = next(m for m in range(1, slots + 1) if best[m][deficit] is not None)
            res = (fewest, best[slots][deficit])
        self.memo[key] = res
        return res

    def _one_deficit_bound(self, t: int, deficit: int, slots: int) -> int | None:
        """The most gain of ≤ slots moves that leave type t (the only over-full type) fitting:
        o moves out of t, i moves into t (each needs more freed), the rest elsewhere."""
        key = ("one", t, deficit, slots)
        if key in self.memo:
            return self.memo[key]  # type: ignore[return-value]
        into, elsewhere = self.max_into[t], max(self.max_elsewhere[t], 0)
        bound = None
        for out in range(1, slots + 1):
            for i in range(slots - out + 1):
                if i and into is None:
                    break
                fix = self._fix(t, deficit + i * self.min_into[t], out)
                if fix is not None:
                    b = fix[1] + i * (into or 0) + (slots - out - i) * elsewhere
                    bound = b if bound is None or b > bound else bound
        self.memo[key] = bound
        return bound

    # -- solutions ---------------------------------------------------------------
    def _exact(self, uses: list[int]) -> tuple[int, list[tuple[int, int]]] | None:
        """The best gain of the signatures in `uses` with distinct jobs (groups have counts)."""
        seen: dict[int, int] = {}
        picks = []
        for i in uses:
            n = seen.get(i, 0)
            seen[i] = n + 1
            picks.append(self.sigs[i].candidates[n])
        taken: dict[int, int] = {}
        for _, g in picks:
            taken[g] = taken.get(g, 0) + 1
        if all(n <= self.groups[g].count for g, n in taken.items()):
            return sum(p[0] for p in picks), picks
        lists = [self.sigs[i].candidates for i in uses]
        if prod(len(c) for c in lists) > _ASSIGNMENTS_LIMIT:  # only with many moves allowed (k ≫ 3)
            raise SearchLimit
        best = None
        for combo in product(*lists):
            taken = {}
            for _, g in combo:
                taken[g] = taken.get(g, 0) + 1
            if all(n <= self.groups[g].count for g, n in taken.items()):
                gain = sum(p[0] for p in combo)
                if best is None or gain > best[0]:
                    best = (gain, list(combo))
        return best

    def _record(self, tstar: int, uses: list[int]) -> int | None:
        exact = self._exact(uses)
        if exact is None:
            return None
        gain, picks = exact
        key = (self.base + self.tv[tstar] + gain, -len(uses), -tstar)
        if key > self.best_key:
            self.best = (key, tstar, [(g, self.sigs[i].dst) for i, (_, g) in zip(uses, picks)])
            self.best_key = key
        return gain

    # -- search ------------------------------------------------------------------
    def run(self) -> Admission | None:
        if all(f >= 0 for f in self.free):
            room = [t for t in range(self.T) if self.free[t] >= self.size]
            if room:
                t0 = max(room, key=lambda t: (self.tv[t], -t))
                self.best = ((self.base + self.tv[t0], 0, -t0), t0, [])
                self.best_key = self.best[0]
        for tstar in sorted(range(self.T), key=lambda t: (-self.tv[t], t)):
            free = list(self.free)
            free[tstar] -= self.size
            self._node(tstar, free, self.base + self.tv[tstar], 0, [], {})
        if self.best is None:
            return None
        (value, moves, _), tstar, moved = self.best
        counts = [[0] * self.T for _ in self.groups]
        for g, grp in enumerate(self.groups):
            counts[g][grp.current] = grp.count
        for g, dst in moved:
            counts[g][self.groups[g].current] -= 1
            counts[g][dst] += 1
        return Admission(tstar, counts, value, -moves)

    def _node(self, tstar: int, free: list[int], gain: int, first_gaining: int,
              uses: list[int], used: dict[int, int]) -> None:
        """`gain`: the objective with each signature's best unused candidates (an upper bound)."""
        self.nodes += 1
        if self.nodes > self.node_limit:
            raise SearchLimit
        depth = len(uses)
        slots = self.k - depth
        short, need, fix_gain, n_short = None, 0, 0, 0
        for t in range(self.T):
            if free[t] < 0:
                fix = self._fix(t, -free[t], slots) if slots else None
                if fix is None:
                    return
                need, fix_gain, n_short = need + fix[0], fix_gain + fix[1], n_short + 1
                short = t if short is None else short
        if need > slots:
            return
        if short is None:
            if (gain, -depth, -tstar) > self.best_key:
                self._record(tstar, uses)
            if slots == 0:
                return
            bound = gain + slots * self.max_gain
        elif n_short == 1:
            one = self._one_deficit_bound(short, -free[short], slots)
            if one is None:
                return
            bound = gain + one
        else:
            bound = gain + fix_gain + (slots - need) * self.max_gain
        if (bound, -depth - 1, -tstar) <= self.best_key:
            return
        if slots == 1:
            if short is None:
                self._last(tstar, free, gain, uses, used, self.gaining, first_gaining, 0)
            elif n_short == 1:
                self._last(tstar, free, gain, uses, used, self.out_of[short], 0, -free[short])
            return
        cands, lo = (self.gaining, first_gaining) if short is None else (self.out_of[short], 0)
        for i in cands:
            if i < lo:
                continue
            sig = self.sigs[i]
            n = used.get(i, 0)
            if n >= len(sig.candidates):
                continue
            g = sig.candidates[n][0]
            if short is None and (gain + g * slots, -depth - 1, -tstar) <= self.best_key:
                if n == 0:
                    break  # later signatures gain no more
                continue
            free[sig.src] += sig.size
            free[sig.dst] -= sig.size
            used[i] = n + 1
            uses.append(i)
            self._node(tstar, free, gain + g, i if short is None else first_gaining, uses, used)
            uses.pop()
            used[i] = n
            free[sig.src] -= sig.size
            free[sig.dst] += sig.size

    def _last(self, tstar: int, free: list[int], gain: int, uses: list[int], used: dict[int, int],
              cands: list[int], lo: int, deficit: int) -> None:
        """The best single final move: it frees ≥ deficit and its destination has room."""
        fits: list[tuple[int, int]] = []
        depth = len(uses) + 1
        for i in cands:
            if i < lo:
                continue
            sig = self.sigs[i]
            if (gain + sig.top, -depth, -tstar) <= self.best_key:
                break
            n = used.get(i, 0)
            if n < len(sig.candidates) and sig.size >= deficit and free[sig.dst] >= sig.size:
                fits.append((sig.candidates[n][0], i))
        fits.sort(key=lambda f: -f[0])
        optimistic = gain - self.base - self.tv[tstar]
        for g, i in fits:
            if (gain + g, -depth, -tstar) <= self.best_key:
                break
            uses.append(i)
            exact = self._record(tstar, uses)
            uses.pop()
            if exact == optimistic + g:
                break  # no job shared with earlier moves: nothing later can do better


class NoGainProofs:
    """What earlier answers proved about the current set of admitted jobs, so that most
    admissions need no search at all.

    For the admitted jobs as they stand (`config`: their sizes, types and throughput rows, and
    the capacities), `sigma[t]` is the smallest target size for which it is proven that no ≤ k
    moves gain while the target sits on type t (∞: nothing known). A search whose optimum moves
    nobody proves it for every type valued like the target's. Less room gains no more, so the
    proof holds for every larger target; a later target whose best type has room and is no
    better anywhere else is then answered at once: nobody moves, it goes on that type. When a
    target is placed on a type that is best for it without moves, the proofs carry over to the
    grown set (a move of that job loses, and any other gaining set would have gained without
    it). Anything else that changes the set (completions, moves) makes a new `config`, which
    starts with nothing proven. Proofs are not used while an admitted job sits on a type it
    cannot use: the penalty on such entries grows with the job set, and so could a move's gain.
    """

    def __init__(self, max_moves: int) -> None:
        self.max_moves = max_moves
        self.config: tuple | None = None
        self.sigma: list[float] = []
        self.answered = 0  # answers given without a search
        self._grown: tuple[tuple, list[float]] | None = None  # config and proofs once the target is placed

    @staticmethod
    def config_of(groups: list[JobGroup], caps: list[int]) -> tuple:
        """The job set as a hashable value (a penalty entry, whatever its size, as −1)."""
        return frozenset((g.size, g.current, _rowed(g.values), g.count) for g in groups), tuple(caps)

    def solve(self, groups: list[JobGroup], target_size: int, target_values: tuple[int, ...], caps: list[int],
              node_limit: int = 20_000) -> Admission | None:
        """`solve_moves`, answered from the proofs when they settle it (raises `SearchLimit` as it does)."""
        config = self.config_of(groups, caps)
        if config != self.config:
            self.config, self.sigma = config, [float("inf")] * len(caps)
        self._grown = None
        found = self._settled(groups, target_size, target_values, caps)
        if found is not None:
            self.answered += 1
        else:
            found = solve_moves(groups, target_size, target_values, caps, self.max_moves, node_limit)
        if found is not None and found.moves == 0:
            here = target_values[found.target_type]
            for t, v in enumerate(target_values):
                if v == here:
                    self.sigma[t] = min(self.sigma[t], target_size)
            if here == max(target_values) and here >= 0:
                self._grown = (self._with(config, target_size, found.target_type, target_values), list(self.sigma))
        return found

    def placed(self) -> None:
        """The last answer's target now runs where it said: carry the proofs to the grown set."""
        if self._grown is not None:
            self.config, self.sigma = self._grown
            self._grown = None

    def _settled(self, groups: list[JobGroup], size: int, values: tuple[int, ...], caps: list[int]) -> Admission | None:
        if any(g.values[g.current] < 0 for g in groups) or any(size < s for s in self.sigma):
            return None
        free = list(caps)
        for g in groups:
            free[g.current] -= g.size * g.count
        room = [t for t in range(len(caps)) if free[t] >= size]
        if not room or min(free) < 0:
            return None
        best = max(values[t] for t in room)
        if any(v > best for v in values):
            return None
        target_type = min(t for t in room if values[t] == best)
        counts = [[g.count if t == g.current else 0 for t in range(len(caps))] for g in groups]
        return Admission(target_type, counts, sum(g.values[g.current] * g.count for g in groups) + best, 0)

    @staticmethod
    def _with(config: tuple, size: int, where: int, values: tuple[int, ...]) -> tuple:
        jobs, caps = config
        counts = {(s, c, v): n for s, c, v, n in jobs}
        key = (size, where, _rowed(values))
        counts[key] = counts.get(key, 0) + 1
        return frozenset((*k, n) for k, n in counts.items()), caps


def _rowed(values: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(v if v >= 0 else -1 for v in values)
