"""`zhejianglab:PATH` — Zhejiang Lab cluster_2000_A100 topology sheet (as CSV).

Columns: accessport, serverIP, nicname, portname, switchIP, switchname, sysname.
One row per server NIC → leaf-switch port; `sysname` is the server. The fabric
is rail-optimised: each server has 4 RoCE NICs to 4 different leaves, and the
servers of one hall row (leaf names `NH-DC-NM129-<Row><rack>-ROCE-Leaf-<n>`,
rows B, D, F, H, J) all use the same 4 leaves. Loom's tree (docs/CLUSTERS.md):
core (the 10 spines, one logical switch) → pod = the row of the server's
leaves → leaf = the server's rail-0 leaf, the lowest-numbered leaf it reaches
(rather than the first NIC in file order, which
differs for 2 of the 253 servers only because their rows are listed out of order). Every NIC of a
server must be in one row; otherwise the file is refused.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from loom.errors import LoomInputError
from loom.hardware.clusters import IMPORTERS
from loom.hardware.importers._common import natural_key, positive_int, read_text, resolve_gpu_type, split_query
from loom.hardware.topology import NodeDef, Tier, Topology

COLUMNS = ("accessport", "serverIP", "nicname", "portname", "switchIP", "switchname", "sysname")
LEAF_RE = re.compile(r"-(?P<row>[A-Z])\d+-ROCE-Leaf-(?P<leaf>\d+)\b")
PARAMS = ("gpu_type", "gpus_per_node")
# 200 Gb/s RoCE at every tier (README: 200 Gbps RoCE leaf-spine, 10 spines), 1:1.
TIERS = (
    Tier("core", bandwidth_gbps=200.0, latency_us=3.0),
    Tier("pod", bandwidth_gbps=200.0, latency_us=2.0),
    Tier("leaf", bandwidth_gbps=200.0, latency_us=1.0),
)


def load_zhejianglab(spec: str, name: str | None = None) -> Topology:
    path, params = split_query(spec, PARAMS)
    gpu_type = resolve_gpu_type(params.get("gpu_type", "A100-80GB"), source=path, field="gpu_type")
    gpus = positive_int(params.get("gpus_per_node", "8"), source=path, field="gpus_per_node")
    rows = list(csv.reader(io.StringIO(read_text(path, "topology sheet"))))
    while rows and not any(c.strip() for c in rows[-1]):
        rows.pop()
    if not rows:
        raise LoomInputError(f"file is empty; expected header {','.join(COLUMNS)}", source=path)
    header = [h.strip() for h in rows[0]]
    for col in ("switchname", "sysname"):
        if col not in header:
            raise LoomInputError(f"missing column (header is {','.join(header)})", source=path, line=1, field=col)
    sw_col, sys_col = header.index("switchname"), header.index("sysname")
    servers: dict[str, list[tuple[int, str, int, int]]] = {}  # sysname → (leaf no., row, line, order)
    for lineno, row in enumerate(rows[1:], start=2):
        if not any(c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise LoomInputError(f"expected {len(header)} columns, got {len(row)}", source=path, line=lineno)
        server = row[sys_col].strip()
        if not server:
            raise LoomInputError("empty server name", source=path, line=lineno, field="sysname")
        m = LEAF_RE.search(row[sw_col])
        if not m:
            raise LoomInputError(f"switch name '{row[sw_col]}' is not of the form ...-<Row><n>-ROCE-Leaf-<n>...",
                                 source=path, line=lineno, field="switchname")
        servers.setdefault(server, []).append((int(m.group("leaf")), m.group("row"), lineno, len(servers)))
    if not servers:
        raise LoomInputError("no servers after the header", source=path, field="sysname")
    defs = []
    for server in sorted(servers, key=natural_key):
        nics = servers[server]
        row_names = {r for _, r, _, _ in nics}
        if len(row_names) != 1:
            raise LoomInputError(f"server '{server}' has NICs on leaves of rows {sorted(row_names)}; "
                                 "expected one row", source=path, line=nics[0][2], field="switchname")
        leaf = min(n for n, _, _, _ in nics)
        pod = f"row-{nics[0][1]}"
        defs.append(NodeDef(server, ("spines", pod, f"leaf-{leaf}"), gpu_type, gpus))
    return Topology.build(name or Path(path).stem, TIERS, defs, minipod_tier="pod", source=path,
                          description="Zhejiang Lab cluster_2000_A100 (May 2024): rail-optimised 200G RoCE, "
                                      "pod per hall row")


IMPORTERS.add("zhejianglab", load_zhejianglab)
