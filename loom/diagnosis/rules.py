"""Rule-based classification of a compressed log into Acme's taxonomy, root cause first.

Every kept line is matched against an ordered list of rules (the first match claims the line).
A rule has a *tier*: how close to a root cause its error usually is. Hardware reports (Xid, ECC,
NVLink, a node lost) are tier 0; errors a process raises itself (CUDA errors, OOM, storage,
framework and script exceptions) tier 1; what peers see when a process dies (NCCL remote errors,
connection resets) tier 2; NCCL watchdog timeouts, which fire on every surviving rank minutes
later, tier 3. The diagnosis is the earliest-in-time match of the lowest tier, so an NCCL timeout
on ranks 0-6 never masks the CUDA error of rank 7, and a traceback repeated by every rank counts
once. A rule is *weak* when its match names a symptom more than a cause (a bare RuntimeError, an
exception the taxonomy does not know, a connection reset); the pipeline then asks retrieval.

To add a rule, append a `Rule` to RULES above the generic ones (order matters: specific first)
and add a corpus template that exercises it (see docs/DIAGNOSIS.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from loom.diagnosis.compress import CompressedLog, KeptLine
from loom.diagnosis.taxonomy import UNKNOWN

_XID = r"\bXid \(PCI:[^)]*\): "


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    error_type: str | None  # None: the line is claimed but never a root cause (e.g. torchrun's summary)
    tier: int
    pattern: re.Pattern[str]
    weak: bool = False


def _r(name: str, error_type: str | None, tier: int, pattern: str, weak: bool = False) -> Rule:
    return Rule(name, error_type, tier, re.compile(pattern), weak)


RULES: tuple[Rule, ...] = (
    _r("torchrun-summary", None, 9, r"ChildFailedError|^Root Cause \(first observed failure\)"),
    _r("ecc", "ECCError", 0, r"(?i)\becc error|uncorrectable ecc|double.bit ecc|\bDBE\b|" + _XID + r"(?:48|63|64|92|94|95)\b"),
    _r("nvlink", "NVLinkError", 0, r"(?i)nvlink:? (?:fatal )?error|uncorrectable nvlink|" + _XID + r"74\b"),
    _r("xid-gpu", "CUDAError", 0, _XID + r"(?:13|31|43|45|61|62|69|79)\b"),
    _r("node-failure", "NodeFailure", 0, r"(?i)\bnode failure\b|became NotReady|NodeStatusUnknown|"
                                         r"\bnode \S+ (?:is )?(?:down|unreachable|lost)\b"),
    _r("loss-spike", "LossSpike", 0, r"(?i)loss spike|loss is nan|\bnan loss\b|loss (?:is|became) inf"),
    _r("oom", "OOM", 1, r"(?i)out of memory|OutOfMemoryError"),
    _r("cuda", "CUDAError", 1, r"(?i)CUDA error|cudaError\w+|CUBLAS_STATUS_\w+|CUDNN_STATUS_\w+|unhandled cuda error|"
                               r"device-side assert triggered"),
    _r("storage", "StorageError", 1, r"S3StorageError|(?i:stale file handle)|\[Errno (?:5|28|121|122)\] "
                                     r"(?:Input/output error|No space left on device|Remote I/O error|Disk quota)"),
    _r("nccl-timeout", "NCCLTimeout", 3, r"Watchdog caught collective operation timeout|(?i:nccl timeout)"),
    _r("nccl-remote", "NCCLRemoteError", 2, r"ncclRemoteError|remote process exited or there was a network error|"
                                            r"NET/IB : Got completion from peer .* with error"),
    _r("connection-explicit", "ConnectionError", 1, r"\b(?:\w+\.)*exceptions\.ConnectionError\b|^ConnectionError:"),
    _r("connection-socket", "ConnectionError", 2, r"Connection reset by peer|Connection refused|Broken pipe|"
                                                  r"^(?:ConnectionResetError|ConnectionRefusedError|"
                                                  r"ConnectionAbortedError|BrokenPipeError)\b", weak=True),
)
_EXCEPTION = re.compile(r"^\s*(?:[A-Za-z_]\w*\.)*(?P<name>[A-Z]\w*(?:Error|Exception))(?::|$)")
EXCEPTIONS: dict[str, str] = {
    "RuntimeError": "RuntimeError", "ValueError": "ValueError", "AttributeError": "AttributeError",
    "ImportError": "ImportError", "ModuleNotFoundError": "ImportError", "KeyError": "KeyError",
    "FileNotFoundError": "FileNotFoundError", "SyntaxError": "SyntaxError", "IndentationError": "SyntaxError",
    "TabError": "SyntaxError", "TypeError": "TypeError", "NameError": "NameError", "UnboundLocalError": "NameError",
    "IndexError": "IndexError", "AssertionError": "AssertionError",
}
_RUNTIME = _r("exception:RuntimeError", "RuntimeError", 1, r"^", weak=True)  # a bare RuntimeError: what raised it?
_UNKNOWN_EXC = _r("exception:unknown", UNKNOWN, 1, r"^", weak=True)
_BY_EXCEPTION = {name: _r(f"exception:{name}", t, 1, r"^") for name, t in EXCEPTIONS.items() if name != "RuntimeError"}


# Every rule above needs one of these words, lower-cased (checked by tests/test_diagnosis.py on
# the corpus): plain substring tests reject most lines before any regex runs.
TRIGGERS = ("error", "ecc", "dbe", "xid", "nvlink", "node", "loss spike", "loss is", "loss became", "nan loss",
            "memory", "cuda", "cublas", "cudnn", "assert", "stale", "errno", "watchdog", "timeout", "nccl",
            "remote", "connection", "broken pipe", "exception", "root cause")


def classify_line(body: str) -> Rule | None:
    """The rule claiming this (prefix-stripped) line, if any."""
    low = body.lower()
    if not any(word in low for word in TRIGGERS):
        return None
    for rule in RULES:
        if rule.pattern.search(body):
            return rule
    m = _EXCEPTION.match(body)
    if m is None:
        return None
    name = m.group("name")
    if name == "RuntimeError":
        return _RUNTIME
    return _BY_EXCEPTION.get(name, _UNKNOWN_EXC)


@dataclass(frozen=True, slots=True)
class Match:
    rule: Rule
    line: KeptLine


@dataclass(frozen=True, slots=True)
class RulesResult:
    """The rules' verdict: the root-cause matches (first = the winner) and how sure they are."""

    error_type: str
    matches: tuple[Match, ...]
    ranks: tuple[int, ...]
    weak: bool

    @property
    def lines(self) -> tuple[KeptLine, ...]:
        return tuple(m.line for m in self.matches)


