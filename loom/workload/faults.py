"""Node-failure sources → the simulator's failure list (`NodeFailure`).

Three sources, all returning a `ClusterFaults` (`.failures` is what
`Simulation(..., failures=...)` takes; parallel lists keep each failure's
level/class/desc so reports can break down by class):

* the real InfiniteHBD fault trace (`load_fault_trace` + `FaultTrace.to_cluster`),
* a Poisson rate with log-normal repairs (`rate_failures`),
* `parse_failures(value, ...)` for the CLI: `none`, `rate:0.01`, `infinitehbd`
  or a path to a fault-trace JSON.

Pairing: events are ordered by time (stable, so file order breaks ties) and each
`fault_end` closes the oldest open `fault_start` of the same node and `Desc`.
A `fault_end` with no open start is an input error. A start never closed within
the trace is *censored*: it is repaired at the trace's end (last event time), not
never — the trace stops observing, it does not say the server died for good, and
an infinite outage would be replayed forever by the cyclic mapping below.

Scaling (`to_cluster`): the failure *rate per node* is what must carry over,
so each cluster node takes the whole failure history of one of the
`sampled_servers` (400) trace servers, drawn by a seeded permutation among all
400 — the 169 servers with no fault are real and stay healthy. Nodes beyond 400
reuse servers in further rounds, each with a fresh permutation and a time offset
shifted by horizon/rounds, so reused servers do not fail in lockstep. The
simulation window [start, end) maps to trace days [offset, offset + W); the
trace is treated as cyclic with period = its horizon, so windows longer than
the trace (or offsets near its end) wrap. An episode already under way at the
window start becomes a failure at `start` with its remaining repair time
(`ongoing=True`; such failures are not counted as new in `summary`).

Real trace (stepfun-ai/InfiniteHBD-Trace, 1,168 events, horizon 348.98 d), as
computed by this module's pairing:
  584 episodes, all closed (none censored), on 231 of 400 servers;
  rate 584 / (400 × 348.98 d) = 0.00418 failures per server-day (≈ 1.5 per server-year);
  repair p50 0.85 d, mean 5.54 d, p90 12.97 d (14 episodes last 0 s);
  Level: Hardware 51.0 % (298), Other 44.9 % (262), Software 4.1 % (24);
  Class: GPU 27.1 % (158), Unknown Error 24.7 % (144), Stress Test Failure 16.6 % (97),
  Parameter Plane Cable 6.8 % (40), Fan 5.7 % (33), NIC 5.1 % (30), Power Supply 4.5 % (26),
  other 14 classes 9.6 % (56).
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from loom.errors import LoomInputError
from loom.hardware.topology import Topology

DAY = 86400.0
INF = float("inf")
TRACE_SERVERS = 400  # servers sampled by the InfiniteHBD trace (231 of them had faults)
INFINITEHBD = "infinitehbd"
INFINITEHBD_PATH = ("failures_infinitehbd", "fault_trace.json")
_EVENT_TYPES = ("fault_start", "fault_end")


@dataclass(frozen=True, slots=True)
class NodeFailure:
    """A node goes down at `at` for `repair_after` seconds (inf = never back)."""

    node: str
    at: float
    repair_after: float = float("inf")


@dataclass(frozen=True, slots=True)
class FaultEpisode:
    """One fault of one trace server: down from `start` (s) for `duration` (s)."""

    node: str  # trace server uuid
    start: float
    duration: float
    level: str
    cls: str
    desc: str
    censored: bool = False  # no fault_end in the trace: repaired at the trace end


@dataclass(frozen=True)
class ClusterFaults:
    """Failures for one simulation plus, at the same index, where each came from."""

    failures: list[NodeFailure]
    levels: list[str]
    classes: list[str]
    descs: list[str]
    ongoing: list[bool]  # True: began before `start` and was clipped to it
    start: float
    end: float
    source: str = ""

    def __len__(self) -> int:
        return len(self.failures)


@dataclass(frozen=True)
class FaultTrace:
    """Validated fault episodes of a trace; `horizon` (s) is its last event time."""

    source: str
    episodes: tuple[FaultEpisode, ...]
    horizon: float
    servers: tuple[str, ...]  # faulty servers, in order of first appearance
    _by_server: dict[str, tuple[FaultEpisode, ...]] = field(default_factory=dict, repr=False)

    def stats(self, sampled_servers: int = TRACE_SERVERS) -> dict[str, object]:
        """Headline numbers (rate per server-day over all sampled servers, repair quantiles in days)."""
        rep = np.array([e.duration for e in self.episodes]) / DAY
        n = len(self.episodes)
        days = self.horizon / DAY
        q = (lambda p: float(np.percentile(rep, p))) if n else (lambda p: 0.0)
        return {
            "episodes": n,
            "censored": sum(e.censored for e in self.episodes),
            "faulty_servers": len(self.servers),
            "horizon_days": days,
            "failures_per_server_day": n / (sampled_servers * days) if days > 0 else 0.0,
            "repair_days": {"p50": q(50), "mean": float(rep.mean()) if n else 0.0, "p90": q(90)},
            "by_level": dict(Counter(e.level for e in self.episodes).most_common()),
            "by_class": dict(Counter(e.cls for e in self.episodes).most_common()),
        }

    def to_cluster(self, topology: Topology, start: float, end: float, seed: int,
                   sampled_servers: int = TRACE_SERVERS, offset_days: float | None = None) -> ClusterFaults:
        """Map the per-server failure process onto `topology`'s nodes over [start, end); see module doc."""
        _check_window(start, end, self.source)
        if sampled_servers < len(self.servers):
            raise LoomInputError(f"{sampled_servers} sampled servers, but the trace has {len(self.servers)} "
                                 "faulty ones", source=self.source, field="sampled_servers")
        if not self.horizon > 0:
            raise LoomInputError("the trace spans no time (all events at day 0)", source=self.source,
                                 field="event_time")
        period, window = self.horizon, end - start
        rng = np.random.default_rng(seed)
        if offset_days is None:
            base = float(rng.uniform(0.0, period - window)) if window < period else 0.0
        else:
            base = float(offset_days) * DAY
            if not (math.isfinite(base) and 0 <= base < period):
                raise LoomInputError(f"must be in [0, {period / DAY:.4g}) days, got {offset_days}",
                                     source=self.source, field="offset_days")
        names = topology.node_names
        rounds = -(-len(names) // sampled_servers)
        rows: list[tuple[float, str, float, FaultEpisode, bool]] = []
        for r in range(rounds):
            perm = rng.permutation(sampled_servers)
            offset = (base + r * period / rounds) % period
            for slot, node in enumerate(names[r * sampled_servers:(r + 1) * sampled_servers]):
                server = int(perm[slot])
                if server >= len(self.servers):
                    continue  # one of the servers that never failed
                for ep in self._by_server[self.servers[server]]:
                    rows += _replay(ep, node, offset, period, start, window)
        rows.sort(key=lambda row: (row[0], row[1]))
        return ClusterFaults(
            failures=[NodeFailure(node, at, rep) for at, node, rep, _, _ in rows],
            levels=[ep.level for *_, ep, _ in rows], classes=[ep.cls for *_, ep, _ in rows],
            descs=[ep.desc for *_, ep, _ in rows], ongoing=[row[4] for row in rows],
            start=start, end=end, source=self.source)


def _replay(ep: FaultEpisode, node: str, offset: float, period: float, start: float,
            window: float) -> list[tuple[float, str, float, FaultEpisode, bool]]:
    """Every cyclic copy of `ep` (at ep.start + k·period) overlapping trace [offset, offset+window)."""
    out = []
    k = math.floor((offset - ep.start - ep.duration) / period)  # first copy that could still be down
    while (s := ep.start + k * period) < offset + window:
        if s + ep.duration > offset or (ep.duration == 0 and s >= offset):
            if s >= offset:
                out.append((start + s - offset, node, ep.duration, ep, False))
            else:
                out.append((start, node, s + ep.duration - offset, ep, True))
        k += 1
    return out


def _check_window(start: float, end: float, source: str | None) -> None:
    if not (math.isfinite(start) and math.isfinite(end) and end > start):
        raise LoomInputError(f"need finite start < end, got [{start}, {end})", source=source, field="window")


def _num(value: object) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def load_fault_trace(path: str | Path) -> FaultTrace:
    """Read and validate an InfiniteHBD-format fault trace, pairing starts and ends into episodes."""
    src = str(path)
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise LoomInputError("fault trace file not found", source=src) from None
    except json.JSONDecodeError as exc:
        raise LoomInputError(f"not valid JSON: {exc.msg}", source=src, line=exc.lineno) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LoomInputError(f"cannot read: {exc}", source=src) from None
    if not isinstance(data, list):
        raise LoomInputError(f"expected a JSON list of events, got {type(data).__name__}", source=src)
    events = []
    for i, ev in enumerate(data):
        def bad(msg: str, fld: str, i: int = i) -> LoomInputError:
            return LoomInputError(f"entry {i}: {msg}", source=src, field=f"[{i}].{fld}")
        if not isinstance(ev, dict):
            raise bad(f"expected an object, got {type(ev).__name__}", "event")
        for key in ("node_id", "event_time", "event_type", "fault_type"):
            if key not in ev:
                raise bad("missing field", key)
        node, kind, ftype = ev["node_id"], ev["event_type"], ev["fault_type"]
        if not isinstance(node, str) or not node:
            raise bad("must be a non-empty string", "node_id")
        t = _num(ev["event_time"])
        if t is None or t < 0:
            raise bad(f"must be a finite number of days ≥ 0, got {ev['event_time']!r}", "event_time")
        if kind not in _EVENT_TYPES:
            raise bad(f"unknown event type {kind!r}; expected one of {list(_EVENT_TYPES)}", "event_type")
        if not isinstance(ftype, dict):
            raise bad("must be an object {Level, Class, Desc}", "fault_type")
        for key in ("Level", "Class", "Desc"):
            if not isinstance(ftype.get(key), str):
                raise bad("missing or not a string", f"fault_type.{key}")
        events.append((t * DAY, i, node, kind, ftype["Level"], ftype["Class"], ftype["Desc"]))
    events.sort(key=lambda e: (e[0], e[1]))
    horizon = events[-1][0] if events else 0.0
    open_: dict[tuple[str, str], deque[tuple[float, str, str]]] = defaultdict(deque)
    episodes: list[FaultEpisode] = []
    for t, i, node, kind, level, cls, desc in events:
        if kind == "fault_start":
            open_[(node, desc)].append((t, level, cls))
            continue
        if not open_[(node, desc)]:
            raise LoomInputError(f"entry {i}: fault_end of {node} ({desc!r}) at day {t / DAY:g} has no earlier "
                                 "open fault_start", source=src, field=f"[{i}].event_time")
        s, level, cls = open_[(node, desc)].popleft()
        episodes.append(FaultEpisode(node, s, t - s, level, cls, desc))
    for (node, desc), starts in open_.items():
        episodes += [FaultEpisode(node, s, horizon - s, lv, c, desc, censored=True) for s, lv, c in starts]
    episodes.sort(key=lambda e: (e.start, e.node, e.desc))
    servers = tuple(dict.fromkeys(e.node for e in episodes))
    by_server: dict[str, list[FaultEpisode]] = defaultdict(list)
    for ep in episodes:
        by_server[ep.node].append(ep)
    return FaultTrace(src, tuple(episodes), horizon, servers, {k: tuple(v) for k, v in by_server.items()})


def rate_failures(topology: Topology, start: float, end: float, per_node_per_day: float, seed: int,
                  repair_median_s: float = 0.85 * DAY, repair_mean_s: float = 5.5 * DAY) -> ClusterFaults:
    """Poisson failures per node; log-normal repairs matching a median and mean (defaults: the real trace).

    Log-normal: median = e^mu, mean = e^(mu + sigma²/2), so mean ≥ median is required.
    """
    _check_window(start, end, None)
    for name, value in (("per_node_per_day", per_node_per_day), ("repair_median_s", repair_median_s),
                        ("repair_mean_s", repair_mean_s)):
        v = _num(value)
        if v is None or v < 0 or (v == 0 and name != "per_node_per_day"):
            rule = "≥ 0" if name == "per_node_per_day" else "> 0"
            raise LoomInputError(f"must be a finite number {rule}, got {value!r}", field=name)
    if repair_mean_s < repair_median_s:
        raise LoomInputError(f"mean {repair_mean_s} is below median {repair_median_s}; a log-normal needs "
                             "mean ≥ median", field="repair_mean_s")
    mu, sigma = math.log(repair_median_s), math.sqrt(2 * math.log(repair_mean_s / repair_median_s))
    rng = np.random.default_rng(seed)
    n = topology.num_nodes
    counts = rng.poisson(per_node_per_day * (end - start) / DAY, n)
    nodes = np.repeat(np.arange(n), counts)
    times = rng.uniform(start, end, len(nodes))
    repairs = rng.lognormal(mu, sigma, len(nodes))
    order = np.lexsort((nodes, times))
    names = topology.node_names
    failures = [NodeFailure(names[int(nodes[j])], float(times[j]), float(repairs[j])) for j in order]
    k = len(failures)
    return ClusterFaults(failures, ["rate"] * k, ["rate"] * k, [f"rate {per_node_per_day:g}/node/day"] * k,
                         [False] * k, start, end, source=f"rate:{per_node_per_day:g}")


def parse_failures(value: str, topology: Topology, start: float, end: float, seed: int) -> ClusterFaults:
    """`none` | `rate:R` (failures per node per day) | `infinitehbd` | path to a fault-trace JSON."""
    text = value.strip()
    if text.lower() in ("", "none"):
        return ClusterFaults([], [], [], [], [], start, end, source="none")
    if text.lower().startswith("rate:"):
        try:
            rate = float(text[5:])
        except ValueError:
            raise LoomInputError(f"'{value}': the rate after 'rate:' must be a number of failures per node "
                                 "per day", field="failures") from None
        try:
            return rate_failures(topology, start, end, rate, seed)
        except LoomInputError as exc:
            raise LoomInputError(f"'{value}': {exc.message}", field="failures") from None
    if text.lower() == INFINITEHBD:
        from loom.paths import shared_traces_dir

        path = shared_traces_dir().joinpath(*INFINITEHBD_PATH)
    else:
        path = Path(text).expanduser()
    if not path.is_file():
        raise LoomInputError(f"'{value}' is not 'none', 'rate:<per node per day>', '{INFINITEHBD}' or an "
                             f"existing fault-trace JSON file ({path} not found)", field="failures")
    return load_fault_trace(path).to_cluster(topology, start, end, seed)


def summary(failures: ClusterFaults | Sequence[NodeFailure], topology: Topology,
            start: float | None = None, end: float | None = None) -> dict[str, object]:
    """Counts by class/level, node-days down (overlaps merged, clipped to the window), failures per node-day.

    The window defaults to the `ClusterFaults` one, else the span of the failures. Only failures that
    begin inside the window count towards the rate (ongoing ones at `start` are reported apart).
    """
    if isinstance(failures, ClusterFaults):
        fl, classes, levels, ongoing = failures.failures, failures.classes, failures.levels, failures.ongoing
        start = failures.start if start is None else start
        end = failures.end if end is None else end
    else:
        fl = list(failures)
        classes = levels = ["unknown"] * len(fl)
        ongoing = [False] * len(fl)
    if start is None:
        start = min((f.at for f in fl), default=0.0)
    if end is None:
        end = max((f.at + (f.repair_after if math.isfinite(f.repair_after) else 0.0) for f in fl), default=start)
    per_node: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for f in fl:
        lo, hi = max(f.at, start), min(f.at + f.repair_after, end)
        if hi > lo:
            per_node[f.node].append((lo, hi))
    down = 0.0
    for spans in per_node.values():
        spans.sort()
        cur_lo, cur_hi = spans[0]
        for lo, hi in spans[1:]:
            if lo > cur_hi:
                down += cur_hi - cur_lo
                cur_lo = lo
            cur_hi = max(cur_hi, hi)
        down += cur_hi - cur_lo
    new = [i for i, f in enumerate(fl) if not ongoing[i] and start <= f.at < end]
    node_days = topology.num_nodes * max(end - start, 0.0) / DAY
    return {
        "failures": len(new),
        "ongoing_at_start": sum(ongoing),
        "never_repaired": sum(not math.isfinite(f.repair_after) for f in fl),
        "nodes_affected": len({f.node for f in fl}),
        "by_class": dict(Counter(classes[i] for i in new).most_common()),
        "by_level": dict(Counter(levels[i] for i in new).most_common()),
        "node_days_down": down / DAY,
        "availability": 1.0 - down / DAY / node_days if node_days > 0 else 1.0,
        "failures_per_node_day": len(new) / node_days if node_days > 0 else 0.0,
    }
