"""The static switch tree.

A `Topology` is built once and never mutated: tiers from the top (e.g. core)
down to the leaf switch, then nodes. Everything per-node is a NumPy array so
that mutable cluster state (`loom.hardware.state`) can be a handful of dense
arrays indexed by node or switch, cheap to copy for what-if evaluation.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from loom.errors import LoomInputError

MAX_GPUS_PER_NODE = 1024  # beyond any real server: a larger count is a typo


@dataclass(frozen=True, slots=True)
class Tier:
    """One switch level. Bandwidth/latency price traffic that must cross it."""

    name: str
    bandwidth_gbps: float = 400.0
    latency_us: float = 1.0
    oversubscription: float = 1.0

    def __post_init__(self) -> None:
        if not self.name:
            raise LoomInputError("tier name must not be empty", field="tiers.name")
        for attr in ("bandwidth_gbps", "latency_us", "oversubscription"):
            value = getattr(self, attr)
            if not value > 0 and not (attr == "latency_us" and value == 0):
                raise LoomInputError(f"must be positive, got {value}", field=f"tiers.{self.name}.{attr}")


@dataclass(frozen=True, slots=True)
class NodeDef:
    """A node as given by a topology source: its switch path top → leaf."""

    name: str
    path: tuple[str, ...]
    gpu_type: str
    gpus: int


@dataclass(frozen=True, eq=False)
class Topology:
    """Read-only tree of tiers, switches and nodes with dense per-node arrays."""

    name: str
    tiers: tuple[Tier, ...]
    node_names: tuple[str, ...]
    node_gpus: np.ndarray  # int32 [nodes]
    node_type: np.ndarray  # int16 [nodes], index into gpu_types
    gpu_types: tuple[str, ...]
    switch_of: np.ndarray  # int32 [tiers, nodes]: switch index per tier
    switch_names: tuple[tuple[str, ...], ...]  # per tier, scoped names "spine0/leaf3"
    switch_parent: tuple[np.ndarray, ...]  # per tier: parent switch index in tier above (-1 at top)
    minipod_tier: int
    description: str = ""
    node_index: dict[str, int] = field(default_factory=dict, repr=False)

    # ------------------------------------------------------------------ build
    @classmethod
    def build(
        cls,
        name: str,
        tiers: Sequence[Tier],
        nodes: Iterable[NodeDef],
        *,
        minipod_tier: str | None = None,
        description: str = "",
        source: str | None = None,
    ) -> Topology:
        """Build from node definitions; switch names are scoped by their parent."""
        tiers = tuple(tiers)
        nodes = list(nodes)
        if not tiers:
            raise LoomInputError("a topology needs at least one switch tier", source=source, field="tiers")
        if not nodes:
            raise LoomInputError("a topology needs at least one node", source=source, field="nodes")
        depth = len(tiers)
        type_names: list[str] = []
        type_ids: dict[str, int] = {}
        switch_ids: list[dict[tuple[str, ...], int]] = [{} for _ in range(depth)]
        parents: list[list[int]] = [[] for _ in range(depth)]
        switch_of = np.empty((depth, len(nodes)), dtype=np.int32)
        node_gpus = np.empty(len(nodes), dtype=np.int32)
        node_type = np.empty(len(nodes), dtype=np.int16)
        index: dict[str, int] = {}
        for i, node in enumerate(nodes):
            if node.name in index:
                raise LoomInputError(f"node '{node.name}' appears twice", source=source, field="nodes")
            if len(node.path) != depth:
                raise LoomInputError(
                    f"node '{node.name}' has a switch path of {len(node.path)} levels, the topology has {depth}",
                    source=source,
                    field="nodes",
                )
            if not 0 <= node.gpus <= MAX_GPUS_PER_NODE:
                raise LoomInputError(f"node '{node.name}' has {node.gpus} GPUs; expected 0–{MAX_GPUS_PER_NODE}",
                                     source=source, field="gpus")
            index[node.name] = i
            node_gpus[i] = node.gpus
            node_type[i] = type_ids.setdefault(node.gpu_type, len(type_ids))
            if len(type_ids) > len(type_names):
                type_names.append(node.gpu_type)
            parent = -1
            for level in range(depth):
                key = node.path[: level + 1]
                sid = switch_ids[level].get(key)
                if sid is None:
                    sid = len(switch_ids[level])
                    switch_ids[level][key] = sid
                    parents[level].append(parent)
                switch_of[level, i] = sid
                parent = sid
        _check_gpu_types(type_names, source)
        names = tuple(tuple("/".join(key) for key in ids) for ids in switch_ids)
        mp = _minipod_tier(tiers, minipod_tier, source)
        return cls(
            name=name,
            tiers=tiers,
            node_names=tuple(n.name for n in nodes),
            node_gpus=node_gpus,
            node_type=node_type,
            gpu_types=tuple(type_names),
            switch_of=switch_of,
            switch_names=names,
            switch_parent=tuple(np.asarray(p, dtype=np.int32) for p in parents),
            minipod_tier=mp,
            description=description,
            node_index=index,
        )

    # --------------------------------------------------------------- queries
    @property
    def num_nodes(self) -> int:
        return len(self.node_names)

    @property
    def total_gpus(self) -> int:
        return int(self.node_gpus.sum())

    @property
    def leaf_tier(self) -> int:
        return len(self.tiers) - 1

    @property
    def homogeneous(self) -> bool:
        return len(self.gpu_types) == 1

    def num_switches(self, tier: int) -> int:
        return len(self.switch_names[tier])

    def type_id(self, gpu_type: str) -> int | None:
        try:
            return self.gpu_types.index(gpu_type)
        except ValueError:
            return None

    def max_gpus_of_type(self, gpu_type: str | None) -> int:
        """The largest job this cluster can ever hold: jobs never span GPU types,
        so an untyped job is bounded by the largest single-type pool."""
        if gpu_type is None:
            return max(self.gpus_by_type().values(), key=lambda ng: ng[1])[1]
        tid = self.type_id(gpu_type)
        return 0 if tid is None else int(self.node_gpus[self.node_type == tid].sum())

    def switches_spanned(self, nodes: Sequence[int]) -> tuple[int, ...]:
        """Distinct switches touched per tier (top → leaf) by a set of nodes."""
        if len(nodes) == 1:
            return (1,) * len(self.tiers)
        cols = self.switch_of[:, list(nodes)]
        return tuple(len(set(row.tolist())) for row in cols)

    def gpus_by_type(self) -> dict[str, tuple[int, int]]:
        """GPU type → (nodes, GPUs)."""
        out = {}
        for tid, name in enumerate(self.gpu_types):
            mask = self.node_type == tid
            out[name] = (int(mask.sum()), int(self.node_gpus[mask].sum()))
        return out

    def gpus_per_node(self, gpu_type: str | None) -> int:
        """The largest node of a GPU type (of the cluster when the type is absent or None)."""
        type_id = None if gpu_type is None else self.type_id(gpu_type)
        if type_id is None:
            return int(self.node_gpus.max())
        return int(self.node_gpus[self.node_type == type_id].max())

    def largest_gpu_type(self) -> str:
        """The GPU type with the most GPUs."""
        return max(self.gpus_by_type().items(), key=lambda kv: kv[1][1])[0]


def _check_gpu_types(names: list[str], source: str | None) -> None:
    """Every GPU type must be in the spec table, so estimators can price it later."""
    from loom.hardware.gpus import load_gpu_specs

    known = load_gpu_specs()
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=2)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise LoomInputError(f"unknown GPU type '{name}' (known: {', '.join(sorted(known))}){hint}",
                                 source=source, field="gpu_type")


def _minipod_tier(tiers: tuple[Tier, ...], requested: str | None, source: str | None) -> int:
    """The tier whose switches delimit minipods (Arnold's spread unit)."""
    names = [t.name for t in tiers]
    if requested is not None:
        if requested not in names:
            raise LoomInputError(
                f"minipod tier '{requested}' is not one of {names}", source=source, field="minipod_tier"
            )
        return names.index(requested)
    for candidate in ("minipod", "spine", "pod", "block"):
        if candidate in names:
            return names.index(candidate)
    return max(0, len(tiers) - 2)
