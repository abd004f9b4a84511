"""Matplotlib figures of a run (Agg backend), returned as PNG bytes."""

from __future__ import annotations

import io
import math
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.collections import PatchCollection  # noqa: E402
from matplotlib.colors import LinearSegmentedColormap  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from loom.report.data import cdf, common_prefix  # noqa: E402

FLOOR_S = 1.0  # log axes cannot show 0 s: shorter delays are drawn at 1 s
DPI = 100
plt.rcParams.update({"font.size": 10, "axes.titlesize": 11, "axes.grid": True, "grid.alpha": 0.3,
                     "axes.spines.top": False, "axes.spines.right": False})


def to_png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def time_unit(span_s: float) -> tuple[float, str]:
    if span_s > 3 * 86400:
        return 86400.0, "days"
    if span_s > 3 * 3600:
        return 3600.0, "hours"
    return 60.0, "minutes"


def _cdf_axis(ax: Any, series: dict[str, np.ndarray], title: str, xlabel: str) -> None:
    for label, values in series.items():
        xs, ys = cdf(values)
        if xs.size == 0:
            continue
        below = float((xs < FLOOR_S).mean())
        note = f"; {100 * below:.0f}% < {FLOOR_S:g} s" if below > 0.01 else ""
        xs = np.maximum(xs, FLOOR_S)
        # at most ~2,000 points per curve: a CDF drawn from quantiles looks the same
        if xs.size > 2000:
            pick = np.unique(np.linspace(0, xs.size - 1, 2000).astype(int))
            xs, ys = xs[pick], ys[pick]
        ax.step(np.concatenate([[xs[0]], xs]), np.concatenate([[0.0], ys]), where="post",
                label=f"{label} (n={len(values):,}{note})", linewidth=1.4)
    ax.set_xscale("log")
    ax.set_ylim(0, 1.01)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of jobs")
    for seconds, text in ((60, "1 min"), (3600, "1 h"), (86400, "1 d")):
        ax.axvline(seconds, color="grey", linewidth=0.6, linestyle=":")
        ax.text(seconds, 0.02, text, color="grey", fontsize=8, ha="left")
    if ax.get_legend_handles_labels()[0]:  # no curve drawn (no finished job): no legend
        ax.legend(fontsize=8, loc="lower right")


def cdf_figure(rows: list[tuple[str, dict[str, np.ndarray], dict[str, np.ndarray]]]) -> bytes:
    """One row per grouping (overall, by class, by VC): JCT CDF left, queueing-delay CDF right."""
    fig, axes = plt.subplots(len(rows), 2, figsize=(12, 3.8 * len(rows)), squeeze=False)
    for (label, jct, queue), (left, right) in zip(rows, axes):
        _cdf_axis(left, jct, f"JCT — {label}", "job completion time (s, log)")
        _cdf_axis(right, queue, f"queueing delay — {label}", f"queueing delay (s, log; < {FLOOR_S:g} s drawn at "
                                                               f"{FLOOR_S:g} s)")
    fig.tight_layout()
    return to_png(fig)


def utilisation_figure(times: np.ndarray, levels: np.ndarray, binned: dict[str, np.ndarray], edges: np.ndarray,
                       capacity: int | None) -> bytes:
    fig, ax = plt.subplots(figsize=(12, 3.6))
    start = edges[0]
    scale, unit = time_unit(edges[-1] - start)
    if times.size <= 20000:
        ax.step((times - start) / scale, levels, where="post", linewidth=0.8, color="C0", label="busy GPUs")
    else:
        mids = (edges[:-1] - start) / scale
        ax.fill_between(mids, binned["min"], binned["max"], step="mid", color="C0", alpha=0.25, linewidth=0,
                        label="min–max in bin")
        ax.plot(mids, binned["mean"], color="C0", linewidth=1.0, label=f"mean per bin ({len(mids)} bins)")
    if capacity:
        ax.axhline(capacity, color="C3", linestyle="--", linewidth=1, label=f"capacity ({capacity:,} GPUs)")
        ax.set_ylim(0, capacity * 1.08)
    ax.set_xlim(0, (edges[-1] - start) / scale)
    ax.set_xlabel(f"time since first submission ({unit})")
    ax.set_ylabel("busy GPUs")
    ax.set_title("GPU utilisation over time")
    ax.legend(fontsize=8, loc="upper right", ncol=3)
    fig.tight_layout()
    return to_png(fig)


def heatmap_figure(heat: dict[str, Any]) -> bytes:
    groups, occ, edges = heat["groups"], heat["occupancy"], heat["edges"]
    height = min(14.0, max(2.5, 0.22 * len(groups) + 1.5))
    fig, ax = plt.subplots(figsize=(12, height))
    scale, unit = time_unit(edges[-1] - edges[0])
    extent = (0, (edges[-1] - edges[0]) / scale, len(groups) - 0.5, -0.5)
    image = ax.imshow(occ, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0, vmax=1, extent=extent)
    ax.grid(False)
    step = max(1, math.ceil(len(groups) / 40))
    ticks = list(range(0, len(groups), step))
    ax.set_yticks(ticks)
    ax.set_yticklabels([f"{groups[i]} ({int(heat['capacity'][i])})" for i in ticks], fontsize=7)
    ax.set_xlabel(f"time since first submission ({unit})")
    ax.set_ylabel(f"{heat['tier']} (GPUs)")
    ax.set_title(f"occupancy per {heat['tier']}: busy GPUs / capacity, mean per time bin")
    fig.colorbar(image, ax=ax, fraction=0.03, pad=0.01, label="occupancy")
    fig.tight_layout()
    return to_png(fig)


