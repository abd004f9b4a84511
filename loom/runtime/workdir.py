"""The files a job writes in its working directory, and moving them with the job.

Singularity intercepts libc I/O to learn which local files a job changed, so they
can migrate with its process checkpoint. Loom's jobs are restarted from a DCP
checkpoint rather than a process image, so a cheaper equivalent suffices: the
launcher snapshots the working directory (path, size, mtime, SHA-256) when an
incarnation starts and when it ends. The difference is what the job wrote; the
whole tree (minus the checkpoint and runtime directories, which live on shared
storage) is what travels on migration, copied and verified file by file before
the job restarts in its new directory. The old directory is left untouched: it
stands for the node the job left, which the scheduler reclaims.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from loom.errors import LoomInputError

_CHUNK = 1 << 20


@dataclass(frozen=True)
class FileEntry:
    """One regular file (or symlink) of a working directory."""

    size: int
    mtime_ns: int
    sha256: str
    link: str | None = None  # a symlink's target (copied as a link, never followed)

    def same_content(self, other: FileEntry) -> bool:
        return (self.sha256, self.link) == (other.sha256, other.link)


Snapshot = dict[str, FileEntry]  # path relative to the working directory (POSIX) -> entry


def snapshot(root: Path, exclude: Iterable[Path] = ()) -> Snapshot:
    """Every file under `root` except those under an `exclude`d directory, hashed."""
    skip = [Path(p).resolve() for p in exclude]
    out: Snapshot = {}
    for path in _walk(Path(root), skip):
        out[path.relative_to(root).as_posix()] = _entry(path)
    return out


def _walk(root: Path, skip: list[Path]) -> Iterator[Path]:
    if not root.is_dir():
        return
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not _excluded(here / d, skip))
        links = [d for d in dirnames if (here / d).is_symlink()]  # os.walk never descends into these
        for name in sorted([*filenames, *links]):
            path = here / name
            if path.is_symlink() or path.is_file():
                yield path


def _excluded(path: Path, skip: list[Path]) -> bool:
    if path.is_symlink():
        return False  # a link to a directory is copied as a link, never descended into
    resolved = path.resolve()
    return any(resolved == s or s in resolved.parents for s in skip)


def _entry(path: Path) -> FileEntry:
    if path.is_symlink():
        target = os.readlink(path)
        return FileEntry(0, path.lstat().st_mtime_ns, hashlib.sha256(target.encode()).hexdigest(), link=target)
    stat = path.stat()
    return FileEntry(stat.st_size, stat.st_mtime_ns, _sha256(path))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def written(before: Snapshot, after: Snapshot) -> dict[str, list[str]]:
    """What an incarnation did to its working directory: created, modified and deleted paths."""
    return {
        "created": sorted(set(after) - set(before)),
        "modified": sorted(p for p in set(after) & set(before) if not after[p].same_content(before[p])),
        "deleted": sorted(set(before) - set(after)),
    }


def check_destination(src: Path, dst: Path) -> None:
    """Refuse a destination that is the source, inside it, or already holds files (never overwrite)."""
    src_r, dst_r = Path(src).resolve(), Path(dst).resolve()
    if dst_r == src_r:
        raise LoomInputError(f"the new working directory {dst} is the current one", field="workdir")
    if src_r in dst_r.parents:
        raise LoomInputError(f"the new working directory {dst} is inside the current one {src}", field="workdir")
    if dst_r.exists() and not dst_r.is_dir():
        raise LoomInputError(f"the new working directory {dst} exists and is not a directory", field="workdir")
    if dst_r.is_dir() and any(dst_r.iterdir()):
        raise LoomInputError(f"the new working directory {dst} is not empty (migration never overwrites files)",
                             field="workdir")


def transfer(src: Path, dst: Path, exclude: Iterable[Path] = ()) -> Snapshot:
    """Copy the working directory `src` into the empty or new `dst` and verify every file's hash.

    Returns the snapshot of what was moved. Raises LoomInputError if `dst` is unusable or a copy
    does not match its source (the source is never modified, so nothing is lost either way).
    """
    check_destination(src, dst)
    moved = snapshot(src, exclude)
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for rel, entry in moved.items():
        _copy_one(Path(src) / rel, dst / rel, entry)
    _copy_empty_dirs(Path(src), dst, [Path(p).resolve() for p in exclude])
    return moved


def _copy_one(source: Path, target: Path, entry: FileEntry) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if entry.link is not None:
        os.symlink(entry.link, target)
        return
    shutil.copy2(source, target, follow_symlinks=False)
    if _sha256(target) != entry.sha256:
        raise LoomInputError(f"copying {source} to {target} changed its content (SHA-256 mismatch); "
                             "was the job still writing it?", field="workdir")


def _copy_empty_dirs(src: Path, dst: Path, skip: list[Path]) -> None:
    for dirpath, dirnames, _ in os.walk(src):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if not _excluded(here / d, skip) and not (here / d).is_symlink()]
        for name in dirnames:
            (dst / (here / name).relative_to(src)).mkdir(parents=True, exist_ok=True)


def manifest(workdir: Path, files: Snapshot, changes: dict[str, list[str]] | None = None) -> dict[str, object]:
    """A JSON-ready record of a working directory (kept in the job directory as `workdir.json`)."""
    return {
        "workdir": str(workdir),
        "files": {rel: asdict(entry) for rel, entry in files.items()},
        "bytes": sum(e.size for e in files.values()),
        **({"changes": changes} if changes is not None else {}),
    }
