"""The checkpoint directory: names, the commit rule, validation, retention.

Layout of `LOOM_CHECKPOINT_DIR`::

    ckpt-000003-it00000040/          a complete checkpoint: commit seq 3, after iteration 40
        .metadata  __0_0.distcp ...  DCP's files (one data file per writing rank)
        COMMIT                       JSON: seq, iteration, logical world, processes, file sizes
    ckpt-000004-it00000050.partial/  being written, or abandoned by a crash: never loaded

Durability rule: DCP writes into `<name>.partial/`; only after every rank has
finished (DCP's save returns on the coordinator after gathering all ranks' write
results) does rank 0 write `COMMIT` (tmp + fsync + rename), rename the directory to
its final name and fsync the parent. A directory is complete iff it has the final
name, a `COMMIT` that parses, and files of exactly the sizes `COMMIT` lists. The
commit sequence number, not the iteration, orders checkpoints: a job resumed from
an older checkpoint writes newer ones without clashing with the abandoned timeline.
Retention deletes old complete checkpoints only after a new one is committed.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from loom.runtime.errors import (
    CheckpointError,
    CorruptCheckpointError,
    PartialCheckpointError,
)

log = logging.getLogger("loom.runtime")

FORMAT = 1
COMMIT = "COMMIT"
PARTIAL = ".partial"
_NAME = re.compile(r"^ckpt-(\d{6,})-it(\d{8,})$")
_PARTIAL = re.compile(r"^ckpt-(\d{6,})-it(\d{8,})\.partial$")


@dataclass(frozen=True)
class CheckpointInfo:
    """A complete checkpoint, as its commit marker describes it."""

    path: Path
    seq: int
    iteration: int
    logical_world: int
    processes: int
    bytes: int
    committed: float


def checkpoint_name(seq: int, iteration: int) -> str:
    return f"ckpt-{seq:06d}-it{iteration:08d}"


def prepare_dir(path: Path, *, explicit: bool) -> Path:
    """Check (or create, for the default) a checkpoint directory this process can write."""
    try:
        _usable_dir(path, explicit)
        probe = path / f".loom-write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise CheckpointError(f"checkpoint directory is not writable ({exc.strerror or exc}); "
                              "checkpoints could not be saved", source=str(path)) from None
    return path


def _usable_dir(path: Path, explicit: bool) -> None:
    if not path.exists():
        if explicit:
            raise CheckpointError(
                "checkpoint directory does not exist; create it, or unset LOOM_CHECKPOINT_DIR "
                "to use the job's default", source=str(path))
        path.mkdir(parents=True, exist_ok=True)
    if not path.is_dir():
        raise CheckpointError("is not a directory; LOOM_CHECKPOINT_DIR must name a directory",
                              source=str(path))


def _entries(directory: Path) -> list[tuple[int, int, Path, bool]]:
    """(seq, iteration, path, partial) of every checkpoint-like entry, oldest first."""
    found = []
    for entry in directory.iterdir() if directory.is_dir() else []:
        match = _NAME.match(entry.name) or _PARTIAL.match(entry.name)
        if match and entry.is_dir():
            found.append((int(match[1]), int(match[2]), entry, entry.name.endswith(PARTIAL)))
    return sorted(found, key=lambda e: (e[0], e[3]))


def next_seq(directory: Path) -> int:
    entries = _entries(directory)
    return entries[-1][0] + 1 if entries else 1


def validate(path: Path, *, read_metadata: bool = True) -> CheckpointInfo:
    """The checkpoint's commit info; a clear error naming `path` if it is partial or corrupt."""
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        raise CheckpointError(f"checkpoint {what}", source=str(path))
    if path.name.endswith(PARTIAL) or not (path / COMMIT).exists():
        raise PartialCheckpointError(
            "checkpoint is partial (never committed: no COMMIT marker); it is never loaded",
            source=str(path))
    info, files = _read_commit(path)
    for name, size in files.items():
        actual = (path / name).stat().st_size if (path / name).is_file() else None
        if actual != size:
            found = "is missing" if actual is None else f"has {actual} bytes"
            raise CorruptCheckpointError(f"checkpoint is corrupt: {name} {found}, COMMIT says {size}",
                                         source=str(path))
    if read_metadata:
        _check_metadata(path)
    return info


