"""`tiers-csv:PATH[?gpu_type=T&gpus_per_node=N]` — a host table with one column per switch tier.

    host,spine,leaf,gpu_type,gpus
    n001,spine0,leaf0,H100,8

The first column is the host; every other column except `gpu_type` and
`gpus` is a switch tier, top → leaf, named by its header. Switch names are
scoped by their parent (leaf0 under spine0 ≠ leaf0 under spine1). Missing
`gpu_type`/`gpus` columns (or empty cells) fall back to the query defaults.
Every tier gets the documented defaults: 400 Gb/s, 1:1.
"""

from __future__ import annotations

import csv
import io

from loom.errors import LoomInputError
from loom.hardware.clusters import IMPORTERS
from loom.hardware.importers._common import default_tiers, positive_int, read_text, resolve_gpu_type, split_query
from loom.hardware.topology import NodeDef, Topology

PARAMS = ("gpu_type", "gpus_per_node", "name")
ATTR_COLUMNS = ("gpu_type", "gpus")


def load_tiers_csv(spec: str) -> Topology:
    path, params = split_query(spec, PARAMS)
    text = read_text(path, "host table")
    rows = list(csv.reader(io.StringIO(text)))
    while rows and not any(c.strip() for c in rows[-1]):
        rows.pop()
    if not rows:
        raise LoomInputError("file is empty; expected a header row 'host,<tier>,...,<leaf tier>'", source=path)
    header = [h.strip() for h in rows[0]]
    if len(header) < 2 or not header[0]:
        raise LoomInputError("header needs a host column and at least one switch-tier column", source=path,
                             line=1, field="header")
    for col in header:
        if not col:
            raise LoomInputError("empty column name", source=path, line=1, field="header")
        if header.count(col) > 1:
            raise LoomInputError("column appears twice", source=path, line=1, field=col)
    tier_cols = [i for i, h in enumerate(header) if i > 0 and h not in ATTR_COLUMNS]
    if not tier_cols:
        raise LoomInputError("no switch-tier columns (only host, gpu_type, gpus)", source=path, line=1,
                             field="header")
    type_col = header.index("gpu_type") if "gpu_type" in header else None
    gpus_col = header.index("gpus") if "gpus" in header else None

    default_type = None
    if "gpu_type" in params:
        default_type = resolve_gpu_type(params["gpu_type"], source=path, field="gpu_type")
    default_gpus = None
    if "gpus_per_node" in params:
        default_gpus = positive_int(params["gpus_per_node"], source=path, field="gpus_per_node", allow_zero=True)

    defs: list[NodeDef] = []
    seen: dict[str, int] = {}
    for lineno, row in enumerate(rows[1:], start=2):
        if not any(c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise LoomInputError(f"expected {len(header)} columns, got {len(row)}", source=path, line=lineno)
        cells = [c.strip() for c in row]
        host = cells[0]
        if not host:
            raise LoomInputError("empty host name", source=path, line=lineno, field=header[0])
        if host in seen:
            raise LoomInputError(f"host '{host}' already listed on line {seen[host]}", source=path, line=lineno,
                                 field=header[0])
        seen[host] = lineno
        switch_path = []
        for i in tier_cols:
            if not cells[i]:
                raise LoomInputError("empty switch name", source=path, line=lineno, field=header[i])
            if "/" in cells[i]:
                raise LoomInputError(f"switch name '{cells[i]}' must not contain '/'", source=path, line=lineno,
                                     field=header[i])
            switch_path.append(cells[i])
        if type_col is not None and cells[type_col]:
            gpu_type = resolve_gpu_type(cells[type_col], source=path, line=lineno, field="gpu_type")
        elif default_type is not None:
            gpu_type = default_type
        else:
            raise LoomInputError("no GPU type: add a gpu_type column or '?gpu_type=TYPE' to the cluster spec",
                                 source=path, line=lineno, field="gpu_type")
        if gpus_col is not None and cells[gpus_col]:
            gpus = positive_int(cells[gpus_col], source=path, line=lineno, field="gpus", allow_zero=True)
        elif default_gpus is not None:
            gpus = default_gpus
        else:
            raise LoomInputError("no GPU count: add a gpus column or '?gpus_per_node=N' to the cluster spec",
                                 source=path, line=lineno, field="gpus")
        defs.append(NodeDef(host, tuple(switch_path), gpu_type, gpus))
    if not defs:
        raise LoomInputError("no hosts after the header", source=path, field=header[0])
    name = params.get("name") or _stem(path)
    return Topology.build(name, default_tiers([header[i] for i in tier_cols]), defs, source=path,
                          description=f"imported from {path}")


def _stem(path: str) -> str:
    from pathlib import Path

    return Path(path).stem


IMPORTERS.add("tiers-csv", load_tiers_csv)
