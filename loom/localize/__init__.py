"""Live fault localisation: Acme's two-round pairwise all-gather test on emulated nodes.

    from loom.localize import localize
    result = localize([f"n{i}" for i in range(8)], {"n3": "hang"}, timeout_s=3)
    result.faulty      # ('n3',)
    result.reason()    # 'round 1: 4 groups, (n2, n3) failed: ... → faulty: n3'

Importing this package imports no torch: agents are separate processes
(`loom.localize.agent`); see docs/RELIABILITY.md, "Fault localisation (live)".
"""

from loom.localize.api import DEFAULT_TENSOR_BYTES, DEFAULT_TIMEOUT_S, localize
from loom.localize.cluster import AgentHub, Launcher, spawn_launcher
from loom.localize.model import (
           FAULT_ENV,
           FAULT_KINDS,
           Fault,
           GroupTest,
           Localisation,
           Round,
)
from loom.localize.strategy import METHODS

__all__ = [
           "DEFAULT_TENSOR_BYTES",
           "DEFAULT_TIMEOUT_S",
           "FAULT_ENV",
           "FAULT_KINDS",
           "METHODS",
           "AgentHub",
           "Fault",
           "GroupTest",
           "Launcher",
           "Localisation",
           "Round",
           "localize",
           "spawn_launcher",
]
