"""Look at the start of a trace file: its header columns, and why it may not be a CSV Loom can read.

Used to infer a trace's format from a plain path (`loom traces validate FILE`)
and to turn "missing columns" into the likely cause when a file is not
comma-separated text at all (semicolon- or tab-separated, binary, compressed,
UTF-16). Gzip-compressed CSV is read transparently (as polars does).
"""

from __future__ import annotations

import csv
import gzip
import io
from pathlib import Path
from typing import IO

HEAD_BYTES = 64 * 1024
_MAGIC = [  # (prefix, what the file is)
    (b"PK\x03\x04", "a zip archive; unpack it first"),
    (b"BZh", "bzip2-compressed; decompress it first"),
    (b"\xfd7zXZ\x00", "xz-compressed; decompress it first"),
    (b"(\xb5/\xfd", "zstd-compressed; decompress it first"),
    (b"PAR1", "a Parquet file, not CSV"),
    (b"\xd0\xcf\x11\xe0", "an old Excel/Office file; export it as CSV"),
    (b"\xff\xfe", "UTF-16 text; save it as UTF-8"),
    (b"\xfe\xff", "UTF-16 text; save it as UTF-8"),
]
GZIP_MAGIC = b"\x1f\x8b"


def head_bytes(path: Path, size: int = HEAD_BYTES) -> bytes:
    """The first `size` bytes of the file's content (decompressed when it is gzip)."""
    with path.open("rb") as fh:
        raw = fh.read(size)
    if raw.startswith(GZIP_MAGIC):
        try:
            with gzip.open(path, "rb") as gz:
                return gz.read(size)
        except (OSError, EOFError):
            return raw
    return raw


def open_text(path: Path) -> IO[str]:
    """The file as text for the csv module (gzip decompressed; undecodable bytes replaced)."""
    with path.open("rb") as fh:
        gz = fh.read(2) == GZIP_MAGIC
    if gz:
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", errors="replace", newline="")
    return path.open(newline="", encoding="utf-8", errors="replace")


def not_text(head: bytes) -> str | None:
    """Why these bytes are not UTF-8 text (None when they are)."""
    for magic, what in _MAGIC:
        if head.startswith(magic):
            return f"is {what}"
    if b"\x00" in head:
        return "is not text (binary or compressed?)"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.reason == "unexpected end of data":  # a character cut at the end of the sample
            return None
        if _mostly_binary(head):
            return "is not text (binary or compressed?)"
        line = head[:exc.start].count(b"\n") + 1
        return f"is not UTF-8 text (line {line} has byte 0x{head[exc.start]:02x}); save it as UTF-8"
    return None


def _mostly_binary(head: bytes) -> bool:
    control = sum(1 for b in head if b < 9 or 13 < b < 32 or b == 127)
    high = sum(1 for b in head if b >= 128)
    return control > len(head) // 100 or high > len(head) // 3


def header_line(head: bytes) -> str:
    """The first line of the file (BOM dropped, undecodable bytes replaced)."""
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff")
    return text.splitlines()[0] if text.strip() else ""


def header_columns(path: Path) -> list[str]:
    """The header's column names, stripped (empty for an empty file)."""
    line = header_line(head_bytes(path))
    row = next(csv.reader([line]), [])
    return [c.strip() for c in row]


def separator_problem(line: str) -> str | None:
    """Why a header line is not comma-separated (None when it may be)."""
    if line.count(";") > line.count(","):
        return "looks semicolon-separated (header has ';'); Loom reads comma-separated CSV"
    if line.count("\t") > line.count(","):
        return "looks tab-separated (header has tabs); Loom reads comma-separated CSV"
    if "|" in line and line.count("|") > line.count(","):
        return "looks '|'-separated (header has '|'); Loom reads comma-separated CSV"
    return None


def diagnose(path: Path) -> str | None:
    """The likely reason a file is not a comma-separated text table, or None."""
    try:
        head = head_bytes(path)
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    return not_text(head) or separator_problem(header_line(head))
