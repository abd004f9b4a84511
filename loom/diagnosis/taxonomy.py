"""Acme's failure taxonomy: categories, error types, recoverability and mitigations.

The data lives in `data/taxonomy.yaml` so operators can reword mitigations without touching code;
it is validated on load (a broken file must fail loudly at import time of the pipeline, not in the
middle of a recovery).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Any

import yaml

CATEGORIES = ("infrastructure", "framework", "script", "LossSpike", "unknown")
REQUIRED_TYPES: dict[str, tuple[str, ...]] = {
    "infrastructure": ("CUDAError", "ECCError", "NVLinkError", "NCCLTimeout", "NCCLRemoteError", "NodeFailure",
                       "StorageError", "ConnectionError", "OOM"),
    "framework": ("RuntimeError", "ValueError", "AttributeError", "ImportError", "KeyError", "FileNotFoundError",
                  "SyntaxError"),
    "LossSpike": ("LossSpike",),
    "unknown": ("Unknown",),
}
UNKNOWN = "Unknown"
_FIELDS = {"category", "recoverable", "mitigation"}


@dataclass(frozen=True, slots=True)
class ErrorType:
    """One error type of the taxonomy."""

    name: str
    category: str
    recoverable: bool
    mitigation: str


class TaxonomyError(ValueError):
    """The taxonomy file is malformed (a packaging bug, not a user mistake)."""


def parse_taxonomy(data: Any, source: str = "taxonomy.yaml") -> MappingProxyType[str, ErrorType]:
    """Validate the YAML document and return error types by name."""
    if not isinstance(data, dict) or set(data) != {"categories", "error_types"}:
        raise TaxonomyError(f"{source}: expected exactly the keys 'categories' and 'error_types'")
    if set(data["categories"]) != set(CATEGORIES):
        raise TaxonomyError(f"{source}: categories must be {', '.join(CATEGORIES)}")
    types: dict[str, ErrorType] = {}
    for name, spec in (data["error_types"] or {}).items():
        types[name] = _parse_type(name, spec, source)
    for category, names in REQUIRED_TYPES.items():
        for name in names:
            if name not in types or types[name].category != category:
                raise TaxonomyError(f"{source}: error type {name} must exist in category {category}")
    if not any(t.category == "script" for t in types.values()):
        raise TaxonomyError(f"{source}: the script category has no error type")
    if types[UNKNOWN].recoverable:
        raise TaxonomyError(f"{source}: {UNKNOWN} must not be recoverable")
    return MappingProxyType(types)


def _parse_type(name: str, spec: Any, source: str) -> ErrorType:
    if not isinstance(spec, dict) or set(spec) != _FIELDS:
        raise TaxonomyError(f"{source}: error type {name} needs exactly {', '.join(sorted(_FIELDS))}")
    if spec["category"] not in CATEGORIES:
        raise TaxonomyError(f"{source}: error type {name} has unknown category {spec['category']!r}")
    if not isinstance(spec["recoverable"], bool):
        raise TaxonomyError(f"{source}: error type {name}: recoverable must be true or false")
    if not isinstance(spec["mitigation"], str) or not spec["mitigation"].strip():
        raise TaxonomyError(f"{source}: error type {name}: mitigation must be a non-empty string")
    return ErrorType(name, spec["category"], spec["recoverable"], spec["mitigation"].strip())


@functools.cache
def taxonomy() -> MappingProxyType[str, ErrorType]:
    """The packaged taxonomy (loaded once)."""
    text = resources.files("loom.diagnosis").joinpath("data/taxonomy.yaml").read_text(encoding="utf-8")
    return parse_taxonomy(yaml.safe_load(text))


def error_type(name: str) -> ErrorType:
    """The taxonomy entry for `name` (KeyError for a name the taxonomy lacks)."""
    return taxonomy()[name]


def parse_xid_codes(data: Any, source: str = "xid_codes.json") -> dict[int, tuple[str, int, bool]]:
    """Validate NVIDIA's Xid catalogue as mapped onto the taxonomy: code -> (error type, tier, weak).

    Codes whose type is null (informational: injected errors, test messages) are left out, so a
    line reporting them is no error. Every type must be in the taxonomy, every code listed once.
    """
    if not isinstance(data, dict) or not isinstance(data.get("codes"), list) or not data.get("source"):
        raise TaxonomyError(f"{source}: expected 'source' (where the catalogue comes from) and a list 'codes'")
    known = taxonomy()
    out: dict[int, tuple[str, int, bool]] = {}
    seen: set[int] = set()
    for row in data["codes"]:
        if not isinstance(row, dict) or not set(row) <= {"code", "mnemonic", "type", "tier", "weak"}:
            raise TaxonomyError(f"{source}: bad row {row!r}")
        code, kind, tier, weak = row.get("code"), row.get("type"), row.get("tier", 0), row.get("weak", False)
        if not isinstance(code, int) or isinstance(code, bool) or not 0 < code < 1000 or code in seen:
            raise TaxonomyError(f"{source}: code {code!r} is not a new integer in 1..999")
        seen.add(code)
        if kind is None:
            continue
        if kind not in known or known[kind].category == "unknown":
            raise TaxonomyError(f"{source}: Xid {code}: {kind!r} is not an error type of the taxonomy")
        if tier not in (0, 1, 2, 3) or not isinstance(weak, bool):
            raise TaxonomyError(f"{source}: Xid {code}: tier must be 0-3 and weak a boolean")
        out[code] = (kind, tier, weak)
    return out


def load_xid_codes() -> dict[int, tuple[str, int, bool]]:
    """The packaged Xid table (data/xid_codes.json)."""
    text = resources.files("loom.diagnosis").joinpath("data/xid_codes.json").read_text(encoding="utf-8")
    return parse_xid_codes(json.loads(text))
