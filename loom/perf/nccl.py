"""Measured communication costs: interpolation over nccl-tests tables.

`parse_nccl_tests` reads the stdout of an nccl-tests binary (all_reduce_perf,
...) into an `NcclTable`: the operation, the ranks and ranks per node, and the
out-of-place time for each message size. `MeasuredComm` answers `CommModel`
queries from such tables, as Crius does with offline measurements:

- same op and group shape as a table: log-log interpolation of time over size;
  below the smallest size the smallest time, above the largest the largest
  measured bandwidth (time grows linearly with size);
- an inter-node group of another shape: the table gives the node bandwidth
  curve node_bw(S) = passes_t·(N_t−1)/N_t · S / t(S); the new group takes
  passes·(N−1)/N · S / (node_bw(S) · k/k_t), slowed by minipod loss and
  oversubscription exactly as `BusBandwidthComm` does;
- intra-node groups and ops without a table go to the fallback model.

Measured times are first made non-decreasing in size (running minimum from
the large end): a small-message reading above a larger one is noise.
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass
from pathlib import Path

from loom.errors import LoomInputError
from loom.perf.calibration import Calibration, load_calibration
from loom.perf.comm import CommModel, GroupShape, Links, minipod_loss

OPS = ("all_reduce", "reduce_scatter", "all_gather", "send")
PASSES = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1}

_BINARY = re.compile(r"\b(all_reduce|reduce_scatter|all_gather|sendrecv|alltoall|broadcast|reduce|gather|scatter)_perf\b")
_RANK = re.compile(r"^#\s*Rank\s+\d+\b.*?\bon\s+(\S+)")
_NP = re.compile(r"(?:^|\s)(?:-np|-n|--ntasks)[\s=]+(\d+)")
_NPERNODE = re.compile(r"(?:^|\s)(?:--?npernode|-ppn|--ntasks-per-node)[\s=]+(\d+)")
_LOG = re.compile(r"\bNCCL (?:INFO|WARN)\b")


@dataclass(frozen=True, slots=True)
class NcclTable:
    """One nccl-tests run: out-of-place time (seconds) per message size (bytes)."""

    op: str
    ranks: int
    ranks_per_node: int
    sizes: tuple[int, ...]
    times_s: tuple[float, ...]
    source: str = ""

    @property
    def nodes(self) -> int:
        return -(-self.ranks // self.ranks_per_node)


def parse_nccl_tests(path: str | Path, op: str | None = None) -> NcclTable:
    """Read nccl-tests stdout; `op` overrides the operation named by the binary."""
    source = str(path)
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError as exc:
        raise LoomInputError(f"cannot read nccl-tests output: {exc.strerror or exc}", source=source) from exc
    if op is not None and op not in OPS:
        raise LoomInputError(f"unknown operation {op!r} (allowed: {', '.join(OPS)})", source=source, field="op")
    found_op: str | None = None
    hosts: dict[str, int] = {}
    np = npernode = None
    columns: dict[str, int] | None = None
    rows: list[tuple[int, float]] = []
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text:
            continue
        if found_op is None and (m := _BINARY.search(text)):
            found_op = "send" if m.group(1) == "sendrecv" else m.group(1)
        if _LOG.search(text):  # NCCL_DEBUG output interleaved with the table
            continue
        if text.startswith(">") or (columns is None and not text.startswith("#")):  # command line
            np = np or _int_match(_NP, text)
            npernode = npernode or _int_match(_NPERNODE, text)
            continue
        if text.startswith("#"):
            if m := _RANK.match(text):
                hosts[m.group(1)] = hosts.get(m.group(1), 0) + 1
            names = text.lstrip("#").split()
            if names[:1] == ["size"] and "time" in names:
                columns = {name: names.index(name) for name in ("size", "time", "algbw", "busbw") if name in names}
            continue
        if columns is not None:
            rows.append(_row(text.split(), columns, source, number))
    if not rows:
        raise LoomInputError(
            "no data rows (expected an nccl-tests '# size count type ... time algbw busbw' table)",
            source=source, line=len(lines) or None,
        )
    op = op or found_op
    if op is None:
        raise LoomInputError("cannot tell the operation; name the *_perf binary or pass op=", source=source, field="op")
    if hosts:
        ranks, per_node = sum(hosts.values()), max(hosts.values())
    elif np:
        ranks, per_node = np, min(npernode or np, np)
    else:
        raise LoomInputError("cannot find the number of ranks ('#  Rank' lines or -np)", source=source)
    rows.sort()
    return NcclTable(op, ranks, per_node, tuple(s for s, _ in rows), tuple(t for _, t in rows), source)


def _int_match(pattern: re.Pattern[str], text: str) -> int | None:
    m = pattern.search(text)
    return int(m.group(1)) if m else None


def _row(tokens: list[str], columns: dict[str, int], source: str, line: int) -> tuple[int, float]:
    """(size bytes, out-of-place time seconds) of one data row."""
    values: dict[str, float] = {}
    for name, index in columns.items():
        if index >= len(tokens):
            raise LoomInputError(f"data row has {len(tokens)} columns, expected at least {index + 1}",
                                 source=source, line=line, field=name)
        try:
            value = float(tokens[index])
        except ValueError:
            raise LoomInputError(f"not a number: {tokens[index]!r}", source=source, line=line, field=name) from None
        if not math.isfinite(value) or value < 0:
            raise LoomInputError(f"must be a finite non-negative number, got {tokens[index]!r}",
                                 source=source, line=line, field=name)
        values[name] = value
    size = values["size"]
    if not size.is_integer():
        raise LoomInputError(f"size must be whole bytes, got {tokens[columns['size']]!r}",
                             source=source, line=line, field="size")
    if values["time"] <= 0:
        raise LoomInputError("time must be positive", source=source, line=line, field="time")
    return int(size), values["time"] * 1e-6


class _Curve:
    """Monotone log-log interpolation of time over message size."""

    def __init__(self, table: NcclTable) -> None:
        best: dict[int, float] = {}
        for size, t in zip(table.sizes, table.times_s):
            if size > 0:
                best[size] = min(t, best.get(size, math.inf))
        self.sizes = sorted(best)
        times = [best[s] for s in self.sizes]
        for i in range(len(times) - 2, -1, -1):  # running minimum from the large end
            times[i] = min(times[i], times[i + 1])
        self.times = times
        self.table = table

    def time(self, nbytes: float) -> float:
        sizes, times = self.sizes, self.times
        if nbytes <= sizes[0]:
            return times[0]
        if nbytes >= sizes[-1]:
            return times[-1] * nbytes / sizes[-1]
        i = bisect.bisect_right(sizes, nbytes) - 1
        if sizes[i] == nbytes:
            return times[i]
        w = math.log(nbytes / sizes[i]) / math.log(sizes[i + 1] / sizes[i])
        t = math.exp((1 - w) * math.log(times[i]) + w * math.log(times[i + 1]))
        return min(max(t, times[i]), times[i + 1])  # no round-off outside the bracket


class MeasuredComm:
    """`CommModel` interpolating nccl-tests tables, with an analytical fallback."""

    def __init__(self, tables: list[NcclTable], fallback: CommModel, calibration: Calibration | None = None) -> None:
        self.fallback = fallback
        self.cal = calibration or getattr(fallback, "cal", None) or load_calibration()
        self.curves: dict[str, list[_Curve]] = {}
        for table in tables:
            if table.op in PASSES and any(s > 0 for s in table.sizes):
                self.curves.setdefault(table.op, []).append(_Curve(table))

    def all_reduce(self, nbytes: float, group: GroupShape, links: Links) -> float:
        return self._collective("all_reduce", nbytes, group, links)

    def reduce_scatter(self, nbytes: float, group: GroupShape, links: Links) -> float:
        return self._collective("reduce_scatter", nbytes, group, links)

    def all_gather(self, nbytes: float, group: GroupShape, links: Links) -> float:
        return self._collective("all_gather", nbytes, group, links)

    def send(self, nbytes: float, group: GroupShape, links: Links) -> float:
        return self.fallback.send(nbytes, group, links)

    def all_to_all(self, nbytes: float, group: GroupShape, links: Links) -> float:
        """MoE dispatch/combine: the fallback's formula (no all-to-all tables are read yet)."""
        return self.fallback.all_to_all(nbytes, group, links)

    def _collective(self, op: str, nbytes: float, group: GroupShape, links: Links) -> float:
        fallback = getattr(self.fallback, op)
        k = min(group.per_node, group.size)
        nodes = -(-group.size // k) if k > 0 else 0
        curve = self._pick(op, group.size, k)
        if curve is None or nbytes <= 0 or nodes <= 1:
            return fallback(nbytes, group, links)
        table = curve.table
        t = curve.time(nbytes)
        if (table.ranks, table.ranks_per_node) != (group.size, k):
            # node_bw(S) = p·(N_t−1)/N_t·S / t(S); time = p·(N−1)/N·S / (node_bw(S)·k/k_t)
            n_t = table.nodes
            t *= ((nodes - 1) / nodes) / ((n_t - 1) / n_t) * table.ranks_per_node / k
            # (passes cancel: the table's op is the op asked for)
        loss = minipod_loss(self.cal.minipod_loss_collective, group.minipods, self.cal.saturate_minipods)
        return t * group.oversubscription / (1.0 - loss)

    def _pick(self, op: str, size: int, per_node: int) -> _Curve | None:
        """The table of the same shape, else the inter-node one of the closest shape."""
        curves = self.curves.get(op, [])
        for curve in curves:
            if (curve.table.ranks, curve.table.ranks_per_node) == (size, per_node):
                return curve
        nodes = -(-size // per_node) if per_node > 0 else 0
        inter = [c for c in curves if c.table.nodes > 1]
        if not inter:
            return None
        return min(inter, key=lambda c: (abs(c.table.ranks_per_node - per_node), abs(c.table.nodes - nodes)))
