"""Experiments: a base config plus a grid of values, run as one simulation per grid point.

An experiment file is a `SimConfig` (any of its fields, see docs/CONFIG.md)
plus a `grid:` mapping each varied field to a list of values::

    trace: philly
    limit_jobs: 2000
    grid:
      policies: [fcfs, easy, sjf]     # aliases: traces clusters policies placers seeds speed_models
      seeds: [1, 2]
      policy.params.some_param: [1, 2]  # or any (dotted) config key

The cartesian product of the grid gives one config per run, named from its
grid values (`policy=easy,seed=1`) and written to `<out>/<run-name>/` exactly as
`loom simulate` writes a run. Runs go to local processes
(`concurrent.futures.ProcessPoolExecutor`) or, given a Ray address, to Ray
tasks. A failing run never stops the others; `write_combined` then writes the
combined `summary.csv` / `summary.parquet` (one row per run), `experiment.json`
and a comparison of the successful runs (`comparison.html`); when the grid varies
the seed, also `summary_seeds.csv`: per metric the mean ± 95% CI over seeds, or
that the seed had no effect (`loom.experiment_seeds`).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import os
import re
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from loom.config import SimConfig, config_to_dict
from loom.errors import LoomInputError

# Plural spellings accepted as grid keys, mapped to the config field they vary.
GRID_ALIASES = {"traces": "trace", "clusters": "cluster", "policies": "policy", "placers": "placer",
                "seeds": "seed", "speed_models": "speed_model", "speed-models": "speed_model"}
COMPONENT_FIELDS = ("policy", "placer", "speed_model")
NOT_IN_GRID = ("outputs", "outputs.dir")  # each run's directory is set by the experiment
MAX_NAME = 200


@dataclass(frozen=True)
class Axis:
    key: str  # the config key it sets (canonical, possibly dotted: "policy", "policy.params.window")
    values: tuple[Any, ...]


@dataclass
class GridPoint:
    """One run: its grid values, its name and either a validated config or why it is invalid."""

    name: str
    values: dict[str, Any]
    out_dir: Path
    config: SimConfig | None = None
    error: str | None = None

    @property
    def valid(self) -> bool:
        return self.config is not None


@dataclass
class Experiment:
    source: str
    base: dict[str, Any]
    axes: list[Axis]
    out: Path
    points: list[GridPoint]


@dataclass
class RunResult:
    name: str
    values: dict[str, Any]
    out_dir: Path
    status: str  # "ok", "failed" (raised while running) or "invalid" (never started)
    error: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    wall_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


# ------------------------------------------------------------------ loading and expansion
def load_experiment(path: Path, out: Path | None = None) -> Experiment:
    """Read and validate an experiment file; expand its grid into one `GridPoint` per run.

    Problems with the file itself (YAML, unknown keys, an empty or malformed grid,
    an invalid base config) raise `LoomInputError` naming the file and field. A grid
    point whose config does not validate is returned with `error` set (and no config),
    so the other points can still run.
    """
    source = str(path)
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise LoomInputError(f"cannot read experiment: {exc.strerror}", source=source) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise LoomInputError(f"invalid YAML: {getattr(exc, 'problem', exc)}", source=source,
                             line=mark.line + 1 if mark is not None else None) from None
    if not isinstance(data, dict):
        raise LoomInputError("an experiment must be a mapping of config fields plus a 'grid:'", source=source)
    return experiment_from_dict(data, source, out if out is not None else _default_out(data, path))


def _default_out(data: dict[str, Any], path: Path) -> Path:
    outputs = data.get("outputs")
    if isinstance(outputs, dict) and outputs.get("dir"):
        return Path(outputs["dir"])
    return Path("runs") / Path(path).stem


def experiment_from_dict(data: dict[str, Any], source: str, out: Path) -> Experiment:
    data = copy.deepcopy(data)
    if "grid" not in data:
        raise LoomInputError("no 'grid:' (a mapping of config keys to lists of values)", source=source,
                             field="grid")
    axes = parse_grid(data.pop("grid"), source)
    base = data
    unknown = [k for k in base if k not in SimConfig.model_fields]
    if unknown:
        raise LoomInputError(f"unknown field(s) {', '.join(map(str, unknown))} "
                             f"(known: grid, {', '.join(SimConfig.model_fields)})", source=source,
                             field=str(unknown[0]))
    try:
        SimConfig.model_validate(base)
    except ValidationError as exc:
        raise LoomInputError(_pydantic_message(exc), source=source, field=_loc(exc.errors()[0])) from None
    return Experiment(source, base, axes, Path(out), expand(base, axes, Path(out), source))


def parse_grid(grid: Any, source: str) -> list[Axis]:
    if not isinstance(grid, dict) or not grid:
        raise LoomInputError("'grid' must be a non-empty mapping of config keys to lists of values, "
                             "e.g. {policies: [fcfs, easy], seeds: [1, 2]}", source=source, field="grid")
    axes: list[Axis] = []
    seen: dict[str, str] = {}
    fields = list(SimConfig.model_fields)
    for raw_key, values in grid.items():
        where = f"grid.{raw_key}"
        if not isinstance(raw_key, str) or not raw_key:
            raise LoomInputError("grid keys must be config field names", source=source, field=where)
        key = GRID_ALIASES.get(raw_key, raw_key)
        head = key.split(".")[0]
        if head not in SimConfig.model_fields:
            raise LoomInputError(f"unknown config key '{raw_key}' (known: {', '.join(fields)}; plurals "
                                 f"{', '.join(k for k in GRID_ALIASES if '-' not in k)}; or a dotted key "
                                 "such as policy.params.NAME)", source=source, field=where)
        if key in NOT_IN_GRID:
            raise LoomInputError("each run's output directory is set by the experiment (use --out)",
                                 source=source, field=where)
        if any(part == "" for part in key.split(".")):
            raise LoomInputError("malformed dotted key", source=source, field=where)
        if key in seen:
            raise LoomInputError(f"'{raw_key}' and '{seen[key]}' both set '{key}'", source=source, field=where)
        seen[key] = str(raw_key)
        if not isinstance(values, list):
            raise LoomInputError(f"must be a list of values, got {type(values).__name__} "
                                 f"(write [{values!r}] for a single value)", source=source, field=where)
        if not values:
            raise LoomInputError("empty list (give at least one value)", source=source, field=where)
        canon = [json.dumps(v, sort_keys=True, default=str) for v in values]
        for i, c in enumerate(canon):
            if c in canon[:i]:
                raise LoomInputError(f"value {values[i]!r} appears more than once", source=source,
                                     field=f"{where}[{i}]")
        axes.append(Axis(key, tuple(values)))
    return axes


def expand(base: dict[str, Any], axes: list[Axis], out: Path, source: str = "experiment") -> list[GridPoint]:
    """The cartesian product of the axes (first axis slowest), each validated as a `SimConfig`."""
    combos = [dict(zip((a.key for a in axes), combo)) for combo in itertools.product(*(a.values for a in axes))]
    names = unique_names([run_name(values) for values in combos], combos)
    points = []
    for name, values in zip(names, combos):
        run_dir = out / name
        point = GridPoint(name, values, run_dir)
        try:
            point.config = point_config(base, values, run_dir)
        except LoomInputError as exc:
            where = f", field '{exc.field}'" if exc.field else ""
            point.error = f"{source}, grid point '{name}'{where}: {exc.message}"
        points.append(point)
    return points


def point_config(base: dict[str, Any], values: dict[str, Any], out_dir: Path) -> SimConfig:
    """Base + grid values (dotted keys allowed) + outputs.dir, validated; component names checked."""
    data = copy.deepcopy(base)
    defaults = SimConfig().model_dump(mode="json")
    for key, value in values.items():
        target = data
        *parents, leaf = key.split(".")
        for depth, part in enumerate(parents):
            current = target.get(part)
            if current is None:
                current = ({"name": defaults[part]["name"]} if depth == 0 and part in COMPONENT_FIELDS else {})
            elif isinstance(current, str) and depth == 0 and part in COMPONENT_FIELDS:
                current = {"name": current}  # "policy: easy" shorthand, now given params
            elif not isinstance(current, dict):
                raise LoomInputError(f"cannot set '{key}': '{part}' is not a mapping", field=key)
            else:
                current = dict(current)
            target[part] = current
            target = current
        target[leaf] = copy.deepcopy(value)
    outputs = dict(data.get("outputs") or {})
    outputs["dir"] = str(out_dir)
    data["outputs"] = outputs
    try:
        config = SimConfig.model_validate(data)
    except ValidationError as exc:
        raise LoomInputError(_pydantic_message(exc), field=_loc(exc.errors()[0])) from None
    check_names(config)
    return config


def check_names(config: SimConfig) -> None:
    """Unknown policy/placer/speed model/cluster/trace names, found before anything runs."""
    from loom.core.protocols import PLACERS, POLICIES, SPEED_MODELS
    from loom.hardware.clusters import CLUSTERS, IMPORTERS
    from loom.workload.loaders import resolve_trace

    def located(fn: Callable[[], Any], fld: str) -> None:
        try:
            fn()
        except LoomInputError as exc:
            raise LoomInputError(exc.message if exc.source is None else str(exc), field=exc.field or fld) from None

    for fld, registry in (("policy", POLICIES), ("placer", PLACERS), ("speed_model", SPEED_MODELS)):
        located(lambda r=registry, f=fld: r.get(getattr(config, f).name), f"{fld}.name")
    fmt, sep, path = config.cluster.partition(":")
    if sep and fmt in IMPORTERS:
        if not Path(path).exists():
            raise LoomInputError(f"cluster file not found: {path}", field="cluster")
    else:
        located(lambda: CLUSTERS.get(config.cluster), "cluster")
    located(lambda: resolve_trace(config.trace), "trace")


def _pydantic_message(exc: ValidationError) -> str:
    errors = exc.errors()
    return errors[0]["msg"] + "".join(f"; field '{_loc(e)}': {e['msg']}" for e in errors[1:])


def _loc(error: Any) -> str:
    return ".".join(str(p) for p in error["loc"])


# ------------------------------------------------------------------ naming
def value_label(value: Any) -> str:
    """A short, readable rendering of one grid value (before making it filesystem-safe)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        fmt, sep, path = value.partition(":")
        if sep and ("/" in path or "\\" in path):  # FORMAT:PATH → FORMAT:basename
            return f"{fmt}:{Path(path).name}"
        return value
    if isinstance(value, dict) and isinstance(value.get("name"), str) and set(value) <= {"name", "params"}:
        params = value.get("params") or {}
        inner = "+".join(f"{k}-{value_label(v)}" for k, v in sorted(params.items()))
        return f"{value['name']}({inner})" if inner else value["name"]
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _clean(text: str) -> str:
    """Letters, digits and . _ + @ - only (runs of anything else become one '_')."""
    return re.sub(r"[^A-Za-z0-9._+@-]+", "_", text).strip("_") or "_"


