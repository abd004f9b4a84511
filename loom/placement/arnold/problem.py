"""The placement problem of a large pretraining job, and its exact scoring.

Communication matrix (Arnold Eq. 1, DESIGN.md §4) for G GPUs per node:
``rows = DP·TP/G`` and ``cols = PP``; cell (r, c) is one node holding TP-wide
shards of pipeline stage c for G/TP data-parallel replicas. A row is (G/TP ×
TP) PP groups in node units, a column is the DP groups of one stage. A
placement maps every cell to a node: ``grid[r, c] = node index``.

Scores are always computed here, from the final grid (never from solver
variables): spread of a group = minipods its nodes touch; the objective
(Eq. 2) is ``α·max DP spread + β·max PP spread`` with β = 1 − α.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from loom.errors import LoomInputError
from loom.hardware.state import ClusterState
from loom.hardware.topology import Topology


@dataclass(frozen=True, slots=True)
class JobShape:
    """dp × tp × pp ranks on nodes of G GPUs; validated on construction."""

    dp: int
    tp: int
    pp: int
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        for field in ("dp", "tp", "pp", "gpus_per_node"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LoomInputError(f"must be a positive integer, got {value!r}", field=field)
        g = self.gpus_per_node
        if self.tp > g:
            raise LoomInputError(f"TP {self.tp} exceeds the {g} GPUs of a node", field="tp")
        if g % self.tp:
            raise LoomInputError(f"TP {self.tp} does not divide the {g} GPUs of a node", field="tp")
        if (self.dp * self.tp) % g:
            raise LoomInputError(
                f"DP·TP = {self.dp * self.tp} is not a multiple of {g} GPUs per node (whole nodes per stage)",
                field="dp",
            )

    @property
    def rows(self) -> int:
        return self.dp * self.tp // self.gpus_per_node

    @property
    def cols(self) -> int:
        return self.pp

    @property
    def nodes(self) -> int:
        return self.rows * self.cols

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp


@dataclass(frozen=True, slots=True)
class SpreadScore:
    """Eq. 2 from a final placement, plus the paper's Eq. 3 values."""

    dp_max_spread: int  # most minipods any DP group (column) touches
    pp_max_spread: int  # most minipods any PP group (row) touches
    weighted_spread: float  # α·dp + β·pp
    dp_eq3: int  # Eq. 3: 0 for one minipod, k for k ≥ 2
    pp_eq3: int
    minipods_used: int
    leaves_used: int


def free_nodes(state: ClusterState, gpu_type: str | None = None) -> np.ndarray:
    """Indices of nodes whose GPUs are all free (not failed, not reserved)."""
    topo = state.topology
    whole = (state.free == topo.node_gpus) & ~state.failed & (state.reserved_by < 0)
    if gpu_type is not None:
        type_id = topo.type_id(gpu_type)
        if type_id is None:
            raise LoomInputError(f"the cluster has no {gpu_type} GPUs", field="gpu_type")
        whole &= topo.node_type == type_id
    return np.flatnonzero(whole)


def check_capacity(shape: JobShape, free: np.ndarray, topology: Topology) -> None:
    """Clear errors for requests the free nodes cannot hold."""
    sizes = set(topology.node_gpus[free].tolist()) if len(free) else set()
    if sizes and sizes != {shape.gpus_per_node}:
        raise LoomInputError(
            f"the job assumes {shape.gpus_per_node} GPUs per node; the free nodes have {sorted(sizes)}",
            field="gpus_per_node",
        )
    if len(free) < shape.nodes:
        raise LoomInputError(
            f"the job needs {shape.nodes} whole nodes ({shape.gpus} GPUs); only {len(free)} are free", field="nodes"
        )


def minipod_of(topology: Topology) -> np.ndarray:
    return topology.switch_of[topology.minipod_tier]


