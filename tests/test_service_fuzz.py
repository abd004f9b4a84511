"""Schemathesis, a property-based API fuzzer, against the service's own OpenAPI spec: generated
requests for every operation (valid and invalid), as an admin and as a tenant; no response may
be a 5xx, and every response must match the spec (status codes, content types, headers, bodies).

The app runs in-process over a real SQLite store; the scheduling engine is not needed to check
the API's answers."""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from loom.service.api import create_app
from loom.service.service import Service
from loom.service.store import Store

pytestmark = pytest.mark.slow
EXAMPLES = int(os.environ.get("LOOM_FUZZ_EXAMPLES", "15"))


@pytest.fixture(scope="module")
def fuzz_target(tmp_path_factory):
    store = Store.open(f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'loom.db'}")
    tokens = {name: store.create_tenant(name, admin=name == "root")[1] for name in ("root", "alice")}
    store.submit("alice", {"job_id": "known-job", "gpus": 2, "duration": 10.0})
    store.save_inventory(1, [{"name": f"n{i}", "gpus": 8, "gpu_type": "A100-80GB", "state": "up",
                              "path": ["spine0", f"leaf{i // 2}"]} for i in range(4)])
    app = create_app(Service(store))
    yield app, tokens
    store.close()


@pytest.fixture(scope="module")
def api_schema(fuzz_target):
    app, _ = fuzz_target
    return schemathesis.openapi.from_asgi("/openapi.json", app)


schema = schemathesis.pytest.from_fixture("api_schema")


FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture])


def _call(case, token: str) -> None:
    if case.path == "/v1/events":
        case.query = {**(case.query or {}), "follow": "false"}  # a stream that ends, so the call returns
    # every check but "a schema-valid request is accepted": a submission has rules across fields
    # (a command or a run time; procs ≤ gpus) and names (GPU types, model presets) that the spec
    # states in words, and refusing those with a 422 naming the field is the contract
    case.call_and_validate(headers={"Authorization": f"Bearer {token}"},
                           excluded_checks=[schemathesis.checks.positive_data_acceptance])


@schema.parametrize()
@FUZZ
def test_no_request_from_an_admin_makes_a_server_error(case, fuzz_target) -> None:
    _call(case, fuzz_target[1]["root"])


@schema.parametrize()
@FUZZ
def test_no_request_from_a_tenant_makes_a_server_error(case, fuzz_target) -> None:
    _call(case, fuzz_target[1]["alice"])
