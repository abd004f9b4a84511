"""Average JCT of the scheduling policies on an Arena trace on arena-1280 (issue 7).

Estimator speeds with Arena's iterations/5 convention, best-fit placer.

    python bench/arena_policies.py arena-philly fcfs crius gavel sia elasticflow
"""
import time, sys
from loom.core.protocols import POLICIES, PLACERS
from loom.hardware.clusters import load_cluster
from loom.sim.engine import Simulation
from loom.sim.estimator_speed import EstimatorSpeed
from loom.workload.loaders import load_trace
from loom.report.metrics import summary
topo = load_cluster("arena-1280")
specs = list(load_trace(sys.argv[1]))
for name in sys.argv[2:]:
    t = time.perf_counter()
    r = Simulation(topo, specs, POLICIES.get(name)(), PLACERS.get("best-fit")(), EstimatorSpeed(iteration_scale=0.2), log_decisions=False).run()
    s = summary(r)
    print(f"{name}: finished {s['finished']}/{s['jobs']} avg JCT {s['avg_jct_s']:.0f} s makespan {s['makespan_s']:.0f} wall {time.perf_counter()-t:.1f} s", flush=True)
