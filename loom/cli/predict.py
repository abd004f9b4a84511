"""`loom predict ...`: train and evaluate the JCT predictor (paper, App. G)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from loom.cli.errors import err_console, user_errors
from loom.errors import LoomInputError

app = typer.Typer(help="Train and evaluate the JCT predictor (LightGBM over submit-time metadata).",
                  no_args_is_help=True)
console = Console()

# RMSE: of the expected bin; RMSE pt: of the point bin (argmax / median); ±1: point within one bin;
# ≤p50 / ≤p90: share of jobs ending by the predicted quantile (calibrated: 50 % / 90 %)
_COLUMNS = [("rmse_bins", "RMSE", "{:.2f}"), ("rmse_bins_point", "RMSE pt", "{:.2f}"),
            ("acc", "acc", "{:.1%}"), ("within1", "±1", "{:.1%}"), ("mae_p50_s", "MAE p50 s", "{:,.0f}"),
            ("cov_p50", "≤p50", "{:.1%}"), ("cov_p90", "≤p90", "{:.1%}"), ("train_s", "fit s", "{:.1f}")]


def _check_mode(mode: str) -> str:
    from loom.predict.model import MODES

    if mode not in MODES:
        raise LoomInputError(f"unknown mode '{mode}': use one of {', '.join(MODES)}", field="mode")
    return mode


@contextmanager
def _phases() -> Iterator[Callable[[str, int, int], None]]:
    """A progress bar on stderr; the callback `(phase, done, total)` starts a bar per new phase
    (finishing the previous one) and advances it; total 0 is an open-ended phase."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=err_console, transient=True) as bar:
        tasks: dict[str, Any] = {}

        def report(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                for task in tasks.values():
                    bar.update(task, completed=bar.tasks[task].total or 1, total=bar.tasks[task].total or 1)
                tasks[phase] = bar.add_task(phase, total=total or None)
            bar.update(tasks[phase], completed=done)

        yield report


def _load(trace: str, cache: bool, report: Callable[[str, int, int], None] | None = None) -> Any:
    from loom.workload.loaders import load_trace

    if report is not None:
        report(f"loading trace {trace}", 0, 0)
    return load_trace(trace, cache=cache)


@app.command("train")
@user_errors
def train(trace: str = typer.Option(..., "--trace", help="A named trace or FORMAT:PATH."),
          out: Path = typer.Option(..., "--out", "-o", help="Model file to write (JSON)."),
          mode: str = typer.Option("classify", "--mode", help="classify (10-minute bins) or regress (log duration)."),
          train_frac: float = typer.Option(0.7, "--train-frac", help="Train on this first share of the trace "
                                           "(by submit time); 1.0 = the whole trace."),
          bags: int = typer.Option(5, "--bags", help="Bootstrap models (uncertainty)."),
          seed: int = typer.Option(0, "--seed", help="Random seed."),
          cache: bool = typer.Option(True, "--cache/--no-cache", help="Use the Parquet trace cache.")) -> None:
    """Train a bagged LightGBM predictor on the first part of a trace and save it."""
    from loom.predict.evaluate import time_split
    from loom.predict.features import training_jobs
    from loom.predict.model import JctPredictor

    _check_mode(mode)
    if bags < 1:
        raise LoomInputError("--bags must be ≥ 1", field="bags")
    with _phases() as report:
        jobs = _load(trace, cache, report)
        specs = jobs if train_frac >= 1.0 else time_split(jobs, train_frac).train
        model = JctPredictor(mode=mode, n_bags=bags, seed=seed).fit(specs, progress=report)
        report(f"writing {out}", 0, 0)
        model.save(out)
    removed = sum(1 for s in specs if s.duration is not None) - len(training_jobs(specs))
    console.print(f"trained {mode} predictor on {model.n_train} jobs of {trace} "
                  f"({removed} killed early removed); wrote {out}", highlight=False)


@app.command("eval")
@user_errors
def evaluate(trace: str = typer.Option(..., "--trace", help="A named trace or FORMAT:PATH."),
             model: Path = typer.Option(None, "--model", "-m", help="A model from `loom predict train` "
                                        "(default: train one per --mode on the train split). Train it "
                                        "with the same --train-frac, or it has seen the test part."),
             mode: list[str] = typer.Option(["classify"], "--mode", help="Modes to train when no --model "
                                            "(repeatable)."),
             train_frac: float = typer.Option(0.7, "--train-frac", help="Share of the trace (by submit time) "
                                              "before the test part."),
             bags: int = typer.Option(5, "--bags", help="Bootstrap models when training."),
             seed: int = typer.Option(0, "--seed", help="Random seed."),
             as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
             cache: bool = typer.Option(True, "--cache/--no-cache", help="Use the Parquet trace cache.")) -> None:
    """Evaluate on the test part of a trace (time-ordered split), next to the recent-history baseline."""
    from loom.predict.evaluate import evaluate_specs
    from loom.predict.model import JctPredictor

    for m in mode:
        _check_mode(m)
    if bags < 1:
        raise LoomInputError("--bags must be ≥ 1", field="bags")
    with _phases() as report:
        if model is not None:
            report(f"loading model {model}", 0, 0)
        loaded = JctPredictor.load(model) if model is not None else None
        res = evaluate_specs(_load(trace, cache, report), modes=mode, train_frac=train_frac, seed=seed,
                             n_bags=bags, model=loaded, progress=report)
    res["trace"] = trace
    if as_json:
        typer.echo(json.dumps(res, indent=2))
        return
    console.print(f"[bold]{trace}[/]: train {res['train_jobs']} jobs ({res['removed_killed_early']} killed early "
                  f"removed), test {res['test_jobs']} jobs; bins of 10 min, last ≥ 5 h", highlight=False)
    table = Table(title="JCT prediction on the test part (RMSE in 10-minute bins)", box=box.SIMPLE_HEAD,
                  padding=(0, 0, 0, 1), pad_edge=False)
    table.add_column("predictor", no_wrap=True)
    for _, label, _ in _COLUMNS:
        table.add_column(label, justify="right", no_wrap=True, min_width=max(5, len(label)))
    for name, row in res["results"].items():
        table.add_row(name, *[fmt.format(row[key]) if key in row else "-" for key, _, fmt in _COLUMNS])
    console.print(table)


def register(parent: typer.Typer) -> None:
    """Add the `predict` sub-app (`train`, `eval`) to `loom`."""
    parent.add_typer(app, name="predict")
