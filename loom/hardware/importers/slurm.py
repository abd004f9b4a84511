"""`slurm:PATH?gpu_type=T&gpus_per_node=N[&nodes=HOSTLIST]` — a Slurm topology.conf (topology/tree).

    # comment
    SwitchName=s0 Nodes=node[001-064]
    SwitchName=s1 Nodes=node[065-128]
    SwitchName=spine Switches=s[0-1]

Leaves are switches with `Nodes=`; parents are found through `Switches=`.
Rules (docs/CLUSTERS.md): every leaf must be at the same depth below its root
(no padding: a shallow branch is refused, naming the switch); several roots
are allowed and become several top-tier switches; a node may sit under only
one leaf; a switch has either `Nodes=` or `Switches=`. `nodes=HOSTLIST` in the
query lists the hosts you expect: any of them missing from every switch is an
error. Keys are case-insensitive as in Slurm; `LinkSpeed=` is accepted and
ignored.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from loom.errors import LoomInputError
from loom.hardware.clusters import IMPORTERS
from loom.hardware.importers._common import default_tiers, positive_int, read_text, resolve_gpu_type, split_query
from loom.hardware.topology import NodeDef, Topology

PARAMS = ("gpu_type", "gpus_per_node", "nodes", "name")
KEYS = {"switchname": "SwitchName", "nodes": "Nodes", "switches": "Switches", "linkspeed": "LinkSpeed",
        "level": "Level"}  # Level= is in `scontrol show topology`'s output, not topology.conf: ignored

MAX_HOSTS = 1_000_000  # one hostlist may name at most this many hosts


def expand_hostlist(expr: str) -> list[str]:
    """Slurm hostlist: `a[01-03,7],b`, `rack[1-2]-n[01-04]` (bracket groups multiply)."""
    expr = expr.strip()
    if not expr:
        raise ValueError("empty hostlist")
    out: list[str] = []
    for item in _split_top(expr):
        if not item:
            raise ValueError(f"empty item in hostlist '{expr}'")
        bodies = [m.group(1) for m in re.finditer(r"\[([^\[\]]*)\]", item)]
        # Count before expanding, so a huge product fails at once instead of
        # building millions of strings first.
        count = math.prod(sum(hi - lo + 1 for lo, hi, _ in _parse_ranges(b)) for b in bodies)
        if len(out) + count > MAX_HOSTS:
            raise ValueError(f"'{item}' expands to more than {MAX_HOSTS:,} hosts")
        parts: list[list[str]] = []
        pos = 0
        for m in re.finditer(r"\[([^\[\]]*)\]", item):
            parts.append([item[pos:m.start()]])
            parts.append(_expand_ranges(m.group(1)))
            pos = m.end()
        parts.append([item[pos:]])
        for piece in (p[0] for p in parts[::2]):
            if "[" in piece or "]" in piece:
                raise ValueError(f"unbalanced brackets in '{item}'")
        total = math.prod(len(p) for p in parts)
        if len(out) + total > MAX_HOSTS:
            raise ValueError(f"'{item}' expands to more than {MAX_HOSTS:,} hosts")
        out.extend("".join(combo) for combo in itertools.product(*parts))
    return out


def _split_top(expr: str) -> list[str]:
    items, depth, cur = [], 0, []
    for ch in expr:
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested brackets in '{expr}'")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced brackets in '{expr}'")
        if ch == "," and depth == 0:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise ValueError(f"unbalanced brackets in '{expr}'")
    items.append("".join(cur))
    return items


def _parse_ranges(body: str) -> list[tuple[int, int, int]]:
    """`01-03,7` → [(1, 3, 2), (7, 7, 1)]: (low, high, zero-padded width)."""
    out = []
    for part in body.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise ValueError(f"bad range '{part}' (expected N or N-M)")
        lo_s, hi_s = m.group(1), m.group(2) or m.group(1)
        lo, hi = int(lo_s), int(hi_s)
        if hi < lo:
            raise ValueError(f"range '{part}' runs backwards")
        if hi - lo >= MAX_HOSTS:
            raise ValueError(f"range '{part}' is too large")
        out.append((lo, hi, len(lo_s)))
    return out


def _expand_ranges(body: str) -> list[str]:
    return [f"{k:0{width}d}" for lo, hi, width in _parse_ranges(body) for k in range(lo, hi + 1)]


@dataclass
class _Switch:
    name: str
    line: int
    nodes: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Strip comments and join backslash continuations; keep the first line number."""
    out, buf, start = [], "", None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].rstrip()
        if start is None:
            start = lineno
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        if buf.strip():
            out.append((start, buf.strip()))
        buf, start = "", None
    if buf.strip() and start is not None:
        out.append((start, buf.strip()))
    return out


def load_slurm_topology(spec: str) -> Topology:
    path, params = split_query(spec, PARAMS)
    if "gpu_type" not in params:
        raise LoomInputError("Slurm topology.conf has no GPU information: add '?gpu_type=TYPE' "
                             "(and '&gpus_per_node=N', default 8) to the cluster spec", source=path, field="gpu_type")
    gpu_type = resolve_gpu_type(params["gpu_type"], source=path, field="gpu_type")
    gpus = positive_int(params.get("gpus_per_node", "8"), source=path, field="gpus_per_node", allow_zero=True)
    text = read_text(path, "Slurm topology.conf")
    from pathlib import Path

    return tree_topology(text, source=path, gpus_of=lambda _host: (gpu_type, gpus),
                         name=params.get("name") or Path(path).stem, expected=params.get("nodes"),
                         description=f"Slurm topology.conf {path}")


