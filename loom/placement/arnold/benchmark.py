"""Arnold Table 1 benchmark: settings (i)–(iii) × α × placers × occupancies.

Each instance: a named cluster (`arnold-i/ii/iii`), a fixed occupancy from
`loom.placement.occupancy.occupy(topology, fraction, seed)` (seeds 0..k−1),
the setting's job, one α. Every placer places the same job on the same free
nodes and is scored by Eq. 2 on its final rank → node mapping. The ratio
reported is best baseline / Arnold (> 1: Arnold's weighted max spread is lower).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loom.hardware.clusters import load_cluster
from loom.placement.arnold.problem import JobShape, free_nodes, score

SETTINGS = {  # name: (cluster, DP, TP, PP, busy fraction of nodes before placing)
    "i": ("arnold-i", 12, 4, 2, 0.25),
    "ii": ("arnold-ii", 24, 4, 8, 0.5),
    "iii": ("arnold-iii", 46, 8, 8, 0.5),
}
ALPHAS = (0.0, 0.3, 0.5, 0.7, 1.0)
BASELINES = ("best-fit", "random-fit", "gpu-packing", "topo-aware")


@dataclass(frozen=True, slots=True)
class Row:
    setting: str
    alpha: float
    seed: int
    placer: str
    dp_max_spread: int
    pp_max_spread: int
    weighted_spread: float
    solve_s: float
    optimal: bool


def instances(settings: tuple[str, ...], occupancies: int) -> Iterator[tuple[str, int, Any, Any, Any]]:
    from loom.placement.occupancy import occupy

    for name in settings:
        cluster, dp, tp, pp, busy = SETTINGS[name]
        topology = load_cluster(cluster)
        shape = JobShape(dp, tp, pp, int(topology.node_gpus.max()))
        for seed in range(occupancies):
            state = occupy(topology, busy, seed)
            yield name, seed, topology, shape, state


def run_instance(name: str, seed: int, topology: Any, shape: Any, state: Any, alpha: float,
                 time_limit_s: float) -> list[Row]:
    import time

    from loom.placement.arnold.baselines import baseline_grid
    from loom.placement.arnold.solver import arnold_place

    free = free_nodes(state)
    rows = []
    result = arnold_place(shape, topology, free, alpha, time_limit_s=time_limit_s, seed=seed)
    s = result.score
    rows.append(Row(name, alpha, seed, "arnold", s.dp_max_spread, s.pp_max_spread, s.weighted_spread,
                    result.solve_s, result.optimal))
    for placer in BASELINES:
        t0 = time.perf_counter()
        grid = baseline_grid(placer, shape, state, seed=seed)
        elapsed = time.perf_counter() - t0
        if grid is None:
            continue
        b = score(grid, topology, alpha)
        rows.append(Row(name, alpha, seed, placer, b.dp_max_spread, b.pp_max_spread, b.weighted_spread, elapsed,
                        False))
    return rows


def run_table1(out: Path | None = None, *, settings: tuple[str, ...] = ("i", "ii", "iii"), occupancies: int = 3,
               time_limit_s: float = 1.0, progress: Any = None) -> dict[str, Any]:
    """Run the grid; write rows.csv, table.md and figure.png into `out` if given."""
    rows: list[Row] = []
    for name, seed, topology, shape, state in instances(settings, occupancies):
        for alpha in ALPHAS:
            rows.extend(run_instance(name, seed, topology, shape, state, alpha, time_limit_s))
        if progress is not None:
            progress.print(f"setting ({name}) occupancy seed {seed}: done")
    summary = summarise(rows)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        _write(out, rows, summary)
    return summary


def summarise(rows: list[Row]) -> dict[str, Any]:
    """Mean weighted spread per (setting, α, placer) and best-baseline / Arnold ratios."""
    by_key: dict[tuple[str, float, str], list[float]] = {}
    for r in rows:
        by_key.setdefault((r.setting, r.alpha, r.placer), []).append(r.weighted_spread)
    ratios, worse = [], []
    per_instance: dict[tuple[str, float, int], dict[str, float]] = {}
    for r in rows:
        per_instance.setdefault((r.setting, r.alpha, r.seed), {})[r.placer] = r.weighted_spread
    for key, values in per_instance.items():
        base = min(v for p, v in values.items() if p != "arnold")
        arnold = values["arnold"]
        ratios.append(base / arnold if arnold > 0 else float("inf"))
        if arnold > base + 1e-9:
            worse.append({"setting": key[0], "alpha": key[1], "seed": key[2], "arnold": arnold, "best_baseline": base})
    means = {f"({s}) α={a} {p}": statistics.fmean(v) for (s, a, p), v in sorted(by_key.items())}
    return {
        "instances": len(per_instance),
        "mean_ratio": statistics.fmean(ratios) if ratios else float("nan"),
        "max_ratio": max(ratios) if ratios else float("nan"),
        "arnold_worse": worse,
        "means": means,
    }


def _write(out: Path, rows: list[Row], summary: dict[str, Any]) -> None:
    import csv
    import json

    with open(out / "rows.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(asdict(rows[0])))
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "table.md").write_text(markdown_table(rows))
    figure(rows, out / "figure.png")


def markdown_table(rows: list[Row]) -> str:
    placers = ("arnold", *BASELINES)
    cells: dict[tuple[str, float], dict[str, list[float]]] = {}
    for r in rows:
        cells.setdefault((r.setting, r.alpha), {}).setdefault(r.placer, []).append(r.weighted_spread)
    lines = ["| setting | α | " + " | ".join(placers) + " | best baseline / Arnold |",
             "| :--- | ---: | " + " | ".join("---:" for _ in placers) + " | ---: |"]
    for (setting, alpha), by_placer in sorted(cells.items()):
        means = {p: statistics.fmean(by_placer[p]) for p in placers if p in by_placer}
        best = min(v for p, v in means.items() if p != "arnold")
        ratio = best / means["arnold"] if means["arnold"] > 0 else float("inf")
        lines.append(f"| ({setting}) | {alpha:.1f} | " + " | ".join(f"{means.get(p, float('nan')):.2f}" for p in placers)
                     + f" | {ratio:.2f}× |")
    return "\n".join(lines) + "\n"


def figure(rows: list[Row], path: Path) -> None:
    """Grouped bars like Arnold Fig. 7: mean weighted max spread per α, one panel per setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    settings = sorted({r.setting for r in rows}, key=lambda s: len(s))
    placers = ("arnold", *BASELINES)
    fig, axes = plt.subplots(1, len(settings), figsize=(4.2 * len(settings), 3.2), squeeze=False)
    for ax, setting in zip(axes[0], settings, strict=True):
        for k, placer in enumerate(placers):
            means = [statistics.fmean([r.weighted_spread for r in rows
                                       if r.setting == setting and r.alpha == a and r.placer == placer] or [np.nan])
                     for a in ALPHAS]
            ax.bar(np.arange(len(ALPHAS)) + (k - 2) * 0.16, means, 0.16, label=placer)
        ax.set_xticks(range(len(ALPHAS)), [f"α={a}" for a in ALPHAS], fontsize=8)
        ax.set_title(f"setting ({setting})", fontsize=9)
        ax.set_ylabel("weighted max spread (minipods)", fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