_JOB_CMAP = LinearSegmentedColormap.from_list("used", ["#9ecae1", "#08306b"])


def placement_figure(topology: Any, placement: dict[str, Any], per_row: int = 12, node_cols: int = 4) -> bytes:
    """The cluster as minipod boxes holding leaf boxes holding node squares; the job's nodes coloured."""
    leaf_tier, pod_tier = len(topology.tiers) - 1, topology.minipod_tier
    used = {topology.node_index[n]: g for n, g in placement["nodes"].items() if n in topology.node_index}
    pods: dict[int, dict[int, list[int]]] = {}
    for node in range(topology.num_nodes):
        pods.setdefault(int(topology.switch_of[pod_tier, node]), {}).setdefault(
            int(topology.switch_of[leaf_tier, node]), []).append(node)
    max_leaf = max(len(nodes) for leaves in pods.values() for nodes in leaves.values())
    max_leaves = min(per_row, max(len(leaves) for leaves in pods.values()))
    leaf_w, leaf_h = node_cols + 0.8, math.ceil(max_leaf / node_cols) + 1.6
    pod_w = max_leaves * leaf_w + 0.6
    pods_per_row = max(1, per_row // max_leaves)  # small minipods side by side
    prefix = common_prefix(list(topology.switch_names[pod_tier]))
    layout: list[tuple[int, float, float, int]] = []  # pod, x, y offsets, rows of leaves
    y, band = 0.0, 0.0
    for k, (pod, leaves) in enumerate(pods.items()):
        if k and k % pods_per_row == 0:
            y, band = y + band, 0.0
        rows = math.ceil(len(leaves) / per_row)
        layout.append((pod, (k % pods_per_row) * (pod_w + 0.8), y, rows))
        band = max(band, rows * leaf_h + 2.2)
    y += band
    width = min(len(pods), pods_per_row) * (pod_w + 0.8) - 0.8
    scale = min(0.3, 14.0 / width)
    fig, ax = plt.subplots(figsize=(max(5.0, width * scale + 1.5), max(2.0, y * scale + 0.6)))
    free, busy, busy_frac, boxes, hot_boxes = [], [], [], [], []
    for pod, x0, y0, rows in layout:
        leaves = pods[pod]
        boxes.append(Rectangle((x0, y0), pod_w, rows * leaf_h + 1.4))
        touched = sum(1 for nodes in leaves.values() if any(n in used for n in nodes))
        ax.text(x0 + 0.2, y0 + 0.9, topology.switch_names[pod_tier][pod][len(prefix):]
                + (f": job on {touched} of {len(leaves)} {topology.tiers[leaf_tier].name} switches" if touched else ""),
                fontsize=8, va="center", fontweight="bold" if touched else "normal")
        for k, (leaf, nodes) in enumerate(leaves.items()):
            lx, ly = x0 + 0.3 + (k % per_row) * leaf_w, y0 + 1.4 + (k // per_row) * leaf_h
            box = Rectangle((lx, ly), leaf_w - 0.3, leaf_h - 0.3)
            (hot_boxes if any(n in used for n in nodes) else boxes).append(box)
            for i, node in enumerate(nodes):
                square = Rectangle((lx + 0.25 + (i % node_cols), ly + 0.4 + (i // node_cols)), 0.8, 0.8)
                if node in used:
                    busy.append(square)
                    busy_frac.append(used[node] / max(1, int(topology.node_gpus[node])))
                else:
                    free.append(square)
    ax.add_collection(PatchCollection(boxes, facecolor="none", edgecolor="#888888", linewidth=0.6))
    ax.add_collection(PatchCollection(hot_boxes, facecolor="#fff3e0", edgecolor="#e6550d", linewidth=1.2))
    ax.add_collection(PatchCollection(free, facecolor="#e0e0e0", edgecolor="none"))
    if busy:
        coll = PatchCollection(busy, cmap=_JOB_CMAP, edgecolor="none")
        coll.set_array(np.asarray(busy_frac))
        coll.set_clim(0, 1)
        ax.add_collection(coll)
        fig.colorbar(coll, ax=ax, fraction=0.025, pad=0.01, label="share of node's GPUs used by the job")
    ax.set_xlim(-0.2, width + 0.2)
    ax.set_ylim(y, -0.5)
    ax.set_aspect("equal")
    ax.axis("off")
    spans = [len({int(topology.switch_of[t, n]) for n in used}) for t in (leaf_tier, pod_tier)]
    ax.set_title(f"job {placement['job']}: {placement['gpus']} GPUs on {len(used)} nodes, {spans[0]} "
                 f"{topology.tiers[leaf_tier].name}(s), {spans[1]} {topology.tiers[pod_tier].name}(s) "
                 f"({placement['decision']} at t={placement['time']:,.0f} s)", fontsize=10)
    fig.tight_layout()
    return to_png(fig)