def safe(text: str) -> str:
    """A filesystem-safe name: `_clean`, and never starting with '.' or '-'."""
    return _no_leading_dot(_clean(text))


def _no_leading_dot(name: str) -> str:
    return "_" + name if name[0] in ".-" else name


def run_name(values: dict[str, Any]) -> str:
    """`trace=philly,policy=easy,seed=1`: the grid keys in file order, each value made filesystem-safe."""
    name = _no_leading_dot(",".join(f"{_clean(k)}={_clean(value_label(v))}" for k, v in values.items()))
    if len(name) > MAX_NAME:
        name = name[:MAX_NAME - 9] + "~" + _digest(values)
    return name


def unique_names(names: list[str], combos: list[dict[str, Any]]) -> list[str]:
    """Distinct values that render alike (e.g. two traces named x.csv) get a short hash suffix."""
    counts: dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    return [n if counts[n] == 1 else f"{n}~{_digest(c)}" for n, c in zip(names, combos)]


def _digest(values: dict[str, Any]) -> str:
    return hashlib.sha1(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:8]


# ------------------------------------------------------------------ execution
def execute_point(name: str, config_data: dict[str, Any]) -> dict[str, Any]:
    """Run one grid point (in a worker process or a Ray task); never raises."""
    from loom.run import run

    t0 = time.perf_counter()
    try:
        outputs = run(SimConfig.model_validate(config_data))
        return {"name": name, "status": "ok", "summary": outputs.summary, "wall_s": time.perf_counter() - t0}
    except Exception as exc:  # noqa: BLE001 - every failure is recorded, none stops the experiment
        message = str(exc) if isinstance(exc, LoomInputError) else f"{type(exc).__name__}: {exc}"
        try:
            out = Path(config_data["outputs"]["dir"])
            out.mkdir(parents=True, exist_ok=True)
            (out / "error.txt").write_text(traceback.format_exc())
        except OSError:
            pass
        return {"name": name, "status": "failed", "error": message, "wall_s": time.perf_counter() - t0}


