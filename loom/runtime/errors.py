"""Errors of the runtime inside training jobs.

Each is a `LoomInputError`: a mistake the user (or the scheduler talking to a job)
can fix, printed as one line that names what is wrong — the path, the environment
variable, the job or the request — never as a bare traceback from deep in torch.
"""

from __future__ import annotations

import sys
from types import TracebackType

from loom.errors import LoomInputError


class LoomRuntimeError(LoomInputError):
    """Base class of every runtime error."""


class RuntimeUsageError(LoomRuntimeError):
    """The training script used the runtime API wrongly (e.g. `current()` before `wrap()`)."""


class RuntimeConfigError(LoomRuntimeError):
    """A `LOOM_*` environment variable has a value the runtime cannot use."""


class CheckpointError(LoomRuntimeError):
    """A checkpoint directory or checkpoint cannot be used; `source` is its path."""


class PartialCheckpointError(CheckpointError):
    """The checkpoint was never committed (no commit marker, or still named `*.partial`)."""


class CorruptCheckpointError(CheckpointError):
    """The checkpoint was committed but its files do not match its commit marker or do not load."""


class LossSpikeError(LoomRuntimeError):
    """The loss kept spiking after the allowed rollbacks, or is not finite with nothing to roll back to."""


class ControlError(LoomRuntimeError):
    """A control-channel operation failed (unknown job, unreadable status)."""


class UnknownJobError(ControlError):
    """No job directory under the runtime directory has this job id."""


class RequestFailed(ControlError):
    """The job answered a control request with status `failed`; `ack` holds the answer."""

    def __init__(self, message: str, *, ack: dict, source: str | None = None) -> None:
        self.ack = ack
        super().__init__(message, source=source)


class ControlTimeout(ControlError):
    """No answer to a control request within the timeout."""


def install_excepthook() -> None:
    """Show an uncaught runtime error as one line (every other exception keeps its traceback)."""
    previous = sys.excepthook
    if getattr(previous, "_loom_runtime", False):
        return

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if isinstance(value, LoomInputError):
            print(f"loom runtime: error: {value}", file=sys.stderr)
            return
        previous(kind, value, tb)

    hook._loom_runtime = True  # type: ignore[attr-defined]
    sys.excepthook = hook