def tree_topology(text: str, *, source: str, gpus_of: Callable[[str], tuple[str, int]], name: str,
                  expected: str | None = None, description: str = "") -> Topology:
    """The switch tree of topology.conf text (or `scontrol show topology` output); `gpus_of(host)`
    gives each node's (GPU type, GPU count)."""
    path = source
    switches: dict[str, _Switch] = {}
    for lineno, line in _logical_lines(text):
        fields: dict[str, str] = {}
        for token in line.split():
            key, eq, value = token.partition("=")
            canon = KEYS.get(key.lower())
            if not eq:
                raise LoomInputError(f"expected KEY=VALUE, got '{token}'", source=path, line=lineno)
            if canon is None:
                raise LoomInputError(f"unknown key (allowed: {', '.join(KEYS.values())})", source=path,
                                     line=lineno, field=key)
            if canon in fields:
                raise LoomInputError("key given twice", source=path, line=lineno, field=canon)
            fields[canon] = value
        if "SwitchName" not in fields:
            raise LoomInputError("line does not define a switch", source=path, line=lineno, field="SwitchName")
        name = fields["SwitchName"]
        if not name or "/" in name or "[" in name:
            raise LoomInputError(f"bad switch name '{name}'", source=path, line=lineno, field="SwitchName")
        if name in switches:
            raise LoomInputError(f"switch '{name}' already defined on line {switches[name].line}", source=path,
                                 line=lineno, field="SwitchName")
        sw = _Switch(name, lineno)
        if "Nodes" in fields and "Switches" in fields:
            raise LoomInputError("a switch has either Nodes= (a leaf) or Switches= (a parent), not both",
                                 source=path, line=lineno, field="Switches")
        for key in ("Nodes", "Switches"):
            if key in fields:
                try:
                    names = expand_hostlist(fields[key])
                except ValueError as exc:
                    raise LoomInputError(f"bad hostlist: {exc}", source=path, line=lineno, field=key) from None
                if len(set(names)) != len(names):
                    dup = next(n for n in names if names.count(n) > 1)
                    raise LoomInputError(f"'{dup}' is listed twice", source=path, line=lineno, field=key)
                (sw.nodes if key == "Nodes" else sw.children).extend(names)
        if not sw.nodes and not sw.children:
            raise LoomInputError("switch has neither Nodes= nor Switches=", source=path, line=lineno,
                                 field="SwitchName")
        switches[name] = sw
    if not switches:
        raise LoomInputError("file is empty; expected 'SwitchName=... Nodes=...' lines", source=path)

    parent: dict[str, str] = {}
    for sw in switches.values():
        for child in sw.children:
            if child not in switches:
                raise LoomInputError(f"switch '{sw.name}' lists unknown switch '{child}'", source=path,
                                     line=sw.line, field="Switches")
            if child in parent:
                raise LoomInputError(f"switch '{child}' is under both '{parent[child]}' and '{sw.name}'",
                                     source=path, line=sw.line, field="Switches")
            if child == sw.name:
                raise LoomInputError(f"switch '{child}' lists itself", source=path, line=sw.line, field="Switches")
            parent[child] = sw.name

    def chain(name: str) -> list[str]:
        seen = [name]
        while seen[-1] in parent:
            up = parent[seen[-1]]
            if up in seen:
                cycle = " → ".join([*seen[seen.index(up):], up])
                raise LoomInputError(f"switch cycle: {cycle}", source=path, line=switches[up].line,
                                     field="Switches")
            seen.append(up)
        return seen[::-1]  # root → this switch

    for name in switches:  # cycles with no leaf below them still count
        chain(name)
    leaves = [sw for sw in switches.values() if sw.nodes]
    paths = {sw.name: tuple(chain(sw.name)) for sw in leaves}
    depth = max(len(p) for p in paths.values())
    for sw in leaves:
        if len(paths[sw.name]) != depth:
            raise LoomInputError(
                f"leaf switch '{sw.name}' is {len(paths[sw.name])} level(s) deep ({' → '.join(paths[sw.name])}) "
                f"but other leaves are {depth}; Loom needs every leaf at the same depth",
                source=path, line=sw.line, field="Switches")

    owner: dict[str, _Switch] = {}
    defs: list[NodeDef] = []
    for sw in leaves:
        for host in sw.nodes:
            if host in owner:
                raise LoomInputError(f"node '{host}' is under both '{owner[host].name}' (line {owner[host].line}) "
                                     f"and '{sw.name}'", source=path, line=sw.line, field="Nodes")
            owner[host] = sw
            defs.append(NodeDef(host, paths[sw.name], *gpus_of(host)))
    if expected is not None:
        try:
            expected_hosts = expand_hostlist(expected)
        except ValueError as exc:
            raise LoomInputError(f"bad hostlist: {exc}", source=path, field="nodes") from None
        missing = [h for h in expected_hosts if h not in owner]
        if missing:
            more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
            raise LoomInputError(f"node '{missing[0]}'{more} is under no switch", source=path, field="nodes")
    names = ["leaf"] if depth == 1 else ["spine", "leaf"] if depth == 2 else \
        ["core", "spine", "leaf"] if depth == 3 else [*(f"tier{i}" for i in range(depth - 2)), "spine", "leaf"]
    return Topology.build(name, default_tiers(names), defs, source=path, description=description)


IMPORTERS.add("slurm", load_slurm_topology)
