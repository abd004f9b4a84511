"""`philly:PATH` — Microsoft Philly's cluster_machine_list (grouping in docs/CLUSTERS.md)."""

from __future__ import annotations

from loom.hardware.clusters import IMPORTERS, philly_from_machine_list
from loom.hardware.topology import Topology


def load_philly(spec: str) -> Topology:
    return philly_from_machine_list(spec)


IMPORTERS.add("philly", load_philly)