def _read_commit(path: Path) -> tuple[CheckpointInfo, dict[str, int]]:
    try:
        data = json.loads((path / COMMIT).read_text())
        files = {str(k): int(v) for k, v in data["files"].items()}
        info = CheckpointInfo(path, int(data["seq"]), int(data["iteration"]),
                              int(data["logical_world"]), int(data["processes"]),
                              sum(files.values()), float(data["committed"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptCheckpointError(f"checkpoint is corrupt: unreadable COMMIT marker ({exc})",
                                     source=str(path)) from None
    if ".metadata" not in files:
        raise CorruptCheckpointError("checkpoint is corrupt: COMMIT lists no .metadata",
                                     source=str(path))
    return info, files


def _check_metadata(path: Path) -> None:
    from torch.distributed.checkpoint import FileSystemReader

    try:
        FileSystemReader(str(path)).read_metadata()
    except Exception as exc:  # noqa: BLE001 - any failure to read it means corrupt
        raise CorruptCheckpointError(
            f"checkpoint is corrupt: DCP metadata does not load ({type(exc).__name__}: {exc})",
            source=str(path)) from None


def latest_complete(directory: Path) -> CheckpointInfo | None:
    """The most recently committed complete checkpoint; partial or corrupt ones are skipped with a warning."""
    for seq, _, path, partial in reversed(_entries(directory)):
        try:
            return validate(path)
        except CheckpointError as exc:
            log.warning("skipping %s", exc)
    return None


def complete(directory: Path) -> list[CheckpointInfo]:
    """Every complete checkpoint in `directory`, oldest first (commit markers only, cheap)."""
    out = []
    for _, _, path, partial in _entries(directory):
        if not partial:
            try:
                out.append(validate(path, read_metadata=False))
            except CheckpointError:
                continue
    return out


def commit(partial: Path, *, seq: int, iteration: int, logical_world: int, processes: int,
           job_id: str, extra: dict | None = None) -> Path:
    """Make a fully written `<name>.partial` durable: COMMIT marker, then atomic rename."""
    files = {p.name: p.stat().st_size for p in sorted(partial.iterdir()) if p.is_file()}
    marker = {"format": FORMAT, "seq": seq, "iteration": iteration, "logical_world": logical_world,
              "processes": processes, "job_id": job_id, "committed": time.time(), "files": files,
              **(extra or {})}
    _write_durable(partial / COMMIT, json.dumps(marker, indent=1))
    final = partial.with_name(partial.name[: -len(PARTIAL)])
    if final.exists():
        raise CheckpointError("a checkpoint of this name already exists; not overwriting it",
                              source=str(final))
    os.rename(partial, final)
    _fsync_dir(final.parent)
    return final


def _write_durable(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.rename(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def retain(directory: Path, keep: int) -> list[Path]:
    """Delete complete checkpoints beyond the newest `keep` (called only after a commit)."""
    removed = []
    for info in complete(directory)[: -max(keep, 1)]:
        removed.append(info.path)
        _remove(info.path)
    return removed


def remove_partials(directory: Path, older_than_seq: int | None = None) -> list[Path]:
    """Remove abandoned `*.partial` directories (a crash mid-save); they are never loadable."""
    removed = []
    for seq, _, path, partial in _entries(directory):
        if partial and (older_than_seq is None or seq < older_than_seq):
            log.warning("removing partial checkpoint %s (never committed)", path)
            removed.append(path)
            _remove(path)
    return removed


def _remove(path: Path) -> None:
    """Rename first so a half-deleted directory can never look complete, then delete."""
    doomed = path.with_name(f"{path.name}.deleting")
    try:
        os.rename(path, doomed)
    except OSError:
        doomed = path
    shutil.rmtree(doomed, ignore_errors=True)
