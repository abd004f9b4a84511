"""The diagnosis pipeline: read → compress → rules → retrieval fallback → optional LLM hook.

Rules answer when one of their strong rules fired. When only a weak rule fired (a bare
RuntimeError, an exception the taxonomy does not know, a connection reset) or none did, and the
log shows that the job failed (a healthy run's noise is nothing to explain), retrieval over past
failures is asked; its answer is used above a threshold measured on unseen failure scenarios,
a higher one when it would override the weak rule's answer. An external LLM can be plugged in as a last resort (`llm=`); it is off by default and no
test needs it.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loom.diagnosis.compress import CompressedLog, FilterSet, KeptLine, compress
from loom.diagnosis.rules import RulesResult, classify
from loom.diagnosis.taxonomy import UNKNOWN, error_type
from loom.errors import FileProblem

if TYPE_CHECKING:
    from loom.diagnosis.retrieval import Embed, Store

_SNIFF = 8192
LLMHook = Callable[[str], dict[str, Any] | None]


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """What failed, where in the log, and what Loom's recovery pipeline should do about it."""

    category: str
    error_type: str
    root_cause_lines: tuple[str, ...]
    recoverable: bool
    mitigation: str
    source: str  # "rules" | "retrieval" | "llm" | "none"
    root_cause_line_numbers: tuple[int, ...] = ()
    ranks: tuple[int, ...] = ()  # ranks that reported the root cause (from `[rankN]:` prefixes)
    notes: tuple[str, ...] = ()  # e.g. "retrieval unavailable: ..."
    lines_read: int = 0
    lines_kept: int = 0

    def to_json(self) -> dict[str, Any]:
        """The stable machine-readable form: exactly these five keys."""
        return {"category": self.category, "error_type": self.error_type,
                "root_cause_lines": list(self.root_cause_lines), "recoverable": self.recoverable,
                "mitigation": self.mitigation}


def diagnose(log: str | Path | Iterable[str], *, retrieval: bool = True, llm: LLMHook | None = None,
             filters: FilterSet | None = None, store: Store | None = None,
             embedder: Embed | None = None) -> Diagnosis:
    """Diagnose a failed job's log: a Path (streamed), log text, or an iterable of lines.

    A `str` is log text, except a single line naming an existing file, which is read. Raises
    `loom.errors.LoomInputError` for a file that is missing, a directory, binary or empty.
    `store` and `embedder` replace the training split's retrieval store and the embedding model
    (leave-one-template-out evaluation).
    """
    compressed = compress(_lines(log), filters)
    if compressed.lines_in == 0 or not compressed.bytes_in:
        raise FileProblem("is empty: there is no log to diagnose", source=_name(log))
    ruled = classify(compressed)
    notes: list[str] = []
    if ruled is not None and not ruled.weak:
        return _from_rules(ruled, compressed, notes)
    if retrieval:
        found = _retrieve(compressed, notes, store, ruled, embedder)
        if found is not None:
            return found
    if llm is not None:
        asked = _ask_llm(llm, compressed, notes)
        if asked is not None:
            return asked
    if ruled is not None:
        return _from_rules(ruled, compressed, notes)
    return _make(UNKNOWN, (), "none", compressed, notes)


def _from_rules(ruled: RulesResult, log: CompressedLog, notes: list[str]) -> Diagnosis:
    return _make(ruled.error_type, ruled.lines, "rules", log, notes, ruled.ranks)


def _make(name: str, lines: Iterable[KeptLine], source: str, log: CompressedLog, notes: list[str],
          ranks: tuple[int, ...] = ()) -> Diagnosis:
    kind = error_type(name)
    lines = tuple(lines)
    if log.truncated:
        notes.append(f"only the first {len(log.kept)} non-routine lines were examined")
    return Diagnosis(kind.category, kind.name, tuple(k.text for k in lines), kind.recoverable, kind.mitigation,
                     source, tuple(k.number for k in lines), ranks, tuple(notes), log.lines_in, len(log.kept))


def _retrieve(log: CompressedLog, notes: list[str], store: Store | None, ruled: RulesResult | None,
              embed: Embed | None) -> Diagnosis | None:
    """Retrieval's answer when the log shows that the job failed and it is confident enough: more
    so to override a weak rule's answer than to fill in where no rule fired (retrieval.accept)."""
    from loom.diagnosis import retrieval as rt

    if not log.evidence:
        notes.append("retrieval not asked: the log shows no sign that the job failed (no non-zero exit, "
                     "uncaught traceback, fatal signal or scheduler report)")
        return None
    try:
        embed = embed or rt.load_embedder()
        store = store or rt.default_store(embed)
    except rt.RetrievalUnavailable as exc:
        notes.append(f"retrieval unavailable, rules only: {exc}")
        return None
    found = rt.query(log, store, embed)
    if found is None or not rt.accept(found, ruled.error_type if ruled is not None else None):
        return None
    ranks = tuple(sorted({k.rank for k in found.lines if k.rank is not None}))
    return _make(found.error_type, found.lines, "retrieval", log, notes, ranks)


def _ask_llm(llm: LLMHook, log: CompressedLog, notes: list[str]) -> Diagnosis | None:
    """Hand the compressed log to an external model; accept an answer naming a known error type
    and lines that are in the log."""
    from loom.diagnosis.taxonomy import taxonomy

    text = "\n".join(f"{k.number}: {k.text}" for k in log.kept[:400])
    try:
        answer = llm(text) or {}
    except Exception as exc:  # noqa: BLE001 - an external service: its failure must not fail the diagnosis
        notes.append(f"LLM hook failed: {type(exc).__name__}: {exc}")
        return None
    name = answer.get("error_type")
    if name not in taxonomy():
        return None
    wanted = {int(n) for n in answer.get("root_cause_line_numbers", []) if str(n).isdigit()}
    lines = [k for k in log.kept if k.number in wanted]
    return _make(str(name), lines, "llm", log, notes)


# -- reading -----------------------------------------------------------------------------------
def _name(log: object) -> str:
    if isinstance(log, Path):
        return str(log)
    if isinstance(log, str) and _is_file_name(log):
        return log
    return "the log"


def _is_file_name(text: str) -> bool:
    return "\n" not in text and 0 < len(text) < 4096 and Path(text).is_file()


def _lines(log: str | Path | Iterable[str]) -> Iterator[str]:
    if isinstance(log, Path) or (isinstance(log, str) and _is_file_name(log)):
        return read_lines(Path(log))
    if isinstance(log, str):
        return iter(io.StringIO(log))
    return iter(log)


def read_lines(path: Path) -> Iterator[str]:
    """Stream a log file's lines (decoded leniently); refuse what is not a readable text file."""
    if not path.exists():
        raise FileProblem("does not exist", source=str(path))
    if path.is_dir():
        raise FileProblem("is a directory, not a log file", source=str(path))
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise FileProblem(f"cannot be read ({exc.strerror or exc})", source=str(path)) from None
    head = handle.read(_SNIFF)
    if not head.strip():
        handle.close()
        raise FileProblem("is empty: there is no log to diagnose", source=str(path))
    if b"\x00" in head:
        handle.close()
        raise FileProblem("is not text (it holds NUL bytes): give the job's text log", source=str(path))
    handle.seek(0)
    return _decode(handle)


def _decode(handle: io.BufferedReader) -> Iterator[str]:
    with handle, io.TextIOWrapper(handle, encoding="utf-8", errors="replace", newline="\n") as text:
        yield from text
