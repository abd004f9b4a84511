"""Energy of a run: busy GPUs at board power, idle GPUs at a flat idle draw.

Acme (seed 001) reports that idle GPUs still draw ~60 W, so a schedule that
keeps reserved nodes idle costs energy as well as throughput. Powers live in
`loom/hardware/data/gpu_power.yaml`; busy GPUs are charged their maximum
board power, so busy energy is an upper bound.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import yaml

from loom.errors import LoomInputError
from loom.report.columns import JobTable
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


def energy(result: SimulationResult, table: JobTable | None = None) -> dict[str, float]:
    """kWh busy, idle and total over the run (failed GPUs draw nothing)."""
    idle_w, board = gpu_power()
    topo = result.topology
    t = table if table is not None else JobTable(result)
    default_type = topo.largest_gpu_type()
    fallback = board.get(default_type, 400.0)
    # a job's GPU type: its allocation's (first node), else the one its spec asks for, else the cluster's main one
    by_type = [board.get(kind or default_type, fallback) for kind in topo.gpu_types] + [0.0]
    types = t.node_types
    watts = np.asarray(by_type)[types]
    by_spec: dict[str | None, float] = {}
    for i in np.flatnonzero(types < 0).tolist():  # never held GPUs (few): the type its spec asks for
        kind = t.gpu_type[i]
        if kind not in by_spec:
            by_spec[kind] = board.get(kind or default_type, fallback)
        watts[i] = by_spec[kind]
    gpu_s = np.array(t.gpu_seconds, dtype=np.float64).reshape(len(t))
    # summed in job order one addition at a time (cumsum), as a plain loop does: the same float as
    # ever (jobs that held no GPUs add 0)
    busy_j = float(np.cumsum(gpu_s * watts)[-1]) if len(t) else 0.0
    makespan = result.end_time - result.start_time
    idle_gpu_s = max(0.0, topo.total_gpus * makespan - result.failed_gpu_seconds - result.busy_gpu_seconds)
    idle_j = idle_gpu_s * idle_w
    return {"energy_busy_kwh": busy_j / 3.6e6, "energy_idle_kwh": idle_j / 3.6e6,
            "energy_kwh": (busy_j + idle_j) / 3.6e6}
