"""What machine a benchmark ran on, for the header of its output (shared by the bench scripts)."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def machine() -> str:
    """CPU model, cores, RAM, OS and Python, e.g. "AMD EPYC, 2 cores, 23.5 GiB RAM, Linux 6.1, CPython 3.11.7"."""
    cpu = platform.processor() or platform.machine()
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next((x.split(":", 1)[1].strip() for x in info if x.startswith("model name")), cpu)
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        mem = next(int(x.split()[1]) for x in meminfo if x.startswith("MemTotal")) / 2**20
    except (OSError, StopIteration):
        mem = float("nan")
    return (f"{cpu}, {os.cpu_count()} cores, {mem:.1f} GiB RAM, {platform.system()} "
            f"{platform.release().split('-')[0]}, CPython {platform.python_version()}")