def default_grid(shape: JobShape, nodes: np.ndarray | list[int], topology: Topology) -> np.ndarray:
    """Ranks in the default order of a group-unaware scheduler: the selected
    nodes sorted by name, ranks filling them in order (rank = t + tp·(d + dp·p)),
    which fills the matrix column by column."""
    ordered = sorted((int(n) for n in nodes), key=lambda n: topology.node_names[n])
    if len(ordered) != shape.nodes:
        raise LoomInputError(f"expected {shape.nodes} nodes, got {len(ordered)}", field="nodes")
    return np.asarray(ordered, dtype=np.int64).reshape(shape.cols, shape.rows).T.copy()


def score(grid: np.ndarray, topology: Topology, alpha: float) -> SpreadScore:
    """Eq. 2 (and Eq. 3) of a placement; α is the DP affinity, β = 1 − α."""
    pods = minipod_of(topology)[grid]  # [rows, cols]
    dp = _max_distinct(pods.T)  # columns are DP groups
    pp = _max_distinct(pods)  # rows are PP groups
    leaves = topology.switch_of[topology.leaf_tier][grid]
    return SpreadScore(
        dp_max_spread=dp,
        pp_max_spread=pp,
        weighted_spread=alpha * dp + (1.0 - alpha) * pp,
        dp_eq3=0 if dp == 1 else dp,
        pp_eq3=0 if pp == 1 else pp,
        minipods_used=int(np.unique(pods).size),
        leaves_used=int(np.unique(leaves).size),
    )


def _max_distinct(groups: np.ndarray) -> int:
    """Most distinct values in any row of a 2-D array."""
    ordered = np.sort(groups, axis=1)
    return int((1 + (np.diff(ordered, axis=1) != 0).sum(axis=1)).max())


def rank_nodes(grid: np.ndarray, shape: JobShape) -> list[int]:
    """Node of every global rank (rank = t + tp·(d + dp·p)), for a launcher."""
    per_node_dp = shape.gpus_per_node // shape.tp
    out = []
    for p in range(shape.pp):
        for d in range(shape.dp):
            node = int(grid[d // per_node_dp, p])
            out.extend([node] * shape.tp)
    return out


def hostfile(grid: np.ndarray, shape: JobShape, topology: Topology) -> str:
    """One line per node in rank order with its slots (MPI/DeepSpeed style)."""
    seen: list[int] = []
    for node in rank_nodes(grid, shape):
        if not seen or seen[-1] != node:
            seen.append(node)
    return "".join(f"{topology.node_names[n]} slots={shape.gpus_per_node}\n" for n in seen)


def communication_matrix(shape: JobShape, model: object, micro_batch: int = 1, grad_bytes: int = 2,
                         activation_bytes: int = 2) -> np.ndarray:
    """[rows, cols, 3] per matrix node: (v_w, v_d, v_p) per GPU of that node.

    Arnold Appendix C: v_w = the stage's parameters / TP; v_d = its DP volume
    (the stage's parameters / TP × bytes; the embedding only on the first and
    last stages); v_p = the PP volume per micro-batch, 2·mb·s·h × bytes / TP
    (each TP rank sends its shard). `model` is a `loom.perf.ModelSpec`.
    """
    from loom.perf.model import ModelSpec

    if not isinstance(model, ModelSpec) or model.kind != "transformer":
        raise LoomInputError("the communication matrix needs a transformer ModelSpec", field="model")
    if model.layers % shape.pp:
        raise LoomInputError(f"layers ({model.layers}) not divisible by PP {shape.pp}", field="pp")
    per_layer = (model.total_params() - model.embedding_params() - model.norm_params()) / model.layers
    stage = model.layers // shape.pp * per_layer
    embedding = float(model.embedding_params())
    out = np.empty((shape.rows, shape.cols, 3))
    for c in range(shape.cols):
        params = stage + (embedding if c in (0, shape.cols - 1) else 0.0)
        out[:, c, 0] = params / shape.tp
        out[:, c, 1] = params / shape.tp * grad_bytes
        out[:, c, 2] = 2.0 * micro_batch * model.seq_len * model.hidden * activation_bytes / shape.tp
    return out
