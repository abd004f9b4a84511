"""Topology-aligned placement, Arnold (issue 5): quality, optimality, latency, end-to-end gain.

Sections (default: all; pick any with flags):

  --quality     Arnold Table 1 (`benchmark.run_table1`): settings (i)-(iii) x alpha x
                placers over K occupancies; best-baseline / Arnold ratios, every
                instance where Arnold is worse; copies figure.png to docs/img/arnold-table1.png
  --optimality  `arnold_place` vs `exact_place` (CP-SAT on Eq. 2, 30 s) on setting (i)
                and small setting-(ii) jobs, occupancy seeds 0..9 x alpha in {0,.3,.5,.7,1}
  --latency     solve time of setting (iii), of a 1,200-node job on a 2,048-node Clos,
                a curve over job sizes beside the exact solver (60 s limit);
                writes docs/img/arnold-latency.png
  --e2e         iteration-time gain of Arnold over best-fit priced by the estimator
                (arnold-24b-dense / -moe on H800, 208 and 9,600 GPUs, busy clusters)

Markdown tables go to stdout (pasteable into docs/BENCHMARKS.md); progress to stderr.

    PYTHONPATH=. python bench/placement.py [--quality] [--optimality] [--latency] [--e2e]
                                           [--occupancies 5] [--repeat 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from benchinfo import machine as _machine

from loom.errors import LoomInputError
from loom.hardware.clos import clos
from loom.hardware.clusters import load_cluster
from loom.placement.arnold.baselines import baseline_grid
from loom.placement.arnold.exact import exact_place
from loom.placement.arnold.problem import JobShape, free_nodes, score
from loom.placement.arnold.solver import arnold_place
from loom.placement.occupancy import occupy

ROOT = Path(__file__).resolve().parents[1]
IMG = ROOT / "docs" / "img"
ALPHAS = (0.0, 0.3, 0.5, 0.7, 1.0)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def table(header: list[str], rows: list[list[object]], align: str = "") -> None:
    align = align or "l" + "r" * (len(header) - 1)
    print("| " + " | ".join(header) + " |")
    print("| " + " | ".join(":---" if a == "l" else "---:" for a in align) + " |")
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")
    print()


def machine() -> str:
    return f"Machine: {_machine()}, no GPU."


# -- 1. quality: Table 1 ------------------------------------------------------------
def quality(occupancies: int, out: Path) -> None:
    from loom.placement.arnold.benchmark import SETTINGS, run_table1

    log(f"quality: run_table1(settings=(i, ii, iii), occupancies={occupancies}, time_limit_s=1.0) -> {out}")
    t0 = time.perf_counter()
    summary = run_table1(out, settings=("i", "ii", "iii"), occupancies=occupancies, time_limit_s=1.0)
    wall = time.perf_counter() - t0
    print(f"#### 1. Quality: Arnold Table 1 ({occupancies} occupancies per setting, wall {wall:.0f} s)\n")
    print("Settings (cluster, DP·TP·PP, busy fraction): "
          + "; ".join(f"({k}) {v[0]}, {v[1]}·{v[2]}·{v[3]}, {v[4]}" for k, v in SETTINGS.items()) + ".\n")
    print("Mean weighted max spread (α·DP + β·PP, minipods) per setting × α × placer:\n")
    print((out / "table.md").read_text())
    # per-setting ratio of means and instance ratios
    import csv

    with open(out / "rows.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    inst: dict[tuple[str, str, str], dict[str, float]] = {}
    for r in rows:
        inst.setdefault((r["setting"], r["alpha"], r["seed"]), {})[r["placer"]] = float(r["weighted_spread"])
    per_setting: dict[str, list[float]] = {}
    for (s, _, _), v in inst.items():
        base = min(x for p, x in v.items() if p != "arnold")
        per_setting.setdefault(s, []).append(base / v["arnold"])
    table(["setting", "instances", "mean ratio", "max ratio", "min ratio", "instances ≥ 1.67×"],
          [[f"({s})", len(v), f"{statistics.fmean(v):.3f}×", f"{max(v):.2f}×", f"{min(v):.2f}×",
            sum(x >= 1.67 - 1e-9 for x in v)] for s, v in sorted(per_setting.items())])
    print(f"All {summary['instances']} instances: mean ratio (best baseline / Arnold) "
          f"**{summary['mean_ratio']:.3f}×**, max **{summary['max_ratio']:.2f}×**; Arnold worse than the best "
          f"baseline in **{len(summary['arnold_worse'])}** instance(s).\n")
    if summary["arnold_worse"]:
        table(["setting", "α", "seed", "Arnold", "best baseline"],
              [[f"({w['setting']})", w["alpha"], w["seed"], w["arnold"], w["best_baseline"]]
               for w in summary["arnold_worse"]])
    IMG.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(out / "figure.png", IMG / "arnold-table1.png")
    log(f"copied {out / 'figure.png'} -> {IMG / 'arnold-table1.png'}")


# -- 2. optimality vs exact -----------------------------------------------------------
OPT_CASES = (  # cluster, DP, TP, PP, busy fraction
    ("arnold-i", 12, 4, 2, 0.25),
    ("arnold-ii", 8, 4, 2, 0.5),
    ("arnold-ii", 12, 4, 2, 0.5),
    ("arnold-ii", 16, 4, 2, 0.5),
    # harder: ~44 free nodes over 5 minipods, so these jobs must span minipods
    ("arnold-ii", 16, 4, 2, 0.9),
    ("arnold-ii", 24, 4, 2, 0.9),
    ("arnold-ii", 32, 4, 2, 0.9),
    ("arnold-ii", 8, 4, 8, 0.9),  # PP 8: longer PP groups
    ("arnold-ii", 24, 4, 8, 0.5),  # the full setting-(ii) job, 96 nodes
    ("arnold-ii", 24, 4, 8, 0.7),
)


def optimality(seeds: int) -> None:
    print(f"#### 2. Optimality: `arnold_place` (1 s) vs `exact_place` (CP-SAT on Eq. 2, 30 s), "
          f"seeds 0..{seeds - 1} × α ∈ {{{', '.join(str(a) for a in ALPHAS)}}}\n")
    out, worse = [], []
    for cluster, dp, tp, pp, busy in OPT_CASES:
        topo = load_cluster(cluster)
        shape = JobShape(dp, tp, pp, 8)
        n = eq = bad = unproved = 0
        a_t, e_t, a_mean, e_mean = [], [], [], []
        for seed in range(seeds):
            free = free_nodes(occupy(topo, busy, seed))
            for alpha in ALPHAS:
                a = arnold_place(shape, topo, free, alpha, time_limit_s=1.0, seed=seed)
                e = exact_place(shape, topo, free, alpha, time_limit_s=30.0, seed=seed)
                a_t.append(a.solve_s)
                e_t.append(e.solve_s)
                if not e.optimal:
                    unproved += 1
                    continue
                n += 1
                av, ev = a.score.weighted_spread, e.score.weighted_spread
                a_mean.append(av)
                e_mean.append(ev)
                if av <= ev + 1e-9:
                    eq += 1
                else:
                    bad += 1
                    worse.append([cluster, f"{dp}·{tp}·{pp}", busy, seed, alpha,
                                  f"{av:.2f} ({a.score.dp_max_spread}/{a.score.pp_max_spread})",
                                  f"{ev:.2f} ({e.score.dp_max_spread}/{e.score.pp_max_spread})"])
        log(f"optimality {cluster} {dp}x{tp}x{pp} busy {busy}: {eq}/{n} equal, {bad} worse, {unproved} unproved")
        out.append([cluster, f"{dp}·{tp}·{pp}", shape.nodes, busy, n, eq, bad, unproved,
                    f"{statistics.fmean(a_mean) if a_mean else float('nan'):.2f}",
                    f"{statistics.fmean(e_mean) if e_mean else float('nan'):.2f}",
                    f"{statistics.median(a_t):.3f}", f"{statistics.median(e_t):.3f} / {max(e_t):.2f}"])
    table(["cluster", "DP·TP·PP", "nodes", "busy", "proved", "Arnold = optimum", "Arnold worse", "exact unproved",
           "mean Arnold", "mean optimum", "Arnold median s", "exact median / max s"], out, "lrrrrrrrrrrr")
    total = sum(r[4] for r in out)
    print(f"Total: Arnold equals the proven optimum in **{sum(r[5] for r in out)}/{total}** instances, "
          f"worse in **{sum(r[6] for r in out)}**; exact did not prove optimality in {sum(r[7] for r in out)}.\n")
    if worse:
        table(["cluster", "DP·TP·PP", "busy", "seed", "α", "Arnold (DP/PP spread)", "optimum (DP/PP spread)"],
              worse, "llrrrll")


# -- 3. latency ---------------------------------------------------------------------
def timed(fn, repeat: int) -> tuple[float, float, object]:
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), max(times), result


def latency(repeat: int) -> None:
    print(f"#### 3. Latency (`arnold_place`, time limit 1 s, median of {repeat} after one warm-up call)\n")
    topo_iii = load_cluster("arnold-iii")
    shape_iii = JobShape(46, 8, 8, 8)
    free0 = free_nodes(occupy(topo_iii, 0.0, 0))
    t0 = time.perf_counter()
    arnold_place(shape_iii, topo_iii, free0, 0.3, time_limit_s=1.0)  # cold: OR-Tools import + first model
    cold = time.perf_counter() - t0
    print(f"Cold first call in this process (setting (iii), occupancy 0, α 0.3; includes importing OR-Tools): "
          f"**{cold:.2f} s**.\n")
    big = clos("big", minipods=16, nodes=2048)
    cases = [("setting (iii): arnold-iii, DP 46 TP 8 PP 8", topo_iii, shape_iii, occ, 1.0) for occ in (0.0, 0.3)]
    cases += [("clos big (16 minipods, 2,048 nodes): DP 150 TP 8 PP 8", big, JobShape(150, 8, 8, 8), occ, 2.0)
              for occ in (0.0, 0.3)]
    rows = []
    for label, topo, shape, occ, floor in cases:
        free = free_nodes(occupy(topo, occ, 0))
        for alpha in (0.0, 0.3, 0.5, 1.0):
            med, worst, res = timed(lambda sh=shape, t=topo, f=free, a=alpha: arnold_place(sh, t, f, a, time_limit_s=1.0),
                                    repeat)
            s = res.score
            rows.append([label, shape.nodes, occ, alpha, f"{med:.3f}", f"{worst:.3f}", f"≤ {floor:g} s",
                         "yes" if med <= floor else "**no**", f"{s.dp_max_spread}/{s.pp_max_spread}",
                         res.status.split(";")[0]])
            log(f"latency {label} occ {occ} α {alpha}: {med:.3f} s")
    table(["instance", "nodes", "busy", "α", "median s", "max s", "floor", "met", "DP/PP spread", "CP-SAT status"],
          rows, "lrrrrrrlll")

    # curve vs job size on the 2,048-node cluster (busy 0.3), exact beside it
    free_big = free_nodes(occupy(big, 0.3, 0))
    curve, ex_rows = [], []
    sizes = (16, 32, 64, 128, 256, 512, 1024)
    for nodes in sizes:
        shape = JobShape(nodes // 8, 8, 8, 8)  # rows = DP·TP/8 = DP, cols = PP = 8
        med, worst, res = timed(lambda sh=shape: arnold_place(sh, big, free_big, 0.3, time_limit_s=1.0), repeat)
        curve.append((nodes, med))
        log(f"curve {nodes} nodes: {med:.3f} s")
        ex = None
        if nodes <= 512:
            t1 = time.perf_counter()
            e = exact_place(shape, big, free_big, 0.3, time_limit_s=60.0)
            ex = (time.perf_counter() - t1, e.optimal, e.score.weighted_spread)
            log(f"  exact: {ex[0]:.2f} s optimal={ex[1]}")
        ex_rows.append(("clos big, busy 0.3", shape, med, worst, res.score.weighted_spread, ex))
    for cluster, dp, tp, pp, busy in (("arnold-i", 12, 4, 2, 0.25), ("arnold-ii", 8, 4, 2, 0.9),
                                      ("arnold-ii", 32, 4, 2, 0.9), ("arnold-ii", 24, 4, 8, 0.5),
                                      ("arnold-ii", 24, 4, 8, 0.7)):
        topo = load_cluster(cluster)
        shape = JobShape(dp, tp, pp, 8)
        free = free_nodes(occupy(topo, busy, 0))
        if len(free) < shape.nodes:
            continue
        med, worst, res = timed(lambda sh=shape, t=topo, f=free: arnold_place(sh, t, f, 0.3, time_limit_s=1.0), repeat)
        t1 = time.perf_counter()
        e = exact_place(shape, topo, free, 0.3, time_limit_s=60.0)
        ex_rows.append((f"{cluster}, busy {busy}", shape, med, worst, res.score.weighted_spread,
                        (time.perf_counter() - t1, e.optimal, e.score.weighted_spread)))
        log(f"exact {cluster} {shape.nodes} nodes: {ex_rows[-1][-1][0]:.2f} s")
    print("Solve time vs job size (α 0.3, TP 8 PP 8 on the 2,048-node Clos; Arnold's Fig. 8), "
          "with the exact CP-SAT model of Eq. 2 (60 s limit, one run):\n")
    table(["cluster", "DP·TP·PP", "nodes", "Arnold median s", "Arnold max s", "Arnold spread", "exact s",
           "exact status", "exact spread"],
          [[c, f"{s.dp}·{s.tp}·{s.pp}", s.nodes, f"{m:.3f}", f"{w:.3f}", f"{sc:.2f}",
            "–" if ex is None else f"{ex[0]:.2f}", "not run" if ex is None else ("optimal" if ex[1] else "**time limit**"),
            "–" if ex is None else f"{ex[2]:.2f}"] for c, s, m, w, sc, ex in ex_rows], "llrrrrrlr")
    figure_latency(ex_rows, IMG / "arnold-latency.png")


def figure_latency(ex_rows: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    big = [(s.nodes, m, ex) for c, s, m, w, sc, ex in ex_rows if c.startswith("clos")]
    small = [(s.nodes, m, ex, c) for c, s, m, w, sc, ex in ex_rows if not c.startswith("clos")]
    ax.plot([b[0] for b in big], [b[1] for b in big], "o-", label="Arnold MIP + local search (2,048 nodes)")
    ex_big = [(b[0], b[2][0], b[2][1]) for b in big if b[2] is not None]
    ax.plot([e[0] for e in ex_big], [e[1] for e in ex_big], "s--", label="exact CP-SAT, Eq. 2 (2,048 nodes)")
    ax.plot([s[0] for s in small], [s[1] for s in small], "^", label="Arnold (arnold-i / -ii)")
    ax.plot([s[0] for s in small], [s[2][0] for s in small], "x", ms=8, label="exact (arnold-i / -ii)")
    for n, t, opt in ex_big + [(s[0], s[2][0], s[2][1]) for s in small]:
        if not opt:
            ax.annotate("time limit", (n, t), fontsize=7)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.axhline(2.0, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("job size (nodes)")
    ax.set_ylabel("solve time (s)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    log(f"wrote {path}")


# -- 4. end-to-end gain with the estimator --------------------------------------------
def e2e(seeds: int) -> None:
    from loom.core.plan import ParallelPlan
    from loom.perf import preset
    from loom.perf.estimator import default_estimator
    from loom.perf.inputs import Hardware, Placement, TrainingJob
    from loom.perf.search import Choices, search_plans
    from loom.placement.arnold.affinity import affinity_for, ratios

    print("#### 4. End-to-end: estimator iteration time, Arnold vs best-fit (H800)\n")
    hw = Hardware("H800")
    est = default_estimator()
    big = clos("big", minipods=16, nodes=2048)
    ii = load_cluster("arnold-ii")
    # 1,200 of 2,048 nodes cannot fit at busy 0.5 (1,024 free): 0.4 (1,229 free) and 0.3
    scenarios = [("arnold-ii", ii, 26, 0.5, 26 * 40), ("arnold-ii", ii, 26, 0.7, 26 * 40),
                 ("clos big 2,048", big, 1200, 0.4, 1200 * 8), ("clos big 2,048", big, 1200, 0.3, 1200 * 8)]
    rows, notes = [], []
    for model in ("arnold-24b-dense", "arnold-24b-moe"):
        spec = preset(model)
        for cname, topo, nodes, busy, gb in scenarios:
            gpus = nodes * 8
            job = TrainingJob(spec, gb)
            plans = []
            best = search_plans(job, hw, gpus, choices=Choices(tp=8, vpp=1), top=1).best
            if best is not None:
                plans.append(("search (tp 8)", best.plan))
            for pp in (2, 4):
                if nodes % pp == 0 and spec.layers % pp == 0:
                    dp = gpus // 8 // pp
                    plans.append(("fixed", ParallelPlan(dp=dp, tp=8, pp=pp, micro_batch=1,
                                                         zero_stage=1, recompute="selective")))
            for how, plan in plans:
                shape = JobShape(plan.dp, plan.tp, plan.pp, 8)
                r1, r2 = ratios(spec, plan.tp, plan.pp, plan.micro_batch, 2, 2)
                alpha, _, entry = affinity_for("H800", r1, r2)
                ta, tb, sa, sb = [], [], [], []
                fits = est.estimate(job, hw, plan, Placement()).feasible
                for seed in range(seeds):
                    state = occupy(topo, busy, seed)
                    free = free_nodes(state)
                    a = arnold_place(shape, topo, free, alpha, time_limit_s=1.0, seed=seed).score
                    grid = baseline_grid("best-fit", shape, state, seed=seed)
                    if grid is None:
                        continue
                    b = score(grid, topo, alpha)
                    for s, acc, sp in ((a, ta, sa), (b, tb, sb)):
                        pl = Placement(dp_minipods=s.dp_max_spread, pp_minipods=s.pp_max_spread)
                        try:
                            acc.append(est.estimate(job, hw, plan, pl).iteration_s)
                        except LoomInputError as exc:  # plan invalid for this job (e.g. layers % pp)
                            notes.append(f"{model} {plan}: {exc}")
                            break
                        sp.append((s.dp_max_spread, s.pp_max_spread))
                if not ta or not tb or len(ta) != len(tb):
                    continue
                gains = [b_ / a_ - 1 for a_, b_ in zip(ta, tb)]
                pk = est.estimate(job, hw, plan, Placement()).iteration_s
                rows.append([model, f"{gpus:,} ({cname}, busy {busy})", how,
                             f"dp{plan.dp} tp{plan.tp} pp{plan.pp} mb{plan.micro_batch}" + ("" if fits else " (OOM)"),
                             f"{alpha:.2f} ({entry.name})",
                             _spreads(sa), _spreads(sb), f"{pk:.3f}", f"{statistics.fmean(ta):.3f}",
                             f"{statistics.fmean(tb):.3f}", f"{100 * statistics.fmean(gains):+.2f}%",
                             f"{100 * max(gains):+.2f}%", f"{100 * (statistics.fmean(tb) / pk - 1):+.2f}%"])
                log(f"e2e {model} {gpus} {how}: gain {100 * statistics.fmean(gains):+.2f}%")
    print(f"Global batch 40 sequences per node at 208 GPUs (1,040) and 8 per node at 9,600 GPUs (9,600); "
          f"bf16; α from `affinity_for('H800', *ratios(model, tp, pp, mb, 2, 2))`; occupancy seeds 0..{seeds - 1}; "
          f"`Placement(dp_minipods=DP max spread, pp_minipods=PP max spread)`.\n")
    table(["model", "GPUs", "plan from", "plan", "α", "Arnold DP/PP spread", "best-fit DP/PP spread",
           "packed s", "Arnold s", "best-fit s", "mean gain", "max gain", "best-fit / packed − 1"], rows,
          "lllllllrrrrrr")
    for n in sorted(set(notes))[:5]:
        print(f"- skipped: {n}")


def _spreads(pairs: list[tuple[int, int]]) -> str:
    d = [p[0] for p in pairs]
    q = [p[1] for p in pairs]
    rng = lambda v: f"{min(v)}" if min(v) == max(v) else f"{min(v)}–{max(v)}"
    return f"{rng(d)}/{rng(q)}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag in ("quality", "optimality", "latency", "e2e"):
        p.add_argument(f"--{flag}", action="store_true")
    p.add_argument("--occupancies", type=int, default=5, help="occupancy seeds per setting for --quality")
    p.add_argument("--seeds", type=int, default=10, help="occupancy seeds for --optimality")
    p.add_argument("--e2e-seeds", type=int, default=5)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", type=Path, default=None, help="run_table1 output dir (default: a temp dir)")
    args = p.parse_args(argv)
    chosen = [f for f in ("quality", "optimality", "latency", "e2e") if getattr(args, f)] or \
        ["quality", "optimality", "latency", "e2e"]
    print(f"Date: {datetime.now(UTC).isoformat(timespec='seconds')}. " + machine() + "\n")
    print(f"Command: `PYTHONPATH=. python bench/placement.py {' '.join(sys.argv[1:])}`\n")
    t0 = time.perf_counter()
    if "latency" in chosen:  # first, so the cold call is really the first in the process
        latency(args.repeat)
    if "quality" in chosen:
        quality(args.occupancies, args.out or Path(tempfile.mkdtemp(prefix="arnold-table1-")))
    if "optimality" in chosen:
        optimality(args.seeds)
    if "e2e" in chosen:
        e2e(args.e2e_seeds)
    print(f"Wall time {time.perf_counter() - t0:.0f} s.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