def run_points(points: list[GridPoint], workers: int | None = None, ray_address: str | None = None,
               on_result: Callable[[RunResult], None] | None = None) -> list[RunResult]:
    """Run every valid point; invalid ones are recorded as such. Results come back in grid order."""
    results: dict[str, RunResult] = {}

    def record(point: GridPoint, raw: dict[str, Any]) -> None:
        res = RunResult(point.name, point.values, point.out_dir, raw["status"], raw.get("error"),
                        raw.get("summary") or {}, raw.get("wall_s"))
        results[point.name] = res
        if on_result:
            on_result(res)

    for p in points:
        if not p.valid:
            record(p, {"status": "invalid", "error": p.error})
    todo = [p for p in points if p.valid]
    if todo:
        if ray_address:
            _run_ray(todo, ray_address, workers, record)
        else:
            _run_local(todo, workers, record)
    return [results[p.name] for p in points]


def _payload(point: GridPoint) -> dict[str, Any]:
    assert point.config is not None
    data = config_to_dict(point.config)
    data["outputs"]["dir"] = str(Path(point.out_dir).resolve())
    return data


def _run_local(points: list[GridPoint], workers: int | None, record: Callable[[GridPoint, dict], None]) -> None:
    import multiprocessing

    workers = max(1, min(workers or os.cpu_count() or 1, len(points)))
    # spawn: no fork of a process that has threads (rich's refresh thread); same sys.path in workers
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(execute_point, p.name, _payload(p)): p for p in points}
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    point = futures[fut]
                    try:
                        raw = fut.result()
                    except Exception as exc:  # noqa: BLE001 - e.g. a worker killed (out of memory)
                        raw = {"status": "failed", "error": f"worker process failed: {type(exc).__name__}: {exc}"}
                    record(point, raw)
        except BaseException:  # Ctrl-C: do not start the queued runs
            pool.shutdown(wait=False, cancel_futures=True)
            raise


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise LoomInputError("--ray-address needs Ray, which is not installed: pip install ray "
                             "(or run without --ray-address to use local processes)") from None
    return ray