MAX_ROOT_LINES = 3


def _when(m: Match) -> tuple[float, int]:
    return (m.line.time if m.line.time is not None else float("-inf"), m.line.number)


def classify(log: CompressedLog) -> RulesResult | None:
    """The root cause by the rules, or None when no rule matched any line."""
    matches = [Match(rule, kept) for kept in log.kept
               if (rule := classify_line(kept.body)) is not None and rule.error_type is not None]
    if not matches:
        return None
    tier = min(m.rule.tier for m in matches)
    candidates = sorted((m for m in matches if m.rule.tier == tier), key=_when)
    winner = candidates[0]
    return RulesResult(winner.rule.error_type or UNKNOWN, _root_lines(winner, candidates),
                       _ranks(winner, candidates), winner.rule.weak)


def _root_lines(winner: Match, candidates: Sequence[Match]) -> tuple[Match, ...]:
    """The winner and up to two more lines stating the same error differently (one per template)."""
    out, templates = [winner], {winner.line.template}
    for m in candidates:
        if len(out) == MAX_ROOT_LINES:
            break
        if m.rule.error_type == winner.rule.error_type and m.line.template not in templates:
            out.append(m)
            templates.add(m.line.template)
    return tuple(out)


def _ranks(winner: Match, candidates: Sequence[Match]) -> tuple[int, ...]:
    """Ranks that reported the root cause (from launcher prefixes; empty when lines carry none)."""
    return tuple(sorted({m.line.rank for m in candidates
                         if m.rule.error_type == winner.rule.error_type and m.line.rank is not None}))
