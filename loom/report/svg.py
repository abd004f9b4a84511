"""A job's placement on the switch tree as inline SVG: minipod boxes holding leaf-switch boxes
holding one square per node, the job's nodes coloured by the share of the node's GPUs it holds.

Plain SVG instead of a Matplotlib figure: a few thousand rectangles cost milliseconds as text,
where rasterising them cost ~0.5 s per job, and each node keeps its name as a tooltip.
"""

from __future__ import annotations

import html
import math
from typing import Any

from loom.report.data import common_prefix

LEAVES_PER_ROW = 12
NODE_COLS = 4
UNIT = 11.0  # px per layout unit at full width
WIDTH = 1240.0  # px available
LIGHT, DARK = (0x9E, 0xCA, 0xE1), (0x08, 0x30, 0x6B)


def shade(share: float) -> str:
    """Colour of a node the job holds `share` of (light = a few GPUs, dark = all of them)."""
    s = min(1.0, max(0.0, share))
    r, g, b = (round(lo + (hi - lo) * s) for lo, hi in zip(LIGHT, DARK))
    return f"#{r:02x}{g:02x}{b:02x}"


def _tree(topology: Any) -> dict[int, dict[int, list[int]]]:
    """minipod → leaf → nodes, in node order."""
    leaf_tier, pod_tier = len(topology.tiers) - 1, topology.minipod_tier
    pods: dict[int, dict[int, list[int]]] = {}
    for node in range(topology.num_nodes):
        pods.setdefault(int(topology.switch_of[pod_tier, node]), {}).setdefault(
            int(topology.switch_of[leaf_tier, node]), []).append(node)
    return pods


def placement_svg(topology: Any, placement: dict[str, Any]) -> str:
    """The SVG of one placement ({"job", "gpus", "nodes": {name: GPUs}, "decision", "time"})."""
    used = {topology.node_index[n]: g for n, g in placement["nodes"].items() if n in topology.node_index}
    pods = _tree(topology)
    leaf_tier, pod_tier = len(topology.tiers) - 1, topology.minipod_tier
    max_leaf = max(len(nodes) for leaves in pods.values() for nodes in leaves.values())
    max_leaves = min(LEAVES_PER_ROW, max(len(leaves) for leaves in pods.values()))
    leaf_w, leaf_h = NODE_COLS + 0.8, math.ceil(max_leaf / NODE_COLS) + 0.8
    pod_w = max_leaves * leaf_w + 0.6
    per_row = max(1, int((WIDTH / UNIT + 0.8) // (pod_w + 0.8)))  # small minipods side by side
    prefix = common_prefix(list(topology.switch_names[pod_tier]))
    out: list[str] = []
    y = band = 0.0
    for k, (pod, leaves) in enumerate(pods.items()):
        if k and k % per_row == 0:
            y, band = y + band, 0.0
        x0 = (k % per_row) * (pod_w + 0.8)
        rows = math.ceil(len(leaves) / LEAVES_PER_ROW)
        out.append(_pod(topology, pod, leaves, used, x0, y, pod_w, rows * leaf_h + 1.6, prefix))
        for i, (_, nodes) in enumerate(leaves.items()):
            lx, ly = x0 + 0.3 + (i % LEAVES_PER_ROW) * leaf_w, y + 1.4 + (i // LEAVES_PER_ROW) * leaf_h
            out.append(_leaf(topology, nodes, used, lx, ly, leaf_w - 0.3, leaf_h - 0.3))
        band = max(band, rows * leaf_h + 2.2)
    width, height = min(len(pods), per_row) * (pod_w + 0.8) - 0.8, y + band
    spans = [len({int(topology.switch_of[t, n]) for n in used}) for t in (leaf_tier, pod_tier)]
    title = (f"job {placement['job']}: {placement['gpus']} GPUs on {len(used)} nodes, {spans[0]} "
             f"{topology.tiers[leaf_tier].name} switch(es), {spans[1]} {topology.tiers[pod_tier].name}(s) "
             f"({placement['decision']} at t = {placement['time']:,.0f} s)")
    scale = min(UNIT, WIDTH / max(width, 1.0))
    return (f"<figure class='placement'><figcaption>{html.escape(title)}</figcaption>"
            f"<svg xmlns='http://www.w3.org/2000/svg' viewBox='-0.2 -0.2 {width + 0.4:.1f} {height:.1f}' "
            f"width='{(width + 0.4) * scale:.0f}' height='{height * scale:.0f}' role='img' "
            f"aria-label='{html.escape(title)}'>{''.join(out)}</svg></figure>")


def _pod(topology: Any, pod: int, leaves: dict[int, list[int]], used: dict[int, int], x: float, y: float,
         w: float, h: float, prefix: str) -> str:
    touched = sum(1 for nodes in leaves.values() if any(n in used for n in nodes))
    name = topology.switch_names[topology.minipod_tier][pod][len(prefix):]
    label = name + (f": job on {touched} of {len(leaves)} {topology.tiers[-1].name} switches" if touched else "")
    weight = " font-weight='bold'" if touched else ""
    return (f"<rect x='{x:.1f}' y='{y:.1f}' width='{w:.1f}' height='{h:.1f}' fill='none' stroke='#888' "
            f"stroke-width='.06'/><text x='{x + 0.2:.1f}' y='{y + 1.0:.1f}' font-size='.8'{weight}>"
            f"{html.escape(label)}</text>")


def _leaf(topology: Any, nodes: list[int], used: dict[int, int], x: float, y: float, w: float, h: float) -> str:
    hot = any(n in used for n in nodes)
    box = ("fill='#fff3e0' stroke='#e6550d' stroke-width='.12'" if hot else "fill='none' stroke='#aaa' "
           "stroke-width='.05'")
    parts = [f"<rect x='{x:.1f}' y='{y:.1f}' width='{w:.1f}' height='{h:.1f}' {box}/>"]
    for i, node in enumerate(nodes):
        nx, ny = x + 0.25 + (i % NODE_COLS), y + 0.25 + (i // NODE_COLS)
        if node in used:
            total = max(1, int(topology.node_gpus[node]))
            tip = f"{topology.node_names[node]}: {used[node]} of {total} GPUs"
            parts.append(f"<rect x='{nx:.2f}' y='{ny:.2f}' width='.8' height='.8' fill='{shade(used[node] / total)}'>"
                         f"<title>{html.escape(tip)}</title></rect>")
        else:
            parts.append(f"<rect x='{nx:.2f}' y='{ny:.2f}' width='.8' height='.8' fill='#e0e0e0'/>")
    return "".join(parts)
