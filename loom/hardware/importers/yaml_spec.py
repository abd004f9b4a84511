"""`yaml:PATH` — a hand-written cluster spec (format in docs/CLUSTERS.md).

The document is composed into YAML nodes rather than loaded into plain dicts
so every error can name the line, and duplicate keys stay visible.
"""

from __future__ import annotations

import math
from typing import Any

import yaml

from loom.errors import LoomInputError
from loom.hardware.clusters import IMPORTERS
from loom.hardware.importers._common import read_text, resolve_gpu_type
from loom.hardware.topology import NodeDef, Tier, Topology

TOP_KEYS = {"name", "description", "tiers", "minipod_tier", "nodes"}
TIER_KEYS = {"name", "bandwidth_gbps", "latency_us", "oversubscription"}
NODE_KEYS = {"name", "path", "gpu_type", "gpus"}
GROUP_KEYS = {"path", "count", "gpu_type", "gpus", "prefix", "start", "width"}


class _Doc:
    def __init__(self, loader: yaml.SafeLoader, source: str) -> None:
        self.loader = loader
        self.source = source

    def fail(self, message: str, node: yaml.Node | None, field: str | None) -> LoomInputError:
        line = node.start_mark.line + 1 if node is not None else None
        return LoomInputError(message, source=self.source, line=line, field=field)

    def mapping(self, node: yaml.Node, allowed: set[str], field: str) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(f"expected a mapping with keys {', '.join(sorted(allowed))}", node, field)
        out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            where = f"{field}.{key}" if field else str(key)
            if key not in allowed:
                raise self.fail(f"unknown key '{key}' (allowed: {', '.join(sorted(allowed))})", key_node, where)
            if key in out:
                raise self.fail(f"duplicate key '{key}'", key_node, where)
            out[key] = (key_node, value_node)
        return out

    def value(self, node: yaml.Node) -> Any:
        return self.loader.construct_object(node, deep=True)

    def string(self, node: yaml.Node, field: str) -> str:
        v = self.value(node)
        if not isinstance(node, yaml.ScalarNode) or not isinstance(v, str) or not v.strip():
            raise self.fail(f"expected a non-empty string, got {v!r}", node, field)
        return v.strip()

    def integer(self, node: yaml.Node, field: str, minimum: int, maximum: int = 1_000_000) -> int:
        v = self.value(node)
        if isinstance(v, bool) or not isinstance(v, int) or not minimum <= v <= maximum:
            raise self.fail(f"expected an integer from {minimum} to {maximum:,}, got {v!r}", node, field)
        return v

    def number(self, node: yaml.Node, field: str, allow_zero: bool) -> float:
        v = self.value(node)
        ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
        if not ok or v < 0 or (v == 0 and not allow_zero):
            kind = "a non-negative" if allow_zero else "a positive"
            raise self.fail(f"expected {kind} number, got {v!r}", node, field)
        return float(v)

    def path(self, node: yaml.Node, field: str, depth: int) -> tuple[str, ...]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail("expected a list of switch names, top → leaf", node, field)
        parts = tuple(self.string(item, f"{field}[{i}]") for i, item in enumerate(node.value))
        if len(parts) != depth:
            raise self.fail(f"switch path has {len(parts)} levels, the cluster has {depth} tiers", node, field)
        bad = [p for p in parts if "/" in p]
        if bad:
            raise self.fail(f"switch name '{bad[0]}' must not contain '/'", node, field)
        return parts


def load_yaml_cluster(spec: str) -> Topology:
    source = spec
    text = read_text(spec, "cluster spec")
    loader = yaml.SafeLoader(text)
    doc = _Doc(loader, source)
    try:
        root = loader.get_single_node()
        if root is None:
            raise LoomInputError("file is empty; expected a cluster spec mapping", source=source)
        return _build(doc, root)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        raise LoomInputError(f"invalid YAML: {problem}", source=source,
                             line=mark.line + 1 if mark is not None else None) from None
    finally:
        loader.dispose()


