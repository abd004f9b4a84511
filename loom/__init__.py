"""Loom: an LLM-aware GPU cluster scheduler.

One scheduling core (policies, placers, speed models) drives both the
trace-driven simulator (`loom.sim`) and, later, the live service.
"""

__version__ = "0.1.0"
DISTRIBUTION = "loom-sched"  # the name pyproject.toml installs Loom under


def version() -> str:
    """The installed package's version (importlib.metadata), else `__version__` (a source checkout)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed(DISTRIBUTION)
    except PackageNotFoundError:
        return __version__
