"""Plan search: the full search (`search_plans`) vs branch and bound (`fastest_plan`).

    PYTHONPATH=. python bench/plan_search.py [--cases 500] [--seed 2]

Random (preset, GPU type, GPU count, batch, GPUs per node, pinned knobs) cases
(`--models` restricts the presets, e.g. to an older checkout's, so that both time the same cases),
each searched cold (a fresh `Estimator`, as a simulation meets a new shape) by
both; the answers must be the same plan and time (and, when nothing fits, the
fastest plan ignoring memory, as the speed model falls back to). Prints seconds
per side, the speed-up, and how many plans each priced.
"""

from __future__ import annotations

import argparse
import random
import time

from loom.perf.estimator import Estimator
from loom.perf.inputs import Hardware, estimator_job
from loom.perf.presets import preset_names
from loom.perf.search import Choices, candidate_plans, fastest_plan, search_plans

GPU_TYPES = ("A100-40GB", "V100", "A40", "P100", "H100", "A10")
COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64)
CHOICES = (Choices(vpp=1), Choices(), Choices(tp=1, pp=1, vpp=1))


class Counting(Estimator):
    priced = 0

    def price(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        Counting.priced += 1
        return super().price(*args, **kwargs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", type=int, default=500)
    p.add_argument("--seed", type=int, default=2)
    p.add_argument("--models", default="", help="comma-separated presets (default: every preset); e.g. the "
                   "presets of an older checkout, to time the same cases on both")
    args = p.parse_args()
    rng = random.Random(args.seed)
    models = args.models.split(",") if args.models else preset_names()
    cases = [(m, t, g, rng.choice([32, 128, 256, 512, 1000])) for m in models for t in GPU_TYPES
             for g in COUNTS]
    rng.shuffle(cases)
    full_s = fast_s = 0.0
    full_priced = fast_priced = searches = no_fit = 0
    for model, gpu_type, gpus, batch in cases[:args.cases]:
        job, _ = estimator_job(model, batch, gpus)
        for per_node in (4, 8):
            hardware = Hardware(gpu_type, gpus_per_node=per_node)
            for choices in CHOICES:
                searches += 1
                Counting.priced = 0
                start = time.perf_counter()
                est = Counting()
                best = search_plans(job, hardware, gpus, choices=choices, top=1, estimator=est).best
                if best is None:
                    no_fit += 1
                    best = min((est.estimate(job, hardware, plan) for plan in
                                candidate_plans(job, hardware, gpus, choices)), key=lambda e: e.iteration_s,
                               default=None)
                full_s += time.perf_counter() - start
                full_priced += Counting.priced
                Counting.priced = 0
                start = time.perf_counter()
                fast = fastest_plan(job, hardware, gpus, choices=choices, estimator=Counting(), or_unfit=True)
                fast_s += time.perf_counter() - start
                fast_priced += Counting.priced
                if (best is None) != (fast is None) or (best is not None and (best.plan, best.iteration_s)
                                                         != (fast.plan, fast.iteration_s)):  # type: ignore[union-attr]
                    raise SystemExit(f"different answers for {model} on {gpus} × {gpu_type} ({choices})")
    print(f"{searches} searches ({no_fit} with no plan fitting in memory), same answers")
    print(f"search_plans: {full_s:.2f} s, {full_priced:,} plans priced")
    print(f"fastest_plan: {fast_s:.2f} s, {fast_priced:,} plans priced")
    print(f"speed-up: {full_s / fast_s:.2f}×")


if __name__ == "__main__":
    main()
