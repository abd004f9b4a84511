"""Rule-based classification of a compressed log into Acme's taxonomy, root cause first.

Every kept line is matched against an ordered list of rules (the first match claims the line).
A rule has a *tier*: how close to a root cause its error usually is. Hardware reports (Xid, ECC,
NVLink, a node lost) are tier 0; errors a process raises itself (CUDA errors, OOM, storage,
framework and script exceptions) tier 1; what peers see when a process dies (NCCL remote errors,
connection resets) tier 2; NCCL watchdog timeouts, which fire on every surviving rank minutes
later, tier 3. The diagnosis is the earliest-in-time match of the lowest tier, so an NCCL timeout
on ranks 0-6 never masks the CUDA error of rank 7, and a traceback repeated by every rank counts
once. A rule is *weak* when its match names a symptom more than a cause (a bare RuntimeError, an
exception the taxonomy does not know, a connection reset): a strong match of the same tier wins
over it even when later, and when only weak ones are left the pipeline asks retrieval.

To add a rule, append a `Rule` to RULES above the generic ones (order matters: specific first)
and add a corpus template that exercises it (see docs/DIAGNOSIS.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from loom.diagnosis.compress import CompressedLog, KeptLine
from loom.diagnosis.taxonomy import UNKNOWN, load_xid_codes

# NVIDIA's Xid catalogue (data/xid_codes.json, codes 1-172 from NVIDIA's "Analyzing Xid Errors with the
# Xid Catalog", https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html): what each
# kernel-reported GPU error code means in Acme's taxonomy, and its tier. Most are hardware reports
# (tier 0); 43 (a channel reset after the application's own fault) is what a process raises; 45
# (preemptive cleanup) follows a process being killed, so it ranks with the secondary errors and
# is weak; informational codes (injected errors, test messages, power smoothing) are no error.
XID_CODES: dict[int, tuple[str, int, bool]] = load_xid_codes()
# An Xid as the kernel (`NVRM: Xid (PCI:0000:3b:00): 79,`), DCGM (`XID error 79`) or a device
# plugin (`Xid=48`) prints it; NVSwitch's SXid is not an Xid (no word boundary before "Xid").
_XID = r"(?i:\bxid)(?: \((?:PCI:)?[0-9A-Fa-f:.]+\))?(?::| error:?|=)? *"
# DCGM health-watch failure codes (DCGM_FR_*), by the component they name.
_DCGM = r"\bDCGM_FR_\w*?"


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    error_type: str | None  # None: the line is claimed but never a root cause (e.g. torchrun's summary)
    tier: int
    pattern: re.Pattern[str]
    weak: bool = False


def _r(name: str, error_type: str | None, tier: int, pattern: str, weak: bool = False) -> Rule:
    return Rule(name, error_type, tier, re.compile(pattern), weak)


def _alt(*parts: str) -> str:
    """Alternatives, each in its own group; a part may start with `(?i)` to match ignoring case."""
    return "|".join(f"(?i:{p[4:]})" if p.startswith("(?i)") else f"(?:{p})" for p in parts)


def _xid_rules() -> tuple[Rule, ...]:
    groups: dict[tuple[str, int, bool], list[int]] = {}
    for code, key in sorted(XID_CODES.items()):
        groups.setdefault(key, []).append(code)
    return tuple(_r(f"xid:{t}:{tier}", t, tier, _XID + r"(?:" + "|".join(map(str, codes)) + r")\b", weak)
                 for (t, tier, weak), codes in groups.items())


RULES: tuple[Rule, ...] = (
    # claimed, never a root cause: the launcher's summary and its report of signals it sent
    _r("torchrun-summary", None, 9, r"ChildFailedError|^Root Cause \(first observed failure\)|"
                                    r"SignalException: Process \d+ got signal"),
    # -- tier 0: hardware and cluster reports (they explain the errors processes raise) --------------
    *_xid_rules(),
    _r("ecc", "ECCError", 0, _alt(r"(?i)\becc error|uncorrectable ecc|double.bit ecc|\bDBE\b",
                                  _DCGM + r"(?:DBE|SBE|ECC|RETIRED_PAGES|ROW_REMAP|UNCONTAINED)\w*")),
    _r("nvlink", "NVLinkError", 0, _alt(r"(?i)nvlink:? (?:fatal )?error|uncorrectable nvlink|nvswitch fatal error",
                                        r"\bSXid\b.*(?<![Nn]on-)\b[Ff]atal\b", _DCGM + r"(?:NVLINK|NVSWITCH)\w*",
                                        r"(?i)nvlink\b.*\b(?:is (?:currently )?down|inactive|training failed)")),
    _r("gpu-bus", "CUDAError", 0, _alt(r"(?i)fallen off the bus|\bGPU is lost\b|AER: Uncorrected",
                                       r"(?i)PCIe Bus Error: severity=Uncorrected",
                                       _DCGM + r"(?:FALLEN_OFF_BUS|GPU_LOST|PCI\w*)\b")),
    _r("nic-link-down", "NCCLRemoteError", 0, r"\bmlx\d_core\b.*\bLink down\b|\bib\d+: Link down\b"),
    # a scheduler requeueing the job says what it did, not why: below what a process raises itself
    _r("requeue", "NodeFailure", 2, r"(?i)\brequeu(?:e|ed|ing)\b"),
    _r("node-failure", "NodeFailure", 0, _alt(
        r"(?i)\bnode failure\b|became NotReady|NodeStatusUnknown|\bNodeLost\b|node\.kubernetes\.io/unreachable",
        r"(?i)\bnode \S+ (?:is )?(?:down|unreachable|lost)\b",
        r"\bNODE_FAIL\b|(?i:\bnodes? \S+ (?:is )?not responding)|\bNOT_RESPONDING\b|(?i:\bslurmd\b.*not responding)",
        r"(?i)\bReason=Not responding|\bState=DOWN\b|\bnodes? \S+ (?:set|marked|changed|state changed) (?:to )?DOWN\b",
        r"DUE TO (?:NODE FAILURE|PREEMPTION)",
        r"(?i)\bpod \S+ (?:was )?(?:preempted|evicted)\b",
        # the node's BMC / IPMI event log: power lost, a supply failed, the chassis went off
        r"(?i)\b(?:BMC|IPMI|ipmitool|SEL|Redfish|iDRAC|iLO)\b.*(?:\bpower\b.*\b(?:loss|lost|fail\w*|fault|off|down)\b|"
        r"\bAC lost\b|\bPSU?\d*\b.*\bfail|unexpected (?:reboot|reset|shutdown|power)|\bhard reset\b)",
        r"(?i)\b(?:AC|input) power (?:loss|lost)\b|\bpower supply \S* ?(?:failure|failed|lost)\b|\bPSU\d* (?:failure|failed)\b",
        # ... as `ipmitool sel list` prints it: id | date | time | sensor | event | Asserted
        r"(?i)\| (?:Power Supply|Power Unit|System ACPI Power State|Processor|Critical Interrupt)\b[^|]*\| *(?:Power "
        r"Supply AC lost|AC lost|Failure detected|Power off/down|S5/G2: soft-off|IERR|Machine Check|Bus Fatal Error|"
        r"Bus Uncorrectable Error|Fatal NMI)[^|]*\| *Asserted",
        # the node's kernel gave up: panic, fatal machine check, hard lockup, uncorrected host memory
        r"(?i)kernel panic|\bmachine check (?:exception|error|events? logged)|\bmce: \[Hardware Error\]|"
        r"fatal machine check|\bhard LOCKUP\b|\bUncorrected (?:hardware )?memory error",
        # the launcher cannot reach the node any more (pdsh/ssh, mpirun's daemons)
        r"(?i)\bssh exited with exit code 255\b|ssh: connect to host \S+ port \d+: |\bConnection closed by \S+ port 22\b|"
        r"kex_exchange_identification|lost communication with (?:a )?remote daemon|daemon \S* ?has unexpectedly failed")),
    _r("loss-spike", "LossSpike", 0, _alt(r"(?i)loss spike|\bnan loss\b|non-finite loss|\bloss['\"]?\s*(?:is|became|=|:)"
                                          r"\s*[-+]?(?:nan|inf)\b",
                                          r"(?i)minimum loss scale|loss scale already at minimum",
                                          r"(?i)\b(?:loss|training|model|run) (?:has )?diverged|divergence detected",
                                          r"(?i)found nan in (?:\w+ )*grad|grad(?:ient)?[ _]norm (?:is )?(?:nan|inf)\b|"
                                          r"gradient explosion")),
    # -- tier 1: what a process raises itself ---------------------------------------------------------
    _r("oom", "OOM", 1, _alt(r"(?i)out of memory|OutOfMemoryError|\bMemoryError\b|RESOURCE_EXHAUSTED",
                             r"_ALLOC_FAILED\b|cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY",
                             r"(?i)can't allocate memory|cannot allocate memory|out of shared memory",
                             r"\boom-kill(?:er)?\b|\bOOMKilled\b|Killed process \d+|killed by signal: Killed")),
    _r("oom-worker", "OOM", 1, r"DataLoader worker \(pid\(?s?\)? [\d, ]+\) exited unexpectedly", weak=True),
    _r("index-assert", "IndexError", 1, r"Assertion `[^`]*(?i:index|idx)[^`]*` failed|(?i:index out of bounds)"),
    _r("cuda", "CUDAError", 1, r"(?i)CUDA (?:driver )?error|cudaError\w+|CUDA_ERROR_\w+|CUBLAS_STATUS_\w+|"
                               r"CUDNN_STATUS_\w+|unhandled cuda error|Cuda failure|device-side assert triggered"),
    _r("storage", "StorageError", 1, _alt(
        r"S3\w*Error|(?i:stale file handle)|\[Errno (?:5|28|108|116|121|122)\] (?:Input/output error|"
        r"No space left on device|Remote I/O error|Disk quota|Cannot send after transport endpoint shutdown|"
        r"Stale file handle)",
        r"(?i)no space left on device|disk quota exceeded|QuotaExceeded",
        r"PytorchStreamWriter failed writing|file write failed|\bunexpected pos \d+ vs \d+",
        r"\bLustreError\b|evicted by \S*(?:MDT|OST)|\bnfs: server \S+ not responding|\bmmfs\w*: \[E\]",
        # object stores: throttling, 5xx and transport failures of their clients
        r"botocore\.exceptions\.(?:ClientError: An error occurred \((?:SlowDown|ServiceUnavailable|InternalError|"
        r"RequestTimeout|Throttl\w*|50\d)\)|EndpointConnectionError|ReadTimeoutError|ConnectTimeoutError|"
        r"ConnectionClosedError)",
        r"google\.api_core\.exceptions\.(?:ServiceUnavailable|TooManyRequests|InternalServerError|GatewayTimeout|"
        r"BadGateway|RetryError|DeadlineExceeded)",
        r"azure\.core\.exceptions\.(?:ServiceResponseError|ServiceRequestError|HttpResponseError: \((?:ServerBusy|"
        r"InternalError|OperationTimedOut)\))|\b503 Slow ?Down\b|reduce your request rate")),
    _r("connection-explicit", "ConnectionError", 1, _alt(
        r"\b(?:\w+\.)*exceptions\.ConnectionError\b|^ConnectionError:",
        r"requests\.exceptions\.(?:HTTPError|ConnectTimeout|ReadTimeout|ChunkedEncodingError)",
        r"urllib3\.exceptions\.(?:MaxRetryError|ProtocolError|NewConnectionError|ReadTimeoutError)|"
        r"Max retries exceeded with url",
        r"urllib\.error\.URLError|<urlopen error|http\.client\.RemoteDisconnected",
        r"\bwandb\.errors\.(?:\w+\.)?(?:CommError|UsageError)|"
        r"mlflow\.exceptions\.MlflowException: API request .* failed",
        r"StatusCode\.UNAVAILABLE|_InactiveRpcError|\betcd\w*\.exceptions\.\w+|\bredis\.exceptions\.\w+",
        r"\b5\d\d Server Error\b")),
    _r("framework-runtime", "RuntimeError", 1, r"^\s*(?:\w+\.)*RuntimeError: .*(?:" + _alt(
        r"Expected to (?:have finished reduction|mark a variable ready)", r"expected scalar type",
        r"must have the same dtype", r"same device|at least two devices", r"Error\(s\) in loading state_dict",
        r"size mismatch", r"shape '[^']*' is invalid", r"mat1 and mat2", r"The size of tensor a",
        r"Input type \(.*\) and weight type") + ")"),
    _r("import-binary", "ImportError", 1, r"undefined symbol: |cannot open shared object file"),
    # -- tier 2: what peers see when a process, node or link dies -----------------------------------
    _r("nccl-remote", "NCCLRemoteError", 2, _alt(
        r"ncclRemoteError|remote process exited or there was a network error",
        r"NET/IB : Got completion from peer .* with (?:error|status)",
        r"Connection closed by (?:remote )?peer.*(?:<\d+>|\]:\d+)|IBV_WC_\w+_ERR|ibv_poll_cq|"
        r"(?i:transport retry count(?:er)? exceeded)")),
    _r("host-unreachable", "NodeFailure", 2, r"(?i)\bNo route to host\b|\bHost is down\b|\[Errno 11[23]\]"),
    _r("node-keepalive", "NodeFailure", 2, r"failed to send a keep-alive heartbeat|Rendezvous(?:Connection|Closed)Error"),
    _r("c10d-socket", "NCCLRemoteError", 2, r"(?:c10d|gloo|ProcessGroup\w*|TCPStore|DistNetworkError).*"
                                            r"(?:Connection reset by peer|Connection closed by peer|Broken pipe)",
       weak=True),
    # -- tier 3: hangs, seen by the ranks that waited ----------------------------------------------------
    _r("nccl-timeout", "NCCLTimeout", 3, _alt(
        r"Watchdog caught collective operation timeout|(?i:nccl timeout)",
        r"Heartbeat monitor timed out|watchdog got stuck",
        r"Timed out waiting \d+ms for (?:recv|send) operation", r"(?i)no heartbeat received|training appears hung",
        r"(?i)detected stragglers")),
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
TRIGGERS = ("error", "ecc", "dbe", "xid", "dcgm_fr", "nvlink", "nvswitch", "aer:", "fallen off", "gpu is lost",
            "link down", "node", "pod ", "loss", "nan", "diverg", "grad", "memory", "oom", "alloc_failed", "killed",
            "cuda", "cublas", "cudnn", "assert", "stale", "errno", "quota", "space left", "streamwriter",
            "file write failed", "unexpected pos", "lustre", "nfs: server", "mmfs", "slow", "request rate",
            "watchdog", "timeout", "timed out", "heartbeat", "hung", "straggler", "nccl", "remote", "peer", "ibv_",
            "retry count", "connection", "broken pipe", "exception", "max retries", "urlopen", "statuscode",
            "_inactiverpc", "root cause", "signal", "undefined symbol", "shared object", "expected", "dtype",
            "device", "mat1", "size", "shape", "unavailable", "rendezvous", "requeu", "not_responding", "not responding", "=down",
            " down", "power", "psu", "ac lost", "hard reset", "unexpected", "panic", "machine check", "mce:",
            "lockup", "ssh", "kex_", "daemon", "route to host", "host is down", "processor", "critical interrupt")


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
    winner = next((m for m in candidates if not m.rule.weak), candidates[0])  # a symptom yields to a cause
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
