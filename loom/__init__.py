"""Loom: an LLM-aware GPU cluster scheduler.

One scheduling core (policies, placers, speed models) drives both the
trace-driven simulator (`loom.sim`) and, later, the live service.
"""

__version__ = "0.1.0"
