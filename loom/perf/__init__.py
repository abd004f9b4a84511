"""Performance estimation: model specs, parameter counts, FLOPs, presets (issue 4)."""

from loom.perf.flops import (
    CNN_SPATIAL_REUSE,
    RECOMPUTE,
    attention_core_flops,
    flops_per_iteration,
    forward_flops,
    megatron_flops,
)
from loom.perf.model import ModelSpec
from loom.perf.presets import load_presets, preset, preset_names

__all__ = [
    "CNN_SPATIAL_REUSE",
    "RECOMPUTE",
    "ModelSpec",
    "attention_core_flops",
    "flops_per_iteration",
    "forward_flops",
    "load_presets",
    "megatron_flops",
    "preset",
    "preset_names",
]
