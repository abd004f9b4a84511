"""Name → factory registries, extensible through Python entry points.

Every pluggable kind (policies, placers, speed models, trace loaders, named
clusters) has one `Registry`. Built-ins register themselves with the
`register` decorator when their module is imported; third-party packages add
entries by declaring an entry point in the registry's group, e.g.::

    [project.entry-points."loom.policies"]
    my-policy = "my_pkg.policy:MyPolicy"
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from importlib import import_module
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from loom.errors import UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to objects; built-ins are imported lazily on first lookup."""

    def __init__(self, kind: str, group: str, builtin_modules: tuple[str, ...] = (),
                 homes: dict[str, str] | None = None) -> None:
        self.kind = kind
        self.group = group
        self._builtin_modules = builtin_modules
        self._homes = homes or {}  # name → its built-in module, where the module is not named after it
        self._entries: dict[str, T] = {}
        self._loaded = False

    def register(self, name: str) -> Callable[[T], T]:
        def decorate(obj: T) -> T:
            self.add(name, obj)
            return obj

        return decorate

    def add(self, name: str, obj: T) -> None:
        existing = self._entries.get(name)
        if existing is not None and existing is not obj:
            raise ValueError(f"{self.kind} '{name}' is registered twice")
        self._entries[name] = obj

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for module in self._builtin_modules:
            import_module(module)
        for ep in entry_points(group=self.group):
            if ep.name not in self._entries:
                self._entries[ep.name] = ep.load()

    def get(self, name: str) -> T:
        found = self._entries.get(name) if self._loaded else self._builtin(name)
        if found is not None:
            return found
        self._load()
        try:
            return self._entries[name]
        except KeyError:
            close = difflib.get_close_matches(name, self._entries, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            known = ", ".join(sorted(self._entries))
            raise UnknownNameError(f"unknown {self.kind} '{name}' (known: {known}){hint}") from None

    def _builtin(self, name: str) -> T | None:
        """A built-in entry without importing every built-in module and scanning the entry points
        (a run needs one policy of 14): the one registered already, else the one its module (named
        after it, `best-fit` → `…best_fit`, or in `homes`) registers. Built-ins win over entry points
        of the same name, so this is what a full load would return."""
        if name in self._entries:
            return self._entries[name]
        home = self._homes.get(name)
        if home is None:
            stem = name.replace("-", "_")
            home = next((m for m in self._builtin_modules if m.rsplit(".", 1)[-1] == stem), None)
        if home is None or home not in self._builtin_modules:
            return None
        import_module(home)
        return self._entries.get(name)

    def names(self) -> list[str]:
        self._load()
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        self._load()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
