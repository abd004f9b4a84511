from importlib.metadata import EntryPoint

import pytest

import loom.registry as registry_module
from loom.errors import UnknownNameError
from loom.registry import Registry


class ThirdPartyPolicy:
    name = "third-party"

    def schedule(self, ctx):
        return []


def test_entry_points_extend_a_registry(monkeypatch):
    fake = [EntryPoint("third-party", "test_registry:ThirdPartyPolicy", "loom.test_group")]
    monkeypatch.setattr(registry_module, "entry_points", lambda group: fake if group == "loom.test_group" else [])
    reg: Registry[type] = Registry("policy", "loom.test_group")
    reg.add("builtin", object)
    assert reg.names() == ["builtin", "third-party"]
    assert reg.get("third-party").__name__ == "ThirdPartyPolicy"


def test_unknown_name_suggests_close_match():
    reg: Registry[int] = Registry("widget", "loom.none")
    reg.add("best-fit", 1)
    with pytest.raises(UnknownNameError, match="did you mean best-fit"):
        reg.get("bestfit")


def test_double_registration_is_refused():
    reg: Registry[int] = Registry("widget", "loom.none")
    reg.add("a", 1)
    with pytest.raises(ValueError):
        reg.add("a", 2)