def _build(doc: _Doc, root: yaml.Node) -> Topology:
    top = doc.mapping(root, TOP_KEYS, "")
    for required in ("name", "tiers", "nodes"):
        if required not in top:
            raise doc.fail(f"missing required key '{required}'", root, required)
    name = doc.string(top["name"][1], "name")
    description = doc.string(top["description"][1], "description") if "description" in top else ""

    tiers_node = top["tiers"][1]
    if not isinstance(tiers_node, yaml.SequenceNode) or not tiers_node.value:
        raise doc.fail("expected a non-empty list of tiers, top → leaf", tiers_node, "tiers")
    tiers: list[Tier] = []
    for i, tnode in enumerate(tiers_node.value):
        field = f"tiers[{i}]"
        t = doc.mapping(tnode, TIER_KEYS, field)
        if "name" not in t:
            raise doc.fail("missing required key 'name'", tnode, f"{field}.name")
        kwargs: dict[str, Any] = {"name": doc.string(t["name"][1], f"{field}.name")}
        for key in ("bandwidth_gbps", "latency_us", "oversubscription"):
            if key in t:
                kwargs[key] = doc.number(t[key][1], f"{field}.{key}", allow_zero=key == "latency_us")
        if any(x.name == kwargs["name"] for x in tiers):
            raise doc.fail(f"tier '{kwargs['name']}' appears twice", t["name"][1], f"{field}.name")
        tiers.append(Tier(**kwargs))
    depth = len(tiers)

    minipod = None
    if "minipod_tier" in top:
        mnode = top["minipod_tier"][1]
        minipod = doc.string(mnode, "minipod_tier")
        if minipod not in [t.name for t in tiers]:
            raise doc.fail(f"'{minipod}' is not one of the tiers {[t.name for t in tiers]}", mnode, "minipod_tier")

    nodes_node = top["nodes"][1]
    if not isinstance(nodes_node, yaml.SequenceNode) or not nodes_node.value:
        raise doc.fail("expected a non-empty list of nodes or node groups", nodes_node, "nodes")
    defs: list[NodeDef] = []
    seen: dict[str, int] = {}
    counters: dict[str, int] = {}
    for i, item in enumerate(nodes_node.value):
        field = f"nodes[{i}]"
        is_group = isinstance(item, yaml.MappingNode) and any(
            isinstance(k, yaml.ScalarNode) and k.value == "count" for k, _ in item.value)
        entry = doc.mapping(item, GROUP_KEYS if is_group else NODE_KEYS, field)
        required = ("path", "count", "gpu_type", "gpus") if is_group else ("name", "path", "gpu_type", "gpus")
        for key in required:
            if key not in entry:
                raise doc.fail(f"missing required key '{key}'", item, f"{field}.{key}")
        path = doc.path(entry["path"][1], f"{field}.path", depth)
        gnode = entry["gpu_type"][1]
        gpu_type = resolve_gpu_type(doc.string(gnode, f"{field}.gpu_type"), source=doc.source,
                                    line=gnode.start_mark.line + 1, field=f"{field}.gpu_type")
        gpus = doc.integer(entry["gpus"][1], f"{field}.gpus", 0)
        if is_group:
            count = doc.integer(entry["count"][1], f"{field}.count", 1)
            prefix = doc.string(entry["prefix"][1], f"{field}.prefix") if "prefix" in entry else "node"
            start = doc.integer(entry["start"][1], f"{field}.start", 0) if "start" in entry \
                else counters.get(prefix, 1)
            width = doc.integer(entry["width"][1], f"{field}.width", 1, 12) if "width" in entry else 3
            names = [f"{prefix}{k:0{width}d}" for k in range(start, start + count)]
            counters[prefix] = start + count
            name_node = item
        else:
            name_node = entry["name"][1]
            names = [doc.string(name_node, f"{field}.name")]
        for host in names:
            if host in seen:
                raise doc.fail(f"host '{host}' is already defined by nodes[{seen[host]}]", name_node,
                               f"{field}.name" if not is_group else f"{field}.prefix")
            seen[host] = i
            defs.append(NodeDef(host, path, gpu_type, gpus))
    return Topology.build(name, tiers, defs, minipod_tier=minipod, description=description, source=doc.source)


IMPORTERS.add("yaml", load_yaml_cluster)
