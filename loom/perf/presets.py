"""Named model presets, read from the cited data file `data/models.yaml`.

`preset(name)` returns a `ModelSpec`; a typo raises `UnknownNameError` listing
the presets and the closest matches. `load_presets(path)` reads another file
of the same shape (mapping of name -> fields), with file/line/field errors.
"""

from __future__ import annotations

import dataclasses
import difflib
from functools import lru_cache
from importlib.resources import files
from pathlib import Path

import yaml

from loom.errors import LoomInputError, UnknownNameError
from loom.perf.model import ModelSpec

_FIELDS = frozenset(f.name for f in dataclasses.fields(ModelSpec) if f.init) - {"name"}


def preset(name: str) -> ModelSpec:
    """The bundled preset called `name` (exact; case-insensitive fallback)."""
    specs = _bundled()
    if name in specs:
        return specs[name]
    by_lower = {known.lower(): known for known in specs}
    if isinstance(name, str) and name.lower() in by_lower:
        return specs[by_lower[name.lower()]]
    close = [
        by_lower[m] for m in difflib.get_close_matches(str(name).lower(), by_lower, n=3)
    ]
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise UnknownNameError(
        f"unknown model preset '{name}' (known: {', '.join(specs)}){hint}"
    )


def preset_names() -> list[str]:
    return list(_bundled())


# The documented stand-in for a job that names no model: sized by its GPU count.
SIZE_RULE = ((8, "llama2-7b"), (64, "llama2-13b"), (1 << 30, "llama2-70b"))


def preset_for_gpus(gpus: int) -> str:
    """The preset `SIZE_RULE` gives a job of `gpus` GPUs (7B ≤ 8, 13B ≤ 64, 70B beyond)."""
    return next(name for limit, name in SIZE_RULE if gpus <= limit)


def load_presets(path: str | Path | None = None) -> dict[str, ModelSpec]:
    """Load and validate a preset file; the bundled one unless `path` is given."""
    if path is None:
        return dict(_bundled())
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise LoomInputError(
            f"cannot read model preset file: {exc.strerror or exc}", source=str(p)
        ) from None
    return _parse(text, str(p))


@lru_cache(maxsize=1)
def _bundled() -> dict[str, ModelSpec]:
    resource = files("loom.perf") / "data" / "models.yaml"
    return _parse(resource.read_text(encoding="utf-8"), str(resource))


def _parse(text: str, source: str) -> dict[str, ModelSpec]:
    # Walk nodes (not safe_load's dicts) to keep line numbers and catch duplicates.
    loader = yaml.SafeLoader(text)
    try:
        try:
            root = loader.get_single_node()
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            raise LoomInputError(
                f"invalid YAML: {getattr(exc, 'problem', exc)}",
                source=source,
                line=mark.line + 1 if mark else None,
            ) from None
        if root is None or not isinstance(root, yaml.MappingNode):
            raise LoomInputError(
                "expected a mapping of preset name to model fields", source=source
            )
        specs: dict[str, ModelSpec] = {}
        for key_node, value_node in root.value:
            line = key_node.start_mark.line + 1
            name = loader.construct_object(key_node, deep=True)
            if not isinstance(name, str) or not name.strip():
                raise LoomInputError(
                    f"preset name must be a non-empty string, got {name!r}",
                    source=source,
                    line=line,
                )
            if name in specs:
                raise LoomInputError(
                    "duplicate model preset", source=source, line=line, field=name
                )
            if not isinstance(value_node, yaml.MappingNode):
                raise LoomInputError(
                    "expected a mapping of fields", source=source, line=line, field=name
                )
            fields = loader.construct_object(value_node, deep=True)
            unknown = sorted(str(k) for k in fields if k not in _FIELDS)
            if unknown:
                raise LoomInputError(
                    f"unknown field(s) {', '.join(unknown)} (allowed: {', '.join(sorted(_FIELDS))})",
                    source=source,
                    line=line,
                    field=f"{name}.{unknown[0]}",
                )
            try:
                specs[name] = ModelSpec(name=name, **fields)
            except LoomInputError as exc:
                raise LoomInputError(
                    exc.message, source=source, line=line, field=f"{name}.{exc.field}"
                ) from None
            except TypeError as exc:  # a required field missing
                raise LoomInputError(
                    str(exc).replace("ModelSpec.__init__() ", ""),
                    source=source,
                    line=line,
                    field=name,
                ) from None
        return specs
    finally:
        loader.dispose()