def _run_ray(points: list[GridPoint], address: str, workers: int | None,
             record: Callable[[GridPoint, dict], None]) -> None:
    ray = import_ray()
    started = not ray.is_initialized()
    if started:
        if address == "local":
            # local workers must import this very loom (it may not be the installed one)
            # (through the environment the local Ray processes inherit: faster than a runtime_env)
            root = str(Path(__file__).resolve().parents[1])
            saved = os.environ.get("PYTHONPATH")
            os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, saved) if p)
            try:
                ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
            finally:
                if saved is None:
                    os.environ.pop("PYTHONPATH", None)
                else:
                    os.environ["PYTHONPATH"] = saved
        else:
            try:
                ray.init(address=address, log_to_driver=False)
            except Exception as exc:  # noqa: BLE001 - ConnectionError, ValueError, ...
                raise LoomInputError(f"cannot connect to Ray at '{address}': {exc}") from None
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(execute_point)
        refs = {task.remote(p.name, _payload(p)): p for p in points}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    raw = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - task or worker died
                    raw = {"status": "failed",
                           "error": f"Ray task failed: {type(exc).__name__}: {exc}".splitlines()[0]}
                record(refs[ref], raw)
    finally:
        if started:
            ray.shutdown()


# ------------------------------------------------------------------ combined outputs
def grid_columns(values: dict[str, Any]) -> dict[str, Any]:
    """Grid values as scalar table cells (components and other structures as their label)."""
    return {k: v if isinstance(v, (str, int, float, bool)) or v is None else value_label(v)
            for k, v in values.items()}


