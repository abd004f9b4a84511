"""`loom experiment FILE.yaml`: run a grid of simulations (local processes or Ray) and compare them.

When the grid varies the seed, the table shows per metric the mean ± 95% confidence
interval over the seeds (Student's t), or once that the seed changed nothing.
"""

from __future__ import annotations

import json

import math
import time
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.table import Column, Table

from loom.cli.common import use_plan_cache
from loom.cli.errors import err_console, user_errors

TABLE_METRICS = ("avg_jct_s", "p99_jct_s", "avg_queue_s", "gpu_utilization")
LABELS = {"avg_jct_s": "avg JCT", "p99_jct_s": "p99 JCT", "avg_queue_s": "avg queue", "gpu_utilization": "GPU util"}
NO_EFFECT_MARK, IDENTICAL_MARK = "†", "‡"

console = Console()


def register(app: typer.Typer) -> None:
    """Add `experiment` as a top-level command of `loom`."""

    @app.command()
    @user_errors
    def experiment(
        file: Path = typer.Argument(..., help="Experiment YAML: config fields plus a `grid:` of lists."),
        out: Path = typer.Option(None, "--out", "-o", help="Output directory (default: the file's outputs.dir, "
                                 "else runs/<file name>); each run goes to OUT/<run-name>/."),
        workers: int = typer.Option(None, "--workers", "-j", min=1,
                                    help="Parallel local processes (default: the number of CPUs)."),
        ray_address: str = typer.Option(None, "--ray-address", help="Run each grid point as a Ray task: "
                                        "'local' (start Ray here), 'auto' or ray://HOST:PORT. Needs `pip install "
                                        "ray`; remote workers need loom installed and a shared --out."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print the expanded grid and exit."),
        plan_cache: Path = typer.Option(None, "--plan-cache", help="SQLite file the runs share for plan "
                                        "searches' answers (the LOOM_PLAN_CACHE variable does the same)."),
        as_json: bool = typer.Option(False, "--json", help="Print experiment.json (the grid, every run's "
                                     "status, errors, seed statistics) on stdout and nothing else; the "
                                     "progress and tables go to stderr."),
    ) -> None:
        """Run the cartesian product of a grid of configs; write each run, summary.csv/.parquet and
        comparison.html. Seeds in the grid are summarised as mean ± 95% CI (summary_seeds.csv)."""
        from loom.experiment import import_ray, load_experiment, write_combined

        use_plan_cache(plan_cache)
        exp = load_experiment(file, out)
        if dry_run:
            _dry_run(exp, as_json)
            return
        if ray_address:
            import_ray()  # a clear error before anything runs
        results, wall = _run(exp, workers, ray_address)
        written = write_combined(exp, results, wall)
        show = err_console if as_json else console
        _print_results(file.name, exp, results, wall, show)
        show.print(f"outputs in [bold]{exp.out}[/]: {', '.join(written)} and one directory per run",
                   soft_wrap=True)
        if as_json:  # the file's text as written: valid JSON, nothing else on stdout
            typer.echo(written["experiment.json"].read_text(), nl=False)
        _report_failures(results)


def _dry_run(exp: Any, as_json: bool = False) -> None:
    """The expanded grid, invalid points (exit 1), and whether the seed can matter; with `--json`
    the grid as JSON on stdout (`runs`: name, values, valid, error) and the rest on stderr."""
    from loom.experiment import value_label

    points = exp.points
    invalid = [p for p in points if not p.valid]
    if as_json:
        typer.echo(json.dumps({"out": str(exp.out), "runs": [
            {"name": p.name, "values": p.values, "valid": p.valid, "error": p.error} for p in points]},
            indent=2, default=str))
        for p in invalid:
            err_console.print(f"[bold red]invalid:[/] {p.error}", highlight=False, soft_wrap=True)
        if invalid:
            raise typer.Exit(1)
        return
    table = Table(*(a.key for a in exp.axes), "status", title=f"{len(points)} runs → {exp.out}/<run>/ "
                  f"({len(invalid)} invalid)")
    table.add_column("run", overflow="fold")
    for p in points:
        table.add_row(*(value_label(v) for v in p.values.values()), "ok" if p.valid else "[red]invalid[/]", p.name)
    console.print(table)
    _static_seed_note(exp)
    for p in invalid:
        err_console.print(f"[bold red]invalid:[/] {p.error}", highlight=False, soft_wrap=True)
    if invalid:
        raise typer.Exit(1)


def _static_seed_note(exp: Any) -> None:
    """Before running: say so when the grid varies a seed that nothing in any run draws on."""
    from loom.experiment_seeds import NO_SEED_EFFECT, SEED_KEY, seed_uses

    seeds = next((a.values for a in exp.axes if a.key == SEED_KEY), ())
    valid = [p for p in exp.points if p.valid]
    if len(seeds) > 1 and valid and not any(seed_uses(p.config) for p in valid):
        console.print(f"note: {NO_SEED_EFFECT}: the {len(seeds)} seeds repeat the same runs", highlight=False,
                      soft_wrap=True)


def _run(exp: Any, workers: int | None, ray_address: str | None) -> tuple[list[Any], float]:
    """Run every valid point behind a progress bar on stderr; (results in grid order, wall seconds)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from loom.experiment import RunResult, run_points

    points = exp.points
    invalid = [p for p in points if not p.valid]
    for p in invalid:
        err_console.print(f"[bold red]invalid, skipped:[/] {p.error}", highlight=False, soft_wrap=True)
    where = f"Ray ({ray_address})" if ray_address else f"{workers or 'all'} local worker(s)"
    err_console.print(f"{len(points) - len(invalid)} of {len(points)} runs on {where} → {exp.out}", highlight=False)
    t0 = time.perf_counter()
    counts = {"ok": 0, "failed": 0}
    with Progress(TextColumn("[bold]runs"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("[green]{task.fields[ok]} ok[/] [red]{task.fields[failed]} failed[/]"),
                  TimeElapsedColumn(), console=err_console, transient=False) as bar:
        task = bar.add_task("runs", total=len(points), ok=0, failed=0)

        def on_result(res: RunResult) -> None:
            counts["ok" if res.ok else "failed"] += 1
            bar.update(task, advance=1, ok=counts["ok"], failed=counts["failed"])
            if res.status == "failed":
                bar.console.print(f"[bold red]failed:[/] {res.name}: {res.error}", highlight=False, soft_wrap=True)

        results = run_points(points, workers, ray_address, on_result)
    return results, time.perf_counter() - t0


def _report_failures(results: list[Any]) -> None:
    failed = [r for r in results if not r.ok]
    if failed:
        err_console.print(f"[bold red]{len(failed)} of {len(results)} runs did not succeed:[/]")
        for r in failed:
            err_console.print(f"  {r.name}: {r.error}", highlight=False, soft_wrap=True, markup=False)
        raise typer.Exit(1)


# ------------------------------------------------------------------ result tables
def _print_results(name: str, exp: Any, results: list[Any], wall: float, out: Console = console) -> None:
    from loom.experiment_seeds import seed_groups

    groups = seed_groups(exp, results)
    if not groups:
        out.print(_run_table(name, exp, results, wall))
        return
    out.print(_seed_table(name, exp, groups, len(results), wall))
    for note in _seed_notes(groups):
        out.print(note, highlight=False, soft_wrap=True)


def _scale(metric: str, values: list[float]) -> tuple[str, float]:
    """(unit, divisor) for a metric column: seconds as s/min/h by the column's largest value,
    GPU utilisation in %."""
    if metric == "gpu_utilization":
        return "%", 0.01
    if not metric.endswith("_s"):
        return "", 1.0
    top = max((abs(v) for v in values if math.isfinite(v)), default=0.0)
    return next(((unit, div) for unit, div in (("h", 3600.0), ("min", 60.0)) if top >= div), ("s", 1.0))


def _decimals(x: float) -> int:
    """About three significant digits, none below the unit for numbers ≥ 100."""
    return 0 if not math.isfinite(x) or abs(x) >= 100 else (1 if abs(x) >= 10 else 2)


def _cell(mean: float | None, half: float | None, div: float) -> str:
    if mean is None:
        return "—"
    d = _decimals(mean / div)
    text = f"{mean / div:,.{d}f}"
    return text if half is None else f"{text} ± {half / div:,.{d}f}"


def _header(metric: str, unit: str) -> Column:
    return Column(f"{LABELS.get(metric, metric)} {unit}".strip(), justify="right", no_wrap=True)


def _table(title: str, *columns: Column) -> Table:
    return Table(*columns, box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), show_edge=False, title=title)


def _run_table(name: str, exp: Any, results: list[Any], wall: float) -> Table:
    """One row per run (the grid does not vary the seed)."""
    from loom.experiment import value_label

    numbers = {m: [_number(r.summary.get(m)) for r in results] for m in TABLE_METRICS}
    scales = {m: _scale(m, [v for v in numbers[m] if v is not None]) for m in TABLE_METRICS}
    table = _table(f"experiment {name}: {len(results)} runs in {wall:.1f} s",
                   *(Column(a.key, no_wrap=True) for a in exp.axes), Column("status"),
                   *(_header(m, scales[m][0]) for m in TABLE_METRICS))
    for i, r in enumerate(results):
        cells = [_cell(numbers[m][i], None, scales[m][1]) for m in TABLE_METRICS]
        table.add_row(*(value_label(v) for v in r.values.values()), "ok" if r.ok else f"[red]{r.status}[/]", *cells)
    return table


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _seed_table(name: str, exp: Any, groups: list[Any], runs: int, wall: float) -> Table:
    """One row per combination of the other grid values: n seeds and mean ± 95% CI per metric."""
    from loom.experiment import value_label
    from loom.experiment_seeds import SEED_KEY

    marks = {"none": NO_EFFECT_MARK, "identical": IDENTICAL_MARK}
    mixed = len({g.effect for g in groups}) > 1
    scales = {m: _scale(m, [g.stats[m][0] for g in groups if m in g.stats]) for m in TABLE_METRICS}
    keys = [a.key for a in exp.axes if a.key != SEED_KEY]
    table = _table(f"experiment {name}: {runs} runs in {wall:.1f} s", *(Column(k, no_wrap=True) for k in keys),
                   Column("seeds", justify="right"), *(_header(m, scales[m][0]) for m in TABLE_METRICS))
    for g in groups:
        n = f"{len(g.seeds)}{marks.get(g.effect, '') if mixed else ''}"
        cells = [_cell(*g.stats.get(m, (None, None)), scales[m][1]) for m in TABLE_METRICS]
        table.add_row(*(value_label(g.values[k]) for k in keys), n, *cells)
    return table


def _seed_notes(groups: list[Any]) -> list[str]:
    """What the seeds did, said once: a spread (the interval), nothing (no random component),
    nothing although something draws on them, or too few successful runs for an interval."""
    from loom.experiment_seeds import NO_SEED_EFFECT

    effects = {g.effect for g in groups}
    prefix = (lambda mark: f"{mark} ") if len(effects) > 1 else (lambda mark: "")
    notes = ["mean ± 95% confidence interval over the seeds (Student's t)"] if "varies" in effects else []
    if "none" in effects:
        notes.append(f"{prefix(NO_EFFECT_MARK)}{NO_SEED_EFFECT}: identical results, shown once")
    if "identical" in effects:
        uses = sorted({u for g in groups if g.effect == "identical" for u in g.uses})
        notes.append(f"{prefix(IDENTICAL_MARK)}the seeds gave identical results, although the seed reaches "
                     f"{', '.join(uses)}: shown once")
    if "single" in effects:
        notes.append("rows with fewer than 2 successful seeds have no interval")
    return notes
