"""Replacement nodes for a job that lost nodes to a failure (Arnold Appendix B, Acme §6.1).

A job restarted after a failure keeps its surviving nodes; each failed node
needs a replacement holding the same number of GPUs of the same type.

* ``topology`` (topology-preserving): the replacement shares the deepest
  switch with the failed node — the same leaf, else the same minipod, else the
  same spine … — so the job's communication groups keep the alignment they had
  (rank positions move to a node one hop away at most). Ties: a hot spare of the
  failed node's own minipod first (they exist for this), other minipods' spares
  last (they guard their own minipod), then the node with the fewest free GPUs
  that fits (best fit), then the lowest index.
* ``naive``: the first node (lowest index) of the right type with enough free
  GPUs — what a scheduler that ignores the topology does.

Candidates are healthy, not already in the job, of the failed node's GPU type,
and either unreserved or one of `spares` (nodes held back for recovery).
Spare nodes may be busy with preemptible jobs: `busy_spare_gpus` says how many
GPUs of each spare those jobs hold (they will be preempted), so a spare counts
as free for recovery.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from loom.errors import LoomInputError
from loom.hardware.state import NO_RESERVATION, ClusterState

MODES = ("topology", "naive")


def shared_depth(switch_of: np.ndarray, node: int, others: np.ndarray) -> np.ndarray:
    """Per candidate: how many tiers (from the top) it shares a switch with `node`."""
    same = switch_of[:, others] == switch_of[:, [node]]
    return np.cumprod(same, axis=0).sum(axis=0)


def replacements(state: ClusterState, keep: tuple[int, ...], lost: Mapping[int, int], mode: str = "topology",
                 spares: frozenset[int] = frozenset(), busy_spare_gpus: Mapping[int, int] | None = None
                 ) -> dict[int, int] | None:
    """Failed node → replacement node for every entry of `lost` (node → GPUs it held), or None
    when some failed node has no replacement."""
    if mode not in MODES:
        raise LoomInputError(f"must be one of {', '.join(MODES)}, got {mode!r}", field="recovery.replacement")
    topo = state.topology
    free = state.free.astype(np.int64)
    for node, gpus in (busy_spare_gpus or {}).items():
        free[node] += gpus
    usable = ~state.failed & ((state.reserved_by == NO_RESERVATION) | np.isin(np.arange(len(free)), list(spares)))
    usable[list(keep)] = False
    is_spare = np.zeros(len(free), dtype=bool)
    is_spare[list(spares)] = True
    chosen: dict[int, int] = {}
    for failed, gpus in sorted(lost.items()):
        ok = usable & (topo.node_type == topo.node_type[failed]) & (free >= gpus)
        ok[failed] = False
        candidates = np.flatnonzero(ok)
        if candidates.size == 0:
            return None
        if mode == "naive":
            pick = int(candidates[0])
        else:
            depth = shared_depth(topo.switch_of, failed, candidates)
            pods = topo.switch_of[topo.minipod_tier]
            local = pods[candidates] == pods[failed]
            # a spare of the failed node's own minipod first; another minipod's spare last (it guards its own)
            spare_rank = np.where(is_spare[candidates], np.where(local, 0, 2), 1)
            order = np.lexsort((candidates, free[candidates], spare_rank, -depth))
            pick = int(candidates[order[0]])
        chosen[failed] = pick
        usable[pick] = False  # one failed node per replacement
        free[pick] -= gpus
    return chosen
