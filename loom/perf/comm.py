"""Communication cost: how long a collective or a send takes for a group.

Two implementations behind one protocol (`CommModel`):

- `BusBandwidthComm`: NCCL bus-bandwidth formulas on the links a group uses.
  A group of n GPUs with k members per node over N nodes runs hierarchically:
  the intra-node phase on NVLink/PCIe, the inter-node phase on the k NICs of
  each node (so an all-reduce moves 2(N-1)/N · S/k bytes per NIC). The two
  phases pipeline, so the slower one sets the time — this reproduces the
  nccl-tests curve in ../shared/traces/nccl (2 × 8 H100: algorithm bandwidth
  → node NIC bandwidth). Effective bandwidth = nominal × link efficiency ×
  message-size saturation S/(S + S_half) × (1 − minipod loss) / oversubscription.
- `loom.perf.nccl.MeasuredComm`: interpolation over nccl-tests tables.

Sizes are bytes, bandwidths GB/s (1e9 bytes/s), times seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from loom.perf.calibration import Calibration

MB = 1e6
GB = 1e9


@dataclass(frozen=True, slots=True)
class Links:
    """Per-GPU link bandwidths a group can use, GB/s in one direction."""

    intra_node_gbps: float
    nic_gbps: float  # per GPU: node scale-out bandwidth / GPUs per node (bytes!)


@dataclass(frozen=True, slots=True)
class GroupShape:
    """Where the members of one communication group sit."""

    size: int  # n GPUs
    per_node: int = 1  # k members sharing a node (k = n: the group is inside a node)
    minipods: int = 1  # minipods the group spans
    oversubscription: float = 1.0  # of the highest fabric tier the group crosses

    @property
    def nodes(self) -> int:
        return -(-self.size // self.per_node)


class CommModel(Protocol):
    """Time of a collective on a group, given the message size per GPU."""

    def all_reduce(self, nbytes: float, group: GroupShape, links: Links) -> float: ...

    def reduce_scatter(self, nbytes: float, group: GroupShape, links: Links) -> float: ...

    def all_gather(self, nbytes: float, group: GroupShape, links: Links) -> float: ...

    def send(self, nbytes: float, group: GroupShape, links: Links) -> float: ...

    def all_to_all(self, nbytes: float, group: GroupShape, links: Links) -> float: ...


def minipod_loss(max_loss: float, minipods: int, saturate: int) -> float:
    """Fraction of bandwidth lost when a group spans `minipods` minipods.

    Scales with the share of the group's member pairs that sit in different
    minipods, 1 − 1/k for an even split over k minipods, and reaches `max_loss`
    at `saturate` minipods (Arnold Fig. 4b/c: collectives up to 17%, P2P up to
    70%). Two minipods give 4/7 of the maximum when `saturate` is 8."""
    if minipods <= 1:
        return 0.0
    if saturate <= 1:
        return max_loss
    return max_loss * min(1.0, (1.0 - 1.0 / minipods) / (1.0 - 1.0 / saturate))


def saturation(nbytes: float, half_mb: float) -> float:
    """Share of large-message bandwidth a message of `nbytes` reaches."""
    return nbytes / (nbytes + half_mb * MB)


class BusBandwidthComm:
    """Analytical NCCL costs (see module docstring)."""

    def __init__(self, calibration: Calibration) -> None:
        self.cal = calibration
        self._intra_half = calibration.half_bw_intra_mb * MB
        self._inter_half = calibration.half_bw_inter_mb * MB
        self._inter_latency = calibration.latency_inter_us * 1e-6
        self._intra_latency = calibration.latency_intra_us * 1e-6

    # A ring over n ranks moves `factor` × S bytes through each rank's link;
    # all-reduce 2(n-1)/n, reduce-scatter and all-gather (n-1)/n.
    def all_reduce(self, nbytes: float, group: GroupShape, links: Links) -> float:
        return self._collective(nbytes, group, links, passes=2)

    def reduce_scatter(self, nbytes: float, group: GroupShape, links: Links) -> float:
        return self._collective(nbytes, group, links, passes=1)

    def all_gather(self, nbytes: float, group: GroupShape, links: Links) -> float:
        return self._collective(nbytes, group, links, passes=1)

    def all_to_all(self, nbytes: float, group: GroupShape, links: Links) -> float:
        """Each of the n ranks holds `nbytes` and sends an equal 1/n share to every other rank
        (MoE token dispatch and combine). Unlike a ring collective nothing is aggregated inside a
        node first: of the (n − 1)/n · S leaving a rank, (k − 1)/n · S go over NVLink to the k − 1
        peers in its node and (n − k)/n · S over its own NIC share to the other nodes. The two
        run at once, so the slower sets the time, plus one start-up latency per phase used. The
        transfers are n − 1 concurrent point-to-point sends of S/n each, so the per-peer message
        sets the saturation (P2P's S½ across nodes, the intra-node one inside)."""
        n = group.size
        if n <= 1 or nbytes <= 0:
            return 0.0
        cal = self.cal
        k = min(n, group.per_node)
        peer = nbytes / n
        intra = 0.0
        if k > 1:
            bw = links.intra_node_gbps * GB * cal.link_efficiency * saturation(peer, cal.half_bw_intra_mb)
            intra = (k - 1) * peer / bw
        if k >= n:
            return self._intra_latency + intra
        loss = minipod_loss(cal.minipod_loss_collective, group.minipods, cal.saturate_minipods)
        bw = links.nic_gbps * GB * cal.link_efficiency * saturation(peer, cal.half_bw_p2p_mb)
        bw *= (1.0 - loss) / group.oversubscription
        inter = (n - k) * peer / bw
        return self._inter_latency + max(intra, inter)

    def send(self, nbytes: float, group: GroupShape, links: Links) -> float:
        """Point-to-point transfer of `nbytes` between two ranks of `group`.

        group.per_node > 1 means both ends are in one node (NVLink)."""
        if nbytes <= 0:
            return 0.0
        cal = self.cal
        if group.per_node >= group.size:
            bw = links.intra_node_gbps * cal.link_efficiency * saturation(nbytes, cal.half_bw_intra_mb)
            return cal.latency_intra_us * 1e-6 + nbytes / (bw * GB)
        loss = minipod_loss(cal.minipod_loss_p2p, group.minipods, cal.saturate_minipods)
        bw = (
            links.nic_gbps
            * cal.link_efficiency
            * saturation(nbytes, cal.half_bw_p2p_mb)
            * (1.0 - loss)
            / group.oversubscription
        )
        return cal.latency_inter_us * 1e-6 + nbytes / (bw * GB)

    def _collective(self, nbytes: float, group: GroupShape, links: Links, passes: int) -> float:
        n = group.size
        if n <= 1 or nbytes <= 0:
            return 0.0
        cal = self.cal
        k = min(n, group.per_node)
        intra = 0.0
        if k > 1:
            bw = links.intra_node_gbps * GB * cal.link_efficiency * nbytes / (nbytes + self._intra_half)
            intra = passes * (k - 1) / k * nbytes / bw
        nodes = -(-n // k)
        if nodes <= 1:
            return self._intra_latency + intra
        loss = minipod_loss(cal.minipod_loss_collective, group.minipods, cal.saturate_minipods)
        bw = k * links.nic_gbps * GB * cal.link_efficiency * nbytes / (nbytes + self._inter_half)
        bw *= (1.0 - loss) / group.oversubscription
        inter = passes * (nodes - 1) / nodes * nbytes / bw
        steps = math.log2(nodes) + 1.0  # tree/ring start-up grows slowly with nodes
        return self._inter_latency * steps + (max(inter, intra))
