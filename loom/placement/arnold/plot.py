"""A picture of a placement: the switch tree with nodes grouped by leaf and
minipod, the job's nodes coloured by PP group (or DP group), so an operator
sees at a glance which groups cross which switches.

Layout: one band per minipod (left to right), inside it one row per leaf
(top to bottom), one square per node. Job nodes carry their group colour and
stage/replica label; other nodes are light (free) or dark (busy/failed).
Only minipods holding the job are drawn when the cluster is large.
"""

from __future__ import annotations

import io
from html import escape
from pathlib import Path

import numpy as np

from loom.errors import LoomInputError
from loom.hardware.topology import Topology
from loom.placement.arnold.problem import JobShape, SpreadScore

FORMATS = (".png", ".svg", ".html")
MAX_DRAWN_MINIPODS = 16


def plot_placement(
    grid: np.ndarray,
    shape: JobShape,
    topology: Topology,
    path: str | Path,
    *,
    color_by: str = "pp",
    busy: np.ndarray | None = None,
    title: str = "",
    score: SpreadScore | None = None,
) -> Path:
    """Write the figure to `path` (.png, .svg or a self-contained .html)."""
    path = Path(path)
    if path.suffix not in FORMATS:
        raise LoomInputError(f"plot format must be one of {', '.join(FORMATS)}", field="plot")
    if color_by not in ("pp", "dp"):
        raise LoomInputError("colour by 'pp' or 'dp'", field="color_by")
    figure = draw(grid, shape, topology, color_by=color_by, busy=busy, title=title, score=score)
    if path.suffix == ".html":
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg", bbox_inches="tight")
        path.write_text(
            f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title or 'placement')}</title>"
            f"</head><body>{buffer.getvalue()}</body></html>"
        )
    else:
        figure.savefig(path, dpi=130, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(figure)
    return path


def draw(
    grid: np.ndarray,
    shape: JobShape,
    topology: Topology,
    *,
    color_by: str = "pp",
    busy: np.ndarray | None = None,
    title: str = "",
    score: SpreadScore | None = None,
):  # -> matplotlib Figure
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    group_of = _groups(grid, color_by)
    pods = topology.switch_of[topology.minipod_tier]
    leaves = topology.switch_of[topology.leaf_tier]
    drawn_pods = _pods_to_draw(grid, pods, topology)
    palette = plt.get_cmap("tab20")
    busy = np.zeros(topology.num_nodes, dtype=bool) if busy is None else busy
    width = 0.0
    layout: list[tuple[int, float, list[tuple[int, list[int]]]]] = []
    tallest = 1
    for pod in drawn_pods:
        pod_leaves = []
        for leaf in np.unique(leaves[pods == pod]):
            pod_leaves.append((int(leaf), np.flatnonzero((leaves == leaf) & (pods == pod)).tolist()))
        pod_width = max(len(nodes) for _, nodes in pod_leaves) + 1.0
        layout.append((int(pod), width, pod_leaves))
        tallest = max(tallest, len(pod_leaves))
        width += pod_width + 0.6
    fig, ax = plt.subplots(figsize=(min(24.0, 2.0 + width * 0.35), min(14.0, 1.8 + tallest * 0.45)))
    for pod, x0, pod_leaves in layout:
        ax.add_patch(Rectangle((x0 - 0.3, -0.6), max(len(n) for _, n in pod_leaves) + 0.6, len(pod_leaves) + 0.6,
                               fill=False, lw=1.2, ec="#555"))
        ax.text(x0, len(pod_leaves) + 0.15, topology.switch_names[topology.minipod_tier][pod], fontsize=7, va="bottom")
        for row, (_, nodes) in enumerate(pod_leaves):
            y = len(pod_leaves) - 1 - row
            for i, node in enumerate(nodes):
                group = group_of.get(node)
                if group is not None:
                    colour = palette(group % 20)
                elif busy[node]:
                    colour = "#666"
                else:
                    colour = "#e6e6e6"
                ax.add_patch(Rectangle((x0 + i, y - 0.4), 0.9, 0.8, color=colour))
                if group is not None and len(nodes) <= 32:
                    ax.text(x0 + i + 0.45, y, str(group), fontsize=5, ha="center", va="center")
    ax.set_xlim(-1, width)
    ax.set_ylim(-1, tallest + 1)
    ax.set_axis_off()
    caption = title or f"dp{shape.dp}·tp{shape.tp}·pp{shape.pp}"
    if score is not None:
        caption += (f" — DP spread {score.dp_max_spread}, PP spread {score.pp_max_spread},"
                    f" weighted {score.weighted_spread:.2f}")
    caption += f"; colour = {'PP group (matrix row)' if color_by == 'pp' else 'DP group (stage)'}"
    ax.set_title(caption, fontsize=9)
    return fig


def _groups(grid: np.ndarray, color_by: str) -> dict[int, int]:
    """Node → group number: rows are PP groups, columns DP groups."""
    rows, cols = grid.shape
    out = {}
    for r in range(rows):
        for c in range(cols):
            out[int(grid[r, c])] = r if color_by == "pp" else c
    return out


def _pods_to_draw(grid: np.ndarray, pods: np.ndarray, topology: Topology) -> list[int]:
    used = sorted(set(pods[grid.ravel()].tolist()))
    total = topology.num_switches(topology.minipod_tier)
    if total <= MAX_DRAWN_MINIPODS:
        return list(range(total))
    return used
