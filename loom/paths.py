"""Where Loom finds the shared traces (never copied into the repo)."""

from __future__ import annotations

import os
from pathlib import Path

from loom.errors import LoomInputError

ENV = "LOOM_TRACES"


def shared_traces_dir() -> Path:
    """`$LOOM_TRACES`, else `../shared/traces` next to the checkout or the working directory.

    A `LOOM_TRACES` that is set but is not a directory is an error (not silently
    replaced by the fallback): the user meant that folder.
    """
    env = os.environ.get(ENV, "").strip()
    if env:
        return _from_env(env)
    repo = Path(__file__).resolve().parents[1]
    candidates = [repo.parent / "shared" / "traces", Path.cwd().parent / "shared" / "traces",
                  Path.cwd() / "shared" / "traces"]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    raise LoomInputError(
        f"cannot find the shared traces folder; set {ENV} to the directory holding philly/, acme/, ...",
        field=ENV,
    )


def _from_env(env: str) -> Path:
    path = Path(env).expanduser()
    if path.is_dir():
        return path
    what = "is not a directory" if path.exists() else "does not exist"
    raise LoomInputError(
        f"{path} {what}; point {ENV} at the directory holding philly/, acme/, ... or unset it",
        source=f"environment variable {ENV}",
    )
