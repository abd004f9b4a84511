"""Backends of the live service: name → class (`loom serve --backend NAME`).

* `local` — jobs as local process groups through `loom run` on emulated nodes
  (`loom.service.backends.local.LocalBackend`);
* `slurm` — jobs as Slurm batch jobs on the nodes Loom chose
  (`loom.service.backends.slurm.SlurmBackend`);
* `sim` — the simulator's world on the engine's clock: nothing runs, jobs take their
  trace durations (`loom.service.backends.sim.SimLiveBackend`).

Kubernetes adds a row here (and a world in
tests/test_backend_conformance.py). Classes are imported on first use, so naming a
backend costs nothing until it is built.
"""

from __future__ import annotations

from importlib import import_module

from loom.errors import UnknownNameError, did_you_mean

BACKENDS: dict[str, str] = {
    "local": "loom.service.backends.local:LocalBackend",
    "sim": "loom.service.backends.sim:SimLiveBackend",
    "slurm": "loom.service.backends.slurm:SlurmBackend",
}


def backend_class(name: str) -> type:
    """The backend class registered under `name`."""
    try:
        module, _, attr = BACKENDS[name].partition(":")
    except KeyError:
        raise UnknownNameError(f"unknown backend '{name}'{did_you_mean(name, BACKENDS)} "
                               f"(known: {', '.join(sorted(BACKENDS))})", field="backend") from None
    return getattr(import_module(module), attr)


def backend_names() -> list[str]:
    return sorted(BACKENDS)


__all__ = ["BACKENDS", "backend_class", "backend_names"]
