"""`loom place`: place one large pretraining job's ranks on a cluster.

Arnold (topology-aligned, MIP + local search) or a baseline placer, on an
empty or partially occupied cluster; prints the spreads and the rank → node
mapping, writes a hostfile and a picture on request. `--benchmark` runs Arnold
Table 1 settings × α × placers × occupancies (see loom/placement/arnold/benchmark.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from loom.cli.common import busy
from loom.cli.errors import user_errors
from loom.errors import LoomInputError

console = Console()
PLACER_NAMES = ("arnold", "best-fit", "random-fit", "gpu-packing", "topo-aware")


@user_errors
def place(
    cluster: Annotated[str, typer.Option(help="Cluster: a name or FORMAT:PATH.")] = "arnold-ii",
    dp: Annotated[int, typer.Option(help="Data-parallel degree.")] = 0,
    tp: Annotated[int, typer.Option(help="Tensor-parallel degree (within a node).")] = 8,
    pp: Annotated[int, typer.Option(help="Pipeline-parallel degree.")] = 1,
    placer: Annotated[str, typer.Option(help=f"One of {', '.join(PLACER_NAMES)}.")] = "arnold",
    alpha: Annotated[float | None, typer.Option(help="DP affinity α in [0, 1] (β = 1 − α).")] = None,
    model: Annotated[str | None, typer.Option(help="Model preset: α from the affinity database.")] = None,
    micro_batch: Annotated[int, typer.Option(help="Micro-batch (for the affinity ratios).")] = 1,
    gpu_type: Annotated[str | None, typer.Option(help="Only nodes of this GPU type.")] = None,
    occupancy: Annotated[float, typer.Option(help="Fraction of nodes busy before placing (0 = empty).")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed of the occupancy (and random-fit).")] = 0,
    time_limit: Annotated[float, typer.Option(help="MIP time limit, seconds.")] = 1.0,
    exact: Annotated[bool, typer.Option("--exact", help="Also solve Eq. 2 exactly (small jobs).")] = False,
    plot: Annotated[Path | None, typer.Option(help="Write a picture: .png, .svg or .html.")] = None,
    color_by: Annotated[str, typer.Option(help="Colour nodes by 'pp' or 'dp' group.")] = "pp",
    hostfile: Annotated[Path | None, typer.Option(help="Write an MPI/DeepSpeed hostfile in rank order.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    benchmark: Annotated[bool, typer.Option("--benchmark", help="Run Arnold Table 1 × α × placers.")] = False,
    out: Annotated[Path, typer.Option(help="Benchmark output directory.")] = Path("runs/place-benchmark"),
    occupancies: Annotated[int, typer.Option(help="Benchmark: random occupancies per setting.")] = 3,
) -> None:
    """Place a DP×TP×PP job so its DP and PP groups span few minipods (Arnold)."""
    if benchmark:
        _run_benchmark(out, occupancies, time_limit)
        return
    with busy(f"placing dp{dp}·tp{tp}·pp{pp} on {cluster} ({placer})…"):
        result = _place_one(cluster, dp, tp, pp, placer, alpha, model, micro_batch, gpu_type, occupancy, seed,
                            time_limit, exact)
    _emit(result, as_json, plot, color_by, hostfile)


def _place_one(cluster: str, dp: int, tp: int, pp: int, placer: str, alpha: float | None, model: str | None,
               micro_batch: int, gpu_type: str | None, occupancy: float, seed: int, time_limit: float,
               exact: bool) -> dict[str, Any]:
    from loom.hardware.clusters import load_cluster
    from loom.hardware.state import ClusterState
    from loom.placement.arnold.problem import JobShape, free_nodes, rank_nodes, score

    if placer not in PLACER_NAMES:
        raise LoomInputError(f"unknown placer '{placer}' (known: {', '.join(PLACER_NAMES)})", field="placer")
    if dp < 1:
        raise LoomInputError("give the data-parallel degree, e.g. --dp 24", field="dp")
    if not 0.0 <= occupancy < 1.0:
        raise LoomInputError(f"must be in [0, 1), got {occupancy}", field="occupancy")
    topology = load_cluster(cluster)
    per_node = _gpus_per_node(topology, gpu_type)
    shape = JobShape(dp, tp, pp, per_node)
    alpha, alpha_source = _alpha(alpha, model, topology, gpu_type, shape, micro_batch)
    state = ClusterState(topology)
    if occupancy > 0:
        from loom.placement.occupancy import occupy

        state = occupy(topology, occupancy, seed)
    free = free_nodes(state, gpu_type)
    info: dict[str, Any] = {"placer": placer, "alpha": alpha, "alpha_source": alpha_source}
    if placer == "arnold":
        from loom.placement.arnold.solver import arnold_place

        res = arnold_place(shape, topology, free, alpha, time_limit_s=time_limit, seed=seed)
        grid, info["optimal"], info["status"], info["solve_s"] = res.grid, res.optimal, res.status, res.solve_s
        info["unit"] = res.unit
    else:
        import time

        from loom.placement.arnold.baselines import baseline_grid
        from loom.placement.arnold.problem import check_capacity

        check_capacity(shape, free, topology)
        t0 = time.perf_counter()
        grid = baseline_grid(placer, shape, state, seed=seed)
        if grid is None:
            raise LoomInputError(f"{placer} found no {shape.nodes} whole free nodes", field="placer")
        info.update(optimal=False, status="baseline", solve_s=time.perf_counter() - t0)
    result = score(grid, topology, alpha)
    info.update(
        cluster=topology.name, dp=dp, tp=tp, pp=pp, nodes=shape.nodes, gpus=shape.gpus,
        dp_max_spread=result.dp_max_spread, pp_max_spread=result.pp_max_spread,
        weighted_spread=result.weighted_spread, dp_eq3=result.dp_eq3, pp_eq3=result.pp_eq3,
        minipods_used=result.minipods_used, leaves_used=result.leaves_used,
        occupancy=occupancy, seed=seed,
    )  # fmt: skip
    if exact:
        from loom.placement.arnold.exact import exact_place

        best = exact_place(shape, topology, free, alpha, time_limit_s=max(time_limit, 30.0))
        info["exact"] = {"weighted_spread": best.score.weighted_spread, "optimal": best.optimal,
                         "solve_s": best.solve_s}
    names = topology.node_names
    info["ranks"] = [names[n] for n in rank_nodes(grid, shape)]
    info["pp_group_spreads"] = _spreads(grid, topology, axis=1)
    info["dp_group_spreads"] = _spreads(grid, topology, axis=0)
    info["_grid"], info["_shape"], info["_topology"], info["_busy"] = grid, shape, topology, _busy(state)
    return info


def _gpus_per_node(topology: Any, gpu_type: str | None) -> int:
    import numpy as np

    counts = topology.node_gpus if gpu_type is None else topology.node_gpus[
        topology.node_type == (topology.type_id(gpu_type) if topology.type_id(gpu_type) is not None else -1)]
    if not len(counts):
        raise LoomInputError(f"the cluster has no {gpu_type} GPUs", field="gpu_type")
    return int(np.bincount(counts).argmax())


def _alpha(alpha: float | None, model: str | None, topology: Any, gpu_type: str | None, shape: Any,
           micro_batch: int) -> tuple[float, str]:
    if alpha is not None:
        if not 0.0 <= alpha <= 1.0:
            raise LoomInputError(f"must be in [0, 1], got {alpha}", field="alpha")
        return alpha, "given"
    if model is None:
        return 0.3, "default (no --alpha or --model)"
    from loom.perf import preset
    from loom.placement.arnold.affinity import affinity_for, ratios

    kind = gpu_type or topology.gpu_types[0]
    r1, r2 = ratios(preset(model), shape.tp, shape.pp, micro_batch)
    found, _, entry = affinity_for(kind, r1, r2)
    return found, f"affinity database: nearest profiled job '{getattr(entry, 'name', entry)}'"


def _spreads(grid: Any, topology: Any, axis: int) -> list[int]:
    pods = topology.switch_of[topology.minipod_tier][grid]
    groups = pods if axis == 1 else pods.T
    return [len(set(row.tolist())) for row in groups]


def _busy(state: Any) -> Any:
    return (state.free < state.topology.node_gpus) | state.failed


def _emit(info: dict[str, Any], as_json: bool, plot: Path | None, color_by: str, hostfile: Path | None) -> None:
    grid, shape, topology, busy = (info.pop(k) for k in ("_grid", "_shape", "_topology", "_busy"))
    if hostfile is not None:
        from loom.placement.arnold.problem import hostfile as hostfile_text

        hostfile.write_text(hostfile_text(grid, shape, topology))
    if plot is not None:
        from loom.placement.arnold.plot import plot_placement
        from loom.placement.arnold.problem import score

        plot_placement(grid, shape, topology, plot, color_by=color_by, busy=busy,
                       score=score(grid, topology, info["alpha"]),
                       title=f"{info['placer']}: dp{shape.dp}·tp{shape.tp}·pp{shape.pp} on {topology.name}")
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    table = Table(show_header=False, title=f"{info['placer']} on {info['cluster']}")
    for key in ("dp", "tp", "pp", "nodes", "alpha", "alpha_source", "dp_max_spread", "pp_max_spread",
                "weighted_spread", "minipods_used", "leaves_used", "solve_s", "optimal", "status"):
        value = info.get(key)
        table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
    if "exact" in info:
        table.add_row("exact optimum", f"{info['exact']['weighted_spread']:.3f} (proven: {info['exact']['optimal']})")
    console.print(table)
    first = info["ranks"][:: shape.gpus_per_node][:16]
    console.print(f"nodes in rank order (first {len(first)} of {shape.nodes}): {', '.join(first)}")
    if plot is not None:
        console.print(f"picture: {plot}")


def _run_benchmark(out: Path, occupancies: int, time_limit: float) -> None:
    from loom.placement.arnold.benchmark import run_table1

    out.mkdir(parents=True, exist_ok=True)
    summary = run_table1(out, occupancies=occupancies, time_limit_s=time_limit, progress=console)
    console.print(summary)


def register(app: typer.Typer) -> None:
    app.command("place")(place)
