"""Matplotlib helpers for the raster figures that remain (run comparison, reservation Gantt, the
Arnold plan picture); the report's own charts are inline SVG (`loom.report.charts`)."""

from __future__ import annotations

import io
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

FLOOR_S = 1.0  # log axes cannot show 0 s: shorter delays are drawn at 1 s
DPI = 100
plt.rcParams.update({"font.size": 10, "axes.titlesize": 11, "axes.grid": True, "grid.alpha": 0.3,
                     "axes.spines.top": False, "axes.spines.right": False})


def to_png(fig: Any, tight: bool = True) -> bytes:
    """PNG bytes of `fig` (closed afterwards); `tight=False` keeps the figure's own layout, which
    saves drawing it twice to measure its text."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, **({"bbox_inches": "tight"} if tight else {}))
    plt.close(fig)
    return buf.getvalue()


__all__ = ["DPI", "FLOOR_S", "plt", "to_png"]
