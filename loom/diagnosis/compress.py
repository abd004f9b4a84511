"""Log compression: drop the routine lines of a training log, keep what may explain a failure.

Two kinds of filters, applied line by line (a log is streamed, never read whole):

* built-in, hand-written: blank lines, rules (`=====`), tqdm progress bars (`\\r`-separated
  updates) and the report of an exception the interpreter ignored (`Exception ignored in: ...`
  and its traceback, printed from a `__del__` or at exit: never why a job failed), which no
  corpus needs to teach;
* learned from the training split of the corpus: every line is masked into a template (numbers,
  hex, IPs, paths, URLs and timestamps replaced by placeholders, whitespace collapsed); templates
  seen in healthy runs, or in failed runs of at least `MIN_TYPES` different error types without
  an error word, are routine. They are kept as templates (an exact set lookup per line is what
  makes 10k lines cost milliseconds) and published as regexes (`FilterSet.regexes`). A filter is
  never learned for a line the rules would classify, so compression cannot hide a root cause.

`python bench/diagnosis.py --learn-filters` relearns `data/filters.json` from the corpus.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources
from pathlib import Path

MIN_TYPES = 3
MAX_KEPT = 50_000  # kept lines held in memory; a log with more is an error storm, its head suffices
FILTERS_VERSION = "1"

_PREFIX = re.compile(r"^\[(?:rank|default)(\d+)\]:\s?")
# (pattern, replacement, substring the line must hold for the pattern to apply: a cheap pre-check)
_MASKS = (
    (re.compile(r"\d{4}-\d{2}-\d{2}[ T_]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?"), "<TS>", ":"),
    (re.compile(r"^(\[?)[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d+ \d+ "), r"\1<GLOG> ", ":"),
    (re.compile(r"\[\w{3} \w{3} +\d+ \d{2}:\d{2}:\d{2} \d{4}\]"), "<TS>", ":"),
    (re.compile(r"^[\w.-]+:\d+:\d+ \[\d+\](?= NCCL )"), "<NCCL>", " NCCL "),
    (re.compile(r"\b([a-z][a-z0-9+.-]*)://\S+"), r"\1://<URL>", "://"),
    (re.compile(r"(?:/[\w.@+-]+){2,}/?"), "<P>", "/"),
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b"), "<IP>", "."),
    (re.compile(r"\b0x[0-9a-fA-F]+\b|\b[0-9a-f]{12,}\b"), "<H>", ""),
    (re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"), "<N>", ""),
)
_DIGITS = str.maketrans("123456789", "000000000")
_MEMO_SIZE = 200_000
_memo: dict[str, str] = {}
_PLACEHOLDER_RE = {
    "<TS>": r"(?:\d{4}-\d{2}-\d{2}[ T_]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?|\[\w{3} \w{3} +\d+ \d{2}:\d{2}:\d{2} \d{4}\])",
    "<GLOG>": r"[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d+ \d+", "<NCCL>": r"[\w.-]+:\d+:\d+ \[\d+\]", "<URL>": r"\S+", "<P>": r"(?:/[\w.@+-]+){2,}/?",
    "<IP>": r"\d{1,3}(?:\.\d{1,3}){3}", "<H>": r"(?:0x[0-9a-fA-F]+|[0-9a-f]{12,})",
    "<N>": r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?",
}
_PROGRESS = re.compile(r"^\s*\d{1,3}%\|.*\|\s*\d+/\d+\s*\[")
_RULE_LINE = re.compile(r"^\s*([=*-])\1{9,}\s*$")
# Error words: a template holding one is kept even if many failure types share it (watchdogs,
# torchrun summaries); retrieval also uses them to pick a log's error region.
ERROR_WORDS = re.compile(r"(?i)error|exception|traceback|fail|fatal|abort|killed|timeout|timed out|terminat|"
                         r"\blost\b|unreachable|refused|reset by peer|denied|diverg|spike|\bnan\b|cancel|"
                         r"evicted|notready|not ready")
# Evidence that the job failed rather than merely printed an error: a non-zero exit status, an
# uncaught traceback, a fatal error or deadly signal, the launcher or scheduler reporting a failed,
# killed, cancelled or requeued job, a node lost. Retrieval answers only when a log shows some (a
# healthy run's retried request or corrected PCIe error is no failure). Matched once per template;
# an exit status is read from the line itself (its digits are masked in the template).
_FAILED = re.compile(
    r"(?i:(?<!non-)\bfatal\b|terminate called|core dumped|segmentation fault|^\W*(?:bus error|aborted)\b|"
    r"\bSIG(?:KILL|ABRT|SEGV|BUS|TERM|INT|HUP)\b|\bsignal (?:\d+|<N>)\b|\bkill(?:ed|ing)\b|\bOOMKilled\b|"
    r"non-zero exit|exited abnormally|died with|\bcrash(?:ed|es)?\b|ChildFailedError|worker group failed|"
    r"\bcancell?ed\b|\brequeu(?:e|ed|ing)\b|\bpreempted\b|\bevicted\b|notready|backoff|node failure|"
    r"\bpanic\b|machine check|not responding|no route to host|\bjob\b.*\b(?:failed|aborted)\b|"
    r"\b(?:training|run|process|worker|task|step) (?:has )?(?:failed|aborted|crashed)\b|"
    r"\b(?:phase|status|state|reason)\W{1,3}(?:failed|error)\b|exiting run|giving up)|"
    r"\bNODE_FAIL\b|\bDUE TO\b|\bFAILED\b")
_EXIT = re.compile(r"(?i)\b(?:exit(?:ed)?(?: with)?(?: exit)? ?(?:code|status|value)|exitcode|exit_code|"
                   r"return ?code|returncode)\W{0,4}(-?\d+)(?::(\d+))?")
_TRACEBACK = "Traceback (most recent call last)"
_EXCEPTION_LINE = re.compile(r"(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Warning)\b")
_NO_EVIDENCE, _EVIDENCE, _EXIT_STATUS = 0, 1, 2
_evidence_memo: dict[str, int] = {}
MAX_EVIDENCE = 20


def _evidence_kind(template: str) -> int:
    kind = _evidence_memo.get(template)
    if kind is None:
        kind = (_EVIDENCE if _TRACEBACK in template or _FAILED.search(template) else
                _EXIT_STATUS if _EXIT.search(template.replace("<N>", "0")) else _NO_EVIDENCE)
        if len(_evidence_memo) >= _MEMO_SIZE:
            _evidence_memo.clear()
        _evidence_memo[template] = kind
    return kind


def failure_evidence(body: str, template: str) -> bool:
    """Whether this line shows that the job failed (a traceback: compress drops those of exceptions
    the interpreter ignored)."""
    kind = _evidence_kind(template)
    if kind == _EXIT_STATUS:
        return any(m.group(1) not in ("0", "-0") or (m.group(2) or "0") != "0" for m in _EXIT.finditer(body))
    return kind == _EVIDENCE


_TIMES = (
    (re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T_](\d{2}):(\d{2}):(\d{2})(?:[.,](\d+))?"), "iso"),
    (re.compile(r"^\[?[IWEF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d+)"), "glog"),
    (re.compile(r"\[\w{3} (\w{3}) +(\d+) (\d{2}):(\d{2}):(\d{2}) (\d{4})\]"), "dmesg"),
    (re.compile(r"^([A-Z][a-z]{2}) +(\d{1,2}) (\d{2}):(\d{2}):(\d{2}) \S+ "), "syslog"),  # RFC 3164: no year
)
_MONTHS = {m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov",
                                       "Dec"), 1)}


def split_prefix(line: str) -> tuple[int | None, str]:
    """(rank, rest) for a line with a torchrun `[rankN]:` / `[defaultN]:` prefix, else (None, line)."""
    m = _PREFIX.match(line)
    return (int(m.group(1)), line[m.end():]) if m else (None, line)


def mask(body: str) -> str:
    """The line's template: variable parts replaced by placeholders, whitespace collapsed.

    Memoised on the line with every digit turned into 0: no mask depends on which digit a
    position holds (only on where digits are and how many), so equal keys mean equal templates.
    Routine lines differ mostly in their digits, which makes most lookups hits.
    """
    key = body.translate(_DIGITS)
    template = _memo.get(key)
    if template is None:
        template = key
        for pattern, repl, needle in _MASKS:
            if needle in template:
                template = pattern.sub(repl, template)
        template = " ".join(template.split())
        if len(_memo) >= _MEMO_SIZE:
            _memo.clear()
        _memo[key] = template
    return template


def template_regex(template: str) -> str:
    """A regex matching the (prefix-stripped) lines whose template is `template`."""
    parts = re.split(r"(<TS>|<GLOG>|<NCCL>|<URL>|<P>|<IP>|<H>|<N>)", template)
    out = [(_PLACEHOLDER_RE[p] if p in _PLACEHOLDER_RE else r"\s+".join(map(re.escape, p.split(" "))))
           for p in parts]
    return r"^\s*" + "".join(out) + r"\s*$"


def timestamp(body: str, year: int) -> float | None:
    """Seconds since the epoch of a timestamp at the start of a line (ISO, glog, dmesg or syslog, whose
    year is that of the last timestamp seen), if any."""
    head = body[:64]
    if ":" not in head:
        return None
    for pattern, kind in _TIMES:
        m = pattern.search(head)
        if m is None:
            continue
        g = m.groups()
        try:
            if kind == "iso":
                return datetime(int(g[0]), int(g[1]), int(g[2]), int(g[3]), int(g[4]), int(g[5])).timestamp()
            if kind == "glog":
                return datetime(year, int(g[0]), int(g[1]), int(g[2]), int(g[3]), int(g[4])).timestamp()
            if kind == "syslog":
                if g[0] not in _MONTHS:
                    continue
                return datetime(year, _MONTHS[g[0]], int(g[1]), int(g[2]), int(g[3]), int(g[4])).timestamp()
            return datetime(int(g[5]), _MONTHS.get(g[0], 1), int(g[1]), int(g[2]), int(g[3]), int(g[4])).timestamp()
        except ValueError:
            return None
    return None


@dataclass(frozen=True, slots=True)
class FilterSet:
    """Learned routine-line templates (and their regexes), with where they came from."""

    templates: frozenset[str]
    learned_from: str = ""
    version: str = FILTERS_VERSION

    def regexes(self) -> tuple[str, ...]:
        """The filters as regexes over prefix-stripped lines (for people and other tools)."""
        return tuple(template_regex(t) for t in sorted(self.templates))

    def digest(self) -> str:
        return hashlib.sha256("\n".join(sorted(self.templates)).encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, object]:
        ordered = sorted(self.templates)
        return {"version": self.version, "learned_from": self.learned_from, "templates": ordered,
                "regexes": [template_regex(t) for t in ordered]}


@dataclass(frozen=True, slots=True)
class KeptLine:
    number: int  # 1-based line number in the original log
    rank: int | None
    text: str  # the original line (progress-bar segments removed)
    body: str  # without the launcher's rank prefix
    template: str
    time: float | None  # its own timestamp, else the last one seen before it


@dataclass
class CompressedLog:
    kept: list[KeptLine] = field(default_factory=list)
    lines_in: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    truncated: bool = False
    evidence: list[int] = field(default_factory=list)  # numbers of (the first) lines showing the job failed

    @property
    def ratio(self) -> float:
        """Bytes in over bytes kept (higher is better)."""
        return self.bytes_in / max(1, self.bytes_out)


def _ignored(state: dict[int | None, list[int]], rank: int | None, body: str) -> bool:
    """Whether the line belongs to the report of an exception the interpreter ignored (from a
    `__del__` or at exit: `Exception ignored in: ...`, its traceback and the exception line).
    `state` holds, per stream, how many such reports are open (unprefixed processes share one
    stream, so several may interleave) and how many more lines they may take; other lines
    interleaved with them are not part of them."""
    if body.startswith("Exception ignored"):
        open_ = state.setdefault(rank, [0, 0])
        open_[0], open_[1] = open_[0] + 1, 60
        return True
    open_ = state.get(rank)
    if open_ is None:
        return False
    open_[1] -= 1
    ended = _EXCEPTION_LINE.match(body) is not None
    if ended:
        open_[0] -= 1
    if open_[0] <= 0 or open_[1] <= 0:
        del state[rank]
    return ended or body[:1].isspace() or body.startswith(_TRACEBACK)


def compress(lines: Iterable[str], filters: FilterSet | None = None) -> CompressedLog:
    """Keep the lines no filter removes, with their numbers, ranks and times; streams `lines`."""
    routine = (filters or packaged_filters()).templates
    out = CompressedLog()
    now: float | None = None
    year = 1970
    ignored: dict[int | None, list[int]] = {}  # open reports of ignored exceptions (see _ignored)
    for number, raw in enumerate(lines, 1):
        line = raw.rstrip("\n")
        out.lines_in = number
        out.bytes_in += len(line) + 1
        if "\r" in line:
            line = "".join(seg for seg in line.split("\r") if not _PROGRESS.match(split_prefix(seg)[1]))
        rank, body = split_prefix(line)
        if not body.strip() or _RULE_LINE.match(body) or _PROGRESS.match(body):
            continue
        t = timestamp(body, year)
        if t is not None:
            now = t
            year = datetime.fromtimestamp(t).year
        if _ignored(ignored, rank, body):
            continue
        template = mask(body)
        if len(out.evidence) < MAX_EVIDENCE and failure_evidence(body, template):
            out.evidence.append(number)
        if template in routine:
            continue
        if len(out.kept) >= MAX_KEPT:
            out.truncated = True
            continue
        out.kept.append(KeptLine(number, rank, line, body, template, now))
        out.bytes_out += len(line) + 1
    return out


# -- learning ----------------------------------------------------------------------------------
def learn_filters(logs: Iterable[object], *, min_types: int = MIN_TYPES) -> FilterSet:
    """Routine templates from labelled logs (`corpus.LabelledLog`s of the training split only)."""
    from loom.diagnosis.corpus import HEALTHY
    from loom.diagnosis.rules import classify_line

    healthy: set[str] = set()
    types: dict[str, set[str]] = defaultdict(set)
    example: dict[str, str] = {}
    n_logs, names = 0, set()
    for log in logs:
        n_logs += 1
        names.add(log.template)  # type: ignore[attr-defined]
        seen: set[str] = set()
        ignored: dict[int | None, list[int]] = {}
        for raw in log.lines:  # type: ignore[attr-defined]
            rank, body = split_prefix(raw)
            if "\r" in body or not body.strip() or _ignored(ignored, rank, body):
                continue
            t = mask(body)
            if t in seen:
                continue
            seen.add(t)
            example.setdefault(t, body)
            if log.error_type == HEALTHY:  # type: ignore[attr-defined]
                healthy.add(t)
            else:
                types[t].add(log.error_type)  # type: ignore[attr-defined]
    shared = {t for t, ts in types.items() if len(ts) >= min_types and not ERROR_WORDS.search(t)}
    keep = frozenset(t for t in healthy | shared if classify_line(example[t]) is None)
    return FilterSet(keep, f"corpus v{_corpus_version()} training split: {n_logs} logs of {len(names)} templates")


def _corpus_version() -> str:
    from loom.diagnosis.corpus import GENERATOR_VERSION

    return GENERATOR_VERSION


def filters_from_json(data: dict[str, object]) -> FilterSet:
    templates = data.get("templates")
    if not isinstance(templates, list) or not all(isinstance(t, str) for t in templates):
        raise ValueError("filters.json: 'templates' must be a list of strings")
    return FilterSet(frozenset(templates), str(data.get("learned_from", "")), str(data.get("version", "")))


@functools.cache
def packaged_filters() -> FilterSet:
    """The filters shipped in data/filters.json (learned from the corpus's training split)."""
    ref = resources.files("loom.diagnosis").joinpath("data/filters.json")
    try:
        text = ref.read_text(encoding="utf-8")
    except FileNotFoundError:
        return FilterSet(frozenset(), "none (data/filters.json missing: only the built-in filters apply)")
    return filters_from_json(json.loads(text))


def write_filters(filters: FilterSet, path: Path) -> None:
    path.write_text(json.dumps(filters.to_json(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def relearn(path: Path | None = None) -> FilterSet:
    """Relearn the packaged filters from the corpus's training split (`bench/diagnosis.py --learn-filters`)."""
    from loom.diagnosis.corpus import generate

    filters = learn_filters(generate("train"))
    write_filters(filters, path or Path(__file__).with_name("data") / "filters.json")
    return filters
