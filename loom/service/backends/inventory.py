"""The local backend's inventory file: emulated nodes of G "GPUs", and how jobs are run on them.

A small YAML file, checked on load; every mistake is one `LoomInputError` naming the
file, line and field. The nodes come from exactly one of:

```yaml
nodes: 4                    # 4 emulated nodes (node0 … node3) on one leaf switch
gpus_per_node: 2
gpu_type: A100-80GB         # optional (default A100-80GB)
nodes_per_leaf: 2           # optional: leaves of 2 nodes under one spine
```

```yaml
cluster: yaml:lab.yaml      # a topology as `--cluster` takes it: a name or FORMAT:PATH
```                         # (a relative PATH is relative to this file)

```yaml
topology:                   # inline, in the `yaml:` cluster format: nodes with switch paths
  name: lab
  tiers: [{name: spine}, {name: leaf}]
  nodes:
    - {name: n0, path: [s0, l0], gpu_type: A100-80GB, gpus: 2}
    - {name: n1, path: [s0, l1], gpu_type: A100-80GB, gpus: 2}
```

and, optionally, how jobs run (defaults in `LocalSettings`):

```yaml
root: /var/lib/loom/local   # job directories, checkpoints, logs (relative: to this file)
launch_delay_s: 0           # emulated provisioning (image pull) before a job's processes start
grace_s: 30                 # a stop not acknowledged by then: SIGTERM; as long again: SIGKILL
hang_s: 600                 # no progress for this long: the job failed (0: never)
poll_s: 0.1                 # how often processes and control files are looked at
```
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from loom.errors import LoomInputError
from loom.hardware.clos import clos
from loom.hardware.topology import Topology

NODE_KEYS = ("nodes", "cluster", "topology")
KEYS = {*NODE_KEYS, "gpus_per_node", "gpu_type", "nodes_per_leaf", "root", "launch_delay_s", "grace_s",
        "hang_s", "poll_s"}


@dataclass(frozen=True)
class LocalSettings:
    """How the local backend runs jobs (see the module docstring for the file keys)."""

    root: Path | None = None  # None: chosen by whoever builds the backend (the service's data dir)
    launch_delay_s: float = 0.0
    grace_s: float = 30.0
    hang_s: float = 600.0
    poll_s: float = 0.1


@dataclass(frozen=True)
class LocalInventory:
    topology: Topology
    settings: LocalSettings


def emulated(nodes: int, gpus_per_node: int, gpu_type: str = "A100-80GB", nodes_per_leaf: int | None = None,
             name: str = "local") -> Topology:
    """`nodes` emulated nodes (node0, node1, …) of `gpus_per_node` GPUs, `nodes_per_leaf` to a leaf."""
    from loom.hardware.clos import MAX_NODES_PER_MINIPOD

    minipods = -(-nodes // MAX_NODES_PER_MINIPOD)  # as few minipods as hold them
    return clos(name, minipods=minipods, nodes=nodes, gpus_per_node=gpus_per_node, gpu_type=gpu_type,
                nodes_per_leaf=nodes_per_leaf or nodes, description=f"{nodes} emulated nodes × {gpus_per_node} GPUs")


def load_inventory(path: str | Path) -> LocalInventory:
    """Read and check an inventory file."""
    from loom.hardware.importers.yaml_spec import (  # the `yaml:` cluster format, for `topology`
        _Doc,
    )

    path = Path(path)
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LoomInputError("inventory file does not exist", source=source) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LoomInputError(f"cannot read the inventory file ({exc})", source=source) from None
    loader = yaml.SafeLoader(text)
    doc = _Doc(loader, source)
    try:
        root = loader.get_single_node()
        if root is None:
            raise LoomInputError("file is empty; expected a mapping with one of: " + ", ".join(NODE_KEYS),
                                 source=source)
        top = doc.mapping(root, KEYS, "")
        given = [k for k in NODE_KEYS if k in top]
        if len(given) != 1:
            what = "none" if not given else " and ".join(given)
            raise doc.fail(f"give exactly one of {', '.join(NODE_KEYS)} (found {what})", root,
                           given[1] if len(given) > 1 else "nodes")
        key = given[0]
        extras = [k for k in ("gpus_per_node", "gpu_type", "nodes_per_leaf") if k in top]
        if key != "nodes" and extras:
            raise doc.fail(f"'{extras[0]}' only goes with 'nodes' (the {key} says how many GPUs nodes have)",
                           top[extras[0]][0], extras[0])
        topology = _topology(doc, top, key, path)
        settings = _settings(doc, top, path)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise LoomInputError(f"invalid YAML: {getattr(exc, 'problem', None) or exc}", source=source,
                             line=mark.line + 1 if mark is not None else None) from None
    finally:
        loader.dispose()
    return LocalInventory(topology, settings)


def _topology(doc: Any, top: dict[str, Any], key: str, path: Path) -> Topology:
    from loom.hardware.clusters import load_cluster
    from loom.hardware.importers.yaml_spec import _build

    node = top[key][1]
    if key == "nodes":
        count = doc.integer(node, "nodes", 1, 4096)
        if "gpus_per_node" not in top:
            raise doc.fail("missing required key 'gpus_per_node' (GPUs of each emulated node)", node,
                           "gpus_per_node")
        gpus = doc.integer(top["gpus_per_node"][1], "gpus_per_node", 1, 64)
        gpu_type = "A100-80GB"
        if "gpu_type" in top:
            from loom.hardware.importers._common import resolve_gpu_type

            gnode = top["gpu_type"][1]
            gpu_type = resolve_gpu_type(doc.string(gnode, "gpu_type"), source=doc.source,
                                        line=gnode.start_mark.line + 1, field="gpu_type")
        per_leaf = doc.integer(top["nodes_per_leaf"][1], "nodes_per_leaf", 1, 4096) if "nodes_per_leaf" in top \
            else None
        return emulated(count, gpus, gpu_type, per_leaf, name=path.stem)
    if key == "cluster":
        spec = doc.string(node, "cluster")
        fmt, sep, rest = spec.partition(":")
        if sep and rest and not Path(rest).is_absolute():
            spec = f"{fmt}:{(path.parent / rest)}"
        try:
            return load_cluster(spec)
        except LoomInputError as exc:
            raise LoomInputError(f"cannot load cluster '{spec}': {exc}", source=doc.source,
                                 line=node.start_mark.line + 1, field="cluster") from None
    try:
        return _build(doc, node)
    except LoomInputError as exc:  # name the field below `topology`
        if exc.field is not None and not exc.field.startswith("topology"):
            exc.field = f"topology.{exc.field}".rstrip(".")
            exc.args = (exc.located(),)
        raise


def _settings(doc: Any, top: dict[str, Any], path: Path) -> LocalSettings:
    values: dict[str, Any] = {}
    if "root" in top:
        root = Path(doc.string(top["root"][1], "root")).expanduser()
        values["root"] = root if root.is_absolute() else (path.parent / root).resolve()
    for key, zero_ok in (("launch_delay_s", True), ("grace_s", False), ("hang_s", True), ("poll_s", False)):
        if key in top:
            values[key] = doc.number(top[key][1], key, allow_zero=zero_ok)
    if values.get("poll_s", 0.1) > 60:
        raise doc.fail("poll_s above 60 s would leave jobs unwatched for minutes", top["poll_s"][1], "poll_s")
    return LocalSettings(**values)
