"""Where Loom finds the shared traces (never copied into the repo)."""

from __future__ import annotations

import os
from pathlib import Path

from loom.errors import LoomInputError


def shared_traces_dir() -> Path:
    """`$LOOM_TRACES`, else `../shared/traces` next to the checkout or the working directory."""
    env = os.environ.get("LOOM_TRACES")
    candidates = [Path(env)] if env else []
    repo = Path(__file__).resolve().parents[1]
    candidates += [repo.parent / "shared" / "traces", Path.cwd().parent / "shared" / "traces",
                   Path.cwd() / "shared" / "traces"]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    raise LoomInputError(
        "cannot find the shared traces folder; set LOOM_TRACES to the directory holding philly/, acme/, ...",
        field="LOOM_TRACES",
    )
