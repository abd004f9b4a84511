"""Energy of a run: busy GPUs at board power, idle GPUs at a flat idle draw.

Acme (seed 001) reports that idle GPUs still draw ~60 W, so a schedule that
keeps reserved nodes idle costs energy as well as throughput. Powers live in
`loom/hardware/data/gpu_power.yaml`; busy GPUs are charged their maximum
board power, so busy energy is an upper bound.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml

from loom.errors import LoomInputError
from loom.sim.engine import SimulationResult

_DATA = Path(__file__).parents[1] / "hardware" / "data" / "gpu_power.yaml"


@lru_cache(maxsize=1)
def gpu_power() -> tuple[float, dict[str, float]]:
    """(idle W per GPU, board W per GPU type), validated."""
    raw = yaml.safe_load(_DATA.read_text())
    try:
        idle = float(raw["idle_w"])
        board = {str(k): float(v) for k, v in raw["board_w"].items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise LoomInputError(f"malformed power table: {exc}", source=str(_DATA)) from None
    if idle < 0 or any(v <= 0 for v in board.values()):
        raise LoomInputError("powers must be positive", source=str(_DATA), field="board_w")
    return idle, board


def energy(result: SimulationResult) -> dict[str, float]:
    """kWh busy, idle and total over the run (failed GPUs draw nothing)."""
    idle_w, board = gpu_power()
    topo = result.topology
    default_type = topo.largest_gpu_type()
    busy_j = 0.0
    for job in result.jobs:
        if not job.gpu_seconds:
            continue
        kind = job.spec.gpu_type
        if job.allocation is not None:
            kind = topo.gpu_types[int(topo.node_type[job.allocation.nodes[0]])]
        busy_j += job.gpu_seconds * board.get(kind or default_type, board.get(default_type, 400.0))
    makespan = result.end_time - result.start_time
    idle_gpu_s = max(0.0, topo.total_gpus * makespan - result.failed_gpu_seconds - result.busy_gpu_seconds)
    idle_j = idle_gpu_s * idle_w
    return {"energy_busy_kwh": busy_j / 3.6e6, "energy_idle_kwh": idle_j / 3.6e6,
            "energy_kwh": (busy_j + idle_j) / 3.6e6}
