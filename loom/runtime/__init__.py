"""Loom's runtime inside real training jobs: barrier, consistent checkpoints, control channel.

A training script opts in with one line after building its objects::

    model, optimizer, loader = loom.runtime.wrap(model, optimizer, loader, lr_scheduler=scheduler)

and keeps its ordinary loop. The runtime then takes Singularity's two-phase barrier
every iteration, checkpoints with DCP at the cut (periodically and on request),
answers the scheduler's requests (checkpoint, stop, migrate, resize) through files
in the job directory, and on a restart restores model, optimizer, scheduler, RNG
streams and data position before `wrap` returns. A job of N logical ranks runs on
any M ≤ N processes, each time-slicing its logical ranks (world-size
virtualisation). See docs/RUNTIME.md.

Importing the package does not import torch (the `loom run` supervisor imports its
submodules); `wrap` does.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import TYPE_CHECKING, Any

from loom.runtime.config import RuntimeConfig
from loom.runtime.control import ACTIONS, STATES, ControlClient
from loom.runtime.errors import (
    CheckpointError,
    ControlError,
    ControlTimeout,
    CorruptCheckpointError,
    LoomRuntimeError,
    LossSpikeError,
    PartialCheckpointError,
    RequestFailed,
    RuntimeConfigError,
    RuntimeUsageError,
    UnknownJobError,
    install_excepthook,
)
from loom.runtime.store import latest_complete

if TYPE_CHECKING:
    from loom.runtime.runtime import Runtime

__all__ = [
    "ACTIONS", "STATES", "CheckpointError", "ControlClient", "ControlError", "ControlTimeout",
    "CorruptCheckpointError", "LoomRuntimeError", "LossSpikeError", "PartialCheckpointError", "RequestFailed",
    "Runtime", "RuntimeConfig", "RuntimeConfigError", "RuntimeUsageError", "UnknownJobError",
    "current", "latest_complete", "report", "wrap",
]

_current: Runtime | None = None


def wrap(model: Any, optimizer: Any, loader: Any, lr_scheduler: Any = None) -> tuple[Any, Any, Any]:
    """Hook the job into the runtime; returns `(model, optimizer, loader)` to use from then on.

    On a restart from a checkpoint, model, optimizer, scheduler, RNG streams and the
    loader's position are restored before this returns.
    """
    global _current
    if _current is not None and not _current.closed:
        raise RuntimeUsageError("loom.runtime.wrap() was already called in this process")
    _check_arguments(model, optimizer, loader, lr_scheduler)
    from loom.runtime.runtime import Runtime

    config = RuntimeConfig.from_env()
    try:
        runtime = Runtime(model, optimizer, loader, lr_scheduler, config=config)
    except LoomRuntimeError as exc:
        _report_startup_failure(config, exc)
        raise
    _current = runtime
    runtime.start()
    return model, optimizer, runtime.loader


def current() -> Runtime:
    """The runtime of this process (iteration, logical ranks, `request_barrier()`, status)."""
    if _current is None:
        raise RuntimeUsageError(
            "loom.runtime.current(): this process has no runtime — the script never called "
            "`model, optimizer, loader = loom.runtime.wrap(model, optimizer, loader)`")
    return _current


def report(loss: Any = None) -> None:
    """Tell the runtime the latest loss (shown in status.json; a tensor is read at most once a second)."""
    current().report(loss=loss)


def _check_arguments(model: Any, optimizer: Any, loader: Any, scheduler: Any) -> None:
    import torch

    if not isinstance(model, torch.nn.Module):
        raise RuntimeUsageError(f"wrap(model, ...): model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise RuntimeUsageError(
            f"wrap(..., optimizer, ...): optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if loader is not None and not hasattr(loader, "__iter__"):
        raise RuntimeUsageError(f"wrap(..., loader): loader must be iterable, got {type(loader).__name__}")
    if scheduler is not None and not (hasattr(scheduler, "state_dict") and hasattr(scheduler, "load_state_dict")):
        raise RuntimeUsageError("wrap(..., lr_scheduler=...): the scheduler needs state_dict() and "
                                f"load_state_dict(), got {type(scheduler).__name__}")
    if scheduler is not None and getattr(scheduler, "optimizer", optimizer) is not optimizer:
        raise RuntimeUsageError("wrap(..., lr_scheduler=...): the scheduler drives another optimizer")


def __getattr__(name: str) -> Any:
    """`Runtime` on first use: importing the package (the launcher does) must not import torch."""
    if name == "Runtime":
        from loom.runtime.runtime import Runtime

        return Runtime
    raise AttributeError(f"module 'loom.runtime' has no attribute {name!r}")


def _report_startup_failure(config: RuntimeConfig, exc: LoomRuntimeError) -> None:
    """Rank 0 leaves a `failed` status naming the problem, so the launcher can show it."""
    import os
    import time

    from loom.runtime.control import ControlChannel

    if os.environ.get("RANK", "0") != "0":
        return
    try:
        channel = ControlChannel(config.job_dir, config.job_id)
        channel.write_status({"job_id": config.job_id, "state": "failed", "iteration": 0,
                              "logical_world": config.logical_world, "processes": None,
                              "iterations_per_s": 0.0, "samples_per_s": 0.0, "loss": None,
                              "last_checkpoint": None, "updated": time.time(), "error": str(exc)})
        channel.event("failed", iteration=0, error=str(exc))
    except OSError:
        pass


def _note_uncaught(kind: type[BaseException], value: BaseException, tb: TracebackType | None,
                   previous: Any = None) -> None:
    if _current is not None:
        _current.note_failure(value)
    (previous or sys.__excepthook__)(kind, value, tb)


def _install_failure_hook() -> None:
    install_excepthook()
    previous = sys.excepthook
    sys.excepthook = lambda k, v, tb: _note_uncaught(k, v, tb, previous)


_install_failure_hook()