def summary_rows(results: Iterable[RunResult]) -> list[dict[str, Any]]:
    rows = []
    for r in results:
        row: dict[str, Any] = {"run": r.name, **grid_columns(r.values), "status": r.status, "error": r.error,
                               "out_dir": str(r.out_dir), "run_wall_s": r.wall_s}
        for k, v in r.summary.items():
            row.setdefault(k, v if isinstance(v, (str, int, float, bool)) or v is None else json.dumps(v))
        rows.append(row)
    return rows


def write_combined(experiment: Experiment, results: list[RunResult], wall_s: float | None = None
                   ) -> dict[str, Path]:
    """`summary.csv`, `summary.parquet`, `experiment.json`, (if the grid varies the seed)
    `summary_seeds.csv` and (if any run succeeded) `comparison.html` with `comparison.json`."""
    import polars as pl

    from loom.experiment_seeds import seed_groups, seed_rows

    out = experiment.out
    out.mkdir(parents=True, exist_ok=True)
    rows = summary_rows(results)
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    frame = pl.DataFrame([{c: row.get(c) for c in columns} for row in rows], infer_schema_length=None)
    written = {"summary.csv": out / "summary.csv", "summary.parquet": out / "summary.parquet",
               "experiment.json": out / "experiment.json"}
    frame.write_csv(written["summary.csv"])
    frame.write_parquet(written["summary.parquet"])
    groups = seed_groups(experiment, results)
    if groups:
        written["summary_seeds.csv"] = out / "summary_seeds.csv"
        pl.DataFrame(seed_rows(groups), infer_schema_length=None).write_csv(written["summary_seeds.csv"])
    written["experiment.json"].write_text(json.dumps({
        "source": experiment.source,
        "grid": {a.key: list(a.values) for a in experiment.axes},
        "base": experiment.base,
        "wall_s": wall_s,
        "runs": [{"name": r.name, "values": r.values, "status": r.status, "out_dir": str(r.out_dir)}
                 for r in results],
        "errors": [{"name": r.name, "error": r.error} for r in results if not r.ok],
        "seeds": seed_rows(groups),  # per combination of the other grid values: mean ± 95% CI over seeds
    }, indent=2, default=str) + "\n")
    comparable = [r for r in results if r.ok and (r.out_dir / "jobs.parquet").is_file()]
    if comparable:
        from loom.report.compare import write_comparison
        from loom.report.data import load_run

        runs = [load_run(r.out_dir) for r in comparable]
        written["comparison.html"] = write_comparison(runs, [r.name for r in comparable], out / "comparison.html")
        written["comparison.json"] = out / "comparison.json"  # beside it: per trace group, ratios to its baseline
    return written
