"""Capture and restore the random-number streams a training step draws from.

A resumed job repeats the uninterrupted one bit for bit only if dropout, noise and
augmentation draw the same numbers, so the checkpoint keeps Python's `random`,
NumPy's global `np.random` and torch's CPU generator, plus the generator of the
accelerator the job runs on. Streams are kept per logical rank so that, once several
logical ranks time-slice one process, each can be swapped in and out.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture(device: torch.device | None = None) -> dict[str, Any]:
    """A snapshot (copies, never views) of every global stream of this process."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state().clone(),
    }
    if device is not None and device.type != "cpu":
        module = torch.get_device_module(device.type)
        state["accelerator"] = (device.type, module.get_rng_state(device.index).clone())
    return state


def restore(state: dict[str, Any]) -> None:
    """Put back the streams `capture` took (the accelerator's only on the same device type)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    accel = state.get("accelerator")
    if accel is not None:
        kind, tensor = accel
        module = torch.get_device_module(kind)
        if module.is_available():
            module.set_rng_state(tensor, module.current_device())
