"""`localize()`: the one call the service's recovery pipeline and `loom localize` make."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from loom.errors import LoomInputError
from loom.localize.cluster import AgentHub, Cluster, Launcher
from loom.localize.judge import SlowJudge
from loom.localize.model import Fault, Localisation, parse_faults
from loom.localize.strategy import METHODS, Runner

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_TENSOR_BYTES = 1 << 20  # 1 MiB per node, as a small NCCL all-gather test would send


def localize(
    nodes: Sequence[str],
    faults: Mapping[str, str | Fault] | None = None,
    *,
    method: str = "pairwise",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    tensor_bytes: int = DEFAULT_TENSOR_BYTES,
    slow_after_s: float | None = None,
    launcher: Launcher | None = None,
    node_env: Mapping[str, Mapping[str, str]] | None = None,
    progress: Callable[[str], None] | None = None,
    hub: AgentHub | None = None,
) -> Localisation:
    """Find the faulty nodes among `nodes` with all-gather tests between agents standing for them.

    `faults` injects faults by node (`hang`, `crash`, `wrong`, `slow`, `slow:SECONDS`: see
    `Fault`); a backend whose nodes carry their own faults passes them in `node_env` instead
    (`{"n3": {"LOOM_NODE_FAULT": "hang"}}`) and may start each agent itself with `launcher`
    (called with the node, the agent's argv and its full environment; it returns the started
    `Popen`, in a session of its own so it can be killed alone). By default agents are forked
    from one hub process that imports torch once. `timeout_s` is each test's gloo timeout: a
    hung node costs a round about `timeout_s` + 1 s + `timeout_s`/4. Every process started is
    killed before this returns. `hub`: an open `AgentHub` to fork agents from (and keep), instead
    of starting one (a torch import) per call.
    """
    names = _check(nodes, method, timeout_s, tensor_bytes)
    parsed = parse_faults(faults, names)
    say = progress or (lambda _text: None)
    say(f"starting {len(names)} agents")
    started = time.monotonic()
    with Cluster(names, parsed, timeout_s, tensor_bytes, launcher, dict(node_env or {}), hub) as cluster:
        cluster.start()
        startup = time.monotonic() - started
        runner = Runner(cluster, SlowJudge(slow_after_s if slow_after_s is not None else timeout_s / 2), say)
        began = time.monotonic()
        verdict = METHODS[method](runner, names)
        seconds = time.monotonic() - began
    return Localisation(
        nodes=names, method=method, faulty=verdict.faulty, suspects_round1=verdict.suspects_round1,
        rounds=verdict.rounds, tests=sum(len(r.groups) for r in verdict.rounds), seconds=seconds,
        startup_seconds=startup, undetermined=verdict.undetermined, notes=verdict.notes)


def _check(nodes: Sequence[str], method: str, timeout_s: float, tensor_bytes: int) -> tuple[str, ...]:
    names = tuple(str(n) for n in nodes)
    if len(names) < 2:
        raise LoomInputError(f"localisation needs at least 2 nodes (got {len(names)})", field="nodes")
    if len(set(names)) != len(names) or not all(n.strip() for n in names):
        raise LoomInputError("node names must be non-empty and distinct", field="nodes")
    if method not in METHODS:
        raise LoomInputError(f"unknown method '{method}' (known: {', '.join(METHODS)})", field="method")
    if not timeout_s > 0:
        raise LoomInputError(f"the timeout must be > 0 s (got {timeout_s})", field="timeout")
    if tensor_bytes < 4:
        raise LoomInputError(f"the tensor must be at least 4 bytes (got {tensor_bytes})", field="tensor_bytes")
    return names
