"""The runtime's configuration, read once from the `LOOM_*` environment `loom run` sets.

Without `loom run` (a script started by plain `python` or `torchrun`) every variable
has a default, so the same script runs standalone: job id `local`, runtime
directory `./.loom`, one logical rank per process, no periodic checkpoints.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from loom.runtime.errors import RuntimeConfigError

MODES = ("sync", "async")
RESUME_AUTO, RESUME_LATEST, RESUME_NONE = "auto", "latest", "none"
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class SpikeRule:
    """When the job's loss is a spike and what a rollback skips (docs/RUNTIME.md, "Loss-spike rollback").

    A loss `x` is a spike when it is not finite, or when at least `min_history` healthy
    losses are known and `x - median > max(z * 1.4826 * MAD, rel * |median|, abs)` over
    the last `window` healthy ones: a robust z-score, with floors so that a flat loss
    (MAD about 0) does not flag rounding noise.
    """

    enabled: bool = False  # off unless asked for: LOOM_SPIKE=on, `loom run --spike on|KEY=VALUE,...`
    z: float = 6.0  # robust z-scores above the median
    window: int = 32  # healthy losses the median and MAD are taken over
    min_history: int = 16  # healthy losses needed before a finite loss can be a spike
    rel: float = 0.1  # the rise must also exceed this fraction of |median| ...
    abs: float = 1e-3  # ... and this many loss units
    skip: int = 0  # batches skipped after the spike's own
    max_rollbacks: int = 3  # spikes handled per `period` iterations; one more fails the job
    period: int = 1000  # iterations run (undone ones included)


# `loom run --spike KEY=VALUE,...`: the key, its variable, and the SpikeRule field it sets
SPIKE_KEYS = {"z": "LOOM_SPIKE_Z", "window": "LOOM_SPIKE_WINDOW", "min-history": "LOOM_SPIKE_MIN_HISTORY",
              "rel": "LOOM_SPIKE_REL", "abs": "LOOM_SPIKE_ABS", "skip": "LOOM_SPIKE_SKIP",
              "max-rollbacks": "LOOM_SPIKE_MAX_ROLLBACKS", "period": "LOOM_SPIKE_PERIOD"}


@dataclass(frozen=True)
class RuntimeConfig:
    """Everything the runtime reads from the environment, validated."""

    job_id: str = "local"
    runtime_dir: Path = Path(".loom")
    logical_world: int | None = None  # None: one logical rank per process
    checkpoint_dir: Path | None = None  # None: <job_dir>/checkpoints
    checkpoint_interval: int = 0
    checkpoint_mode: str = "sync"
    resume: str = RESUME_AUTO  # auto | latest | none | a checkpoint path
    checkpoint_keep: int = 2
    workdir: Path = Path(".")
    control_poll_s: float = 0.1
    status_interval_s: float = 1.0
    deterministic: bool = False  # fixed-order gradient reduction: bit-identical across resizes
    squash_checks: int = 3  # iterations whose squashed gradient is checked after each (re)start
    spike: SpikeRule = SpikeRule()  # loss-spike rollback (LOOM_SPIKE_*)

    @property
    def job_dir(self) -> Path:
        return self.runtime_dir / self.job_id

    @property
    def checkpoints(self) -> Path:
        return self.checkpoint_dir or self.job_dir / "checkpoints"

    @property
    def checkpoint_dir_explicit(self) -> bool:
        """A directory the user named must exist; the default one is created."""
        return self.checkpoint_dir is not None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RuntimeConfig:
        env = os.environ if env is None else env
        get = lambda name: env.get(name, "").strip()
        cwd = Path.cwd()
        ckpt = get("LOOM_CHECKPOINT_DIR")
        return cls(
            job_id=_job_id(get("LOOM_JOB_ID") or "local"),
            runtime_dir=_abs(get("LOOM_RUNTIME_DIR") or ".loom", cwd),
            logical_world=_int(env, "LOOM_LOGICAL_WORLD", None, minimum=1),
            checkpoint_dir=_abs(ckpt, cwd) if ckpt else None,
            checkpoint_interval=_int(env, "LOOM_CHECKPOINT_INTERVAL", 0, minimum=0) or 0,
            checkpoint_mode=_choice(env, "LOOM_CHECKPOINT_MODE", MODES, "sync"),
            resume=_resume(get("LOOM_RESUME"), cwd),
            checkpoint_keep=_int(env, "LOOM_CHECKPOINT_KEEP", 2, minimum=1) or 2,
            workdir=_abs(get("LOOM_WORKDIR") or ".", cwd),
            control_poll_s=_float(env, "LOOM_CONTROL_POLL_S", 0.1),
            deterministic=_bool(env, "LOOM_DETERMINISTIC"),
            squash_checks=_int(env, "LOOM_SQUASH_CHECKS", 3, minimum=0),
            spike=spike_rule(env),
        )


def spike_rule(env: Mapping[str, str]) -> SpikeRule:
    """The loss-spike rule from `LOOM_SPIKE` (on/off) and `LOOM_SPIKE_*`, validated."""
    d = SpikeRule()
    rule = SpikeRule(
        enabled=_bool(env, "LOOM_SPIKE", default=False),  # on: `loom run --spike on` (pretraining)
        z=_number(env, "LOOM_SPIKE_Z", d.z, positive=True),
        window=_int(env, "LOOM_SPIKE_WINDOW", d.window, minimum=3),
        min_history=_int(env, "LOOM_SPIKE_MIN_HISTORY", d.min_history, minimum=3),
        rel=_number(env, "LOOM_SPIKE_REL", d.rel),
        abs=_number(env, "LOOM_SPIKE_ABS", d.abs),
        skip=_int(env, "LOOM_SPIKE_SKIP", d.skip, minimum=0),
        max_rollbacks=_int(env, "LOOM_SPIKE_MAX_ROLLBACKS", d.max_rollbacks, minimum=0),
        period=_int(env, "LOOM_SPIKE_PERIOD", d.period, minimum=1),
    )
    if rule.min_history > rule.window:
        raise RuntimeConfigError(
            f"{rule.min_history} exceeds the window of {rule.window} losses (LOOM_SPIKE_WINDOW): "
            "no loss could ever be judged", source="environment variable LOOM_SPIKE_MIN_HISTORY")
    return rule


def spike_env(text: str) -> dict[str, str]:
    """`loom run --spike off` or `--spike z=4,skip=100`: the LOOM_SPIKE_* variables it stands for."""
    text = text.strip()
    if not text:
        return {}
    if text.lower() in ("off", "on"):
        return {"LOOM_SPIKE": text.lower()}
    env = {"LOOM_SPIKE": "on"}
    for item in text.split(","):
        key, _, value = item.partition("=")
        key = key.strip().lower().replace("_", "-")
        if key not in SPIKE_KEYS or not value.strip():
            raise RuntimeConfigError(f"{item.strip()!r} is not KEY=VALUE with KEY one of "
                                     f"{', '.join(SPIKE_KEYS)} (or the whole value 'off')", source="--spike")
        env[SPIKE_KEYS[key]] = value.strip()
    return env


def _abs(text: str, cwd: Path) -> Path:
    path = Path(text).expanduser()
    return path if path.is_absolute() else cwd / path


def _job_id(text: str) -> str:
    if not _JOB_ID.match(text) or text in (".", ".."):
        raise RuntimeConfigError(
            f"job id {text!r} is not a plain name (letters, digits, '.', '_', '-'; no '/')",
            source="environment variable LOOM_JOB_ID")
    return text


def _int(env: Mapping[str, str], name: str, default: int | None, minimum: int) -> int | None:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise RuntimeConfigError(f"{text!r} is not a whole number >= {minimum}",
                                 source=f"environment variable {name}")
    return value


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise RuntimeConfigError(f"{text!r} is not a number of seconds >= 0",
                                 source=f"environment variable {name}")
    return value


def _number(env: Mapping[str, str], name: str, default: float, *, positive: bool = False) -> float:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value > 0 if positive else value >= 0) or value == float("inf"):
        raise RuntimeConfigError(f"{text!r} is not a number {'>' if positive else '>='} 0",
                                 source=f"environment variable {name}")
    return value


def _bool(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    text = env.get(name, "").strip().lower()
    if not text:
        return default
    if text in ("0", "false", "no", "off"):
        return False
    if text in ("1", "true", "yes", "on"):
        return True
    raise RuntimeConfigError(f"{text!r} is not 1 or 0 (true/false, yes/no, on/off)",
                             source=f"environment variable {name}")


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    text = env.get(name, "").strip().lower() or default
    if text not in choices:
        raise RuntimeConfigError(f"{text!r} is not one of {', '.join(choices)}",
                                 source=f"environment variable {name}")
    return text


def _resume(text: str, cwd: Path) -> str:
    """'' -> auto; 'latest' / 'none' kept; anything else is a checkpoint path (made absolute)."""
    if not text or text.lower() == RESUME_AUTO:
        return RESUME_AUTO
    if text.lower() in (RESUME_LATEST, RESUME_NONE):
        return text.lower()
    return str(_abs(text, cwd))
