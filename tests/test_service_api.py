"""The service's REST API and the `loom` client commands, against a real SQLite store (issue 19).

The scheduling engine is not running here: submissions stay SUBMITTED. What is tested is the API
contract — validation naming fields, tenants isolated, sizes bounded, no traceback to a client —
and that the CLI speaks it (against a real uvicorn server on 127.0.0.1)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from loom.service.api import create_app
from loom.service.service import Service
from loom.service.store import Store


@pytest.fixture
def service(tmp_path) -> Iterator[Service]:
    store = Store.open(f"sqlite:///{tmp_path / 'loom.db'}")
    yield Service(store, info={"backend": "none", "policy": "fcfs"})
    store.close()


@pytest.fixture
def tokens(service) -> dict[str, str]:
    return {name: service.store.create_tenant(name, admin=name == "root")[1] for name in ("alice", "bob", "root")}


@pytest.fixture
def api(service) -> TestClient:
    return TestClient(create_app(service, max_body_bytes=4096), raise_server_exceptions=False)


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_submit_status_queue_and_cancel(api, tokens) -> None:
    r = api.post("/v1/jobs", json={"gpus": 4, "duration": 60, "job_class": "eval", "priority": 2}, headers=auth(tokens["alice"]))
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["state"] == "SUBMITTED" and job["tenant"] == "alice" and job["job_id"].startswith("j-")
    assert job["spec"]["gpus"] == 4 and job["spec"]["job_class"] == "eval" and job["spec"]["preemptible"] is True
    got = api.get(f"/v1/jobs/{job['job_id']}", headers=auth(tokens["alice"])).json()
    assert got["job_id"] == job["job_id"] and got["cancel_requested"] is False
    queue = api.get("/v1/jobs", headers=auth(tokens["alice"])).json()["jobs"]
    assert [j["job_id"] for j in queue] == [job["job_id"]]
    cancelled = api.post(f"/v1/jobs/{job['job_id']}/cancel", headers=auth(tokens["alice"]))
    assert cancelled.status_code == 200 and cancelled.json()["cancel_requested"] is True


def test_job_ids_are_unique_and_idempotency_keys_submit_once(api, tokens) -> None:
    h = auth(tokens["alice"])
    assert api.post("/v1/jobs", json={"job_id": "train-1", "gpus": 1, "duration": 5}, headers=h).status_code == 201
    dup = api.post("/v1/jobs", json={"job_id": "train-1", "gpus": 1, "duration": 5}, headers=h)
    assert dup.status_code == 409 and dup.json()["problems"][0]["field"] == "job_id"
    first = api.post("/v1/jobs", json={"gpus": 2, "duration": 5}, headers={**h, "Idempotency-Key": "k1"}).json()
    again = api.post("/v1/jobs", json={"gpus": 2, "duration": 5}, headers={**h, "Idempotency-Key": "k1"}).json()
    assert first["job_id"] == again["job_id"]
    assert len(api.get("/v1/jobs", headers=h).json()["jobs"]) == 2


@pytest.mark.parametrize("body, field, words", [
    ({"gpus": 0, "duration": 5}, "gpus", "greater than or equal to 1"),
    ({"gpus": 2, "duration": 5, "gpu_type": "A100"}, "gpu_type", "did you mean A100-40GB"),
    ({"gpus": 2, "durration": 5}, "durration", "unknown field"),
    ({"gpus": 2}, "body", "give 'command'"),
    ({"gpus": 2, "command": ["python", "x.py"], "procs": 4}, "body", "must not exceed"),
    ({"gpus": 2, "duration": 5, "job_class": "training"}, "job_class", "pretrain"),
    ({"gpus": 2, "duration": 5, "job_id": "../etc"}, "job_id", "letters, digits"),
    ({"gpus": 2, "duration": 5, "model": "gpt-13b", "batch_size": 8}, "body", "all of 'model'"),
    ({"gpus": "many", "duration": 5}, "gpus", "integer"),
])
def test_bad_submissions_are_422_naming_the_field(api, tokens, body, field, words) -> None:
    r = api.post("/v1/jobs", json=body, headers=auth(tokens["alice"]))
    assert r.status_code == 422, r.text
    problems = r.json()["problems"]
    assert any(p["field"] == field and words in p["message"] for p in problems), problems
    assert "Traceback" not in r.text


def test_malformed_json_and_oversized_bodies_are_refused(api, tokens) -> None:
    h = {**auth(tokens["alice"]), "Content-Type": "application/json"}
    bad = api.post("/v1/jobs", content=b'{"gpus": 2,', headers=h)
    assert bad.status_code == 422 and "Traceback" not in bad.text
    big = {"gpus": 1, "duration": 5, "env": {f"V{i}": "x" * 100 for i in range(100)}}
    r = api.post("/v1/jobs", json=big, headers=auth(tokens["alice"]))
    assert r.status_code == 413 and r.json()["problems"][0]["field"] == "body"

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"gpus": 1, "duration": 5, "vc": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}'

    r = api.post("/v1/jobs", content=chunks(), headers=h)
    assert r.status_code == 413


def test_tokens_are_required_and_tenants_see_only_their_jobs(api, tokens, service) -> None:
    assert api.get("/v1/jobs").status_code == 401
    assert api.get("/v1/jobs", headers=auth("not-a-token")).status_code == 401
    job = api.post("/v1/jobs", json={"gpus": 1, "duration": 5}, headers=auth(tokens["alice"])).json()["job_id"]
    bob = auth(tokens["bob"])
    assert api.get(f"/v1/jobs/{job}", headers=bob).status_code == 404
    assert api.get(f"/v1/jobs/{job}/explain", headers=bob).status_code == 404
    assert api.post(f"/v1/jobs/{job}/cancel", headers=bob).status_code == 404
    assert api.get("/v1/jobs", headers=bob).json()["jobs"] == []
    assert api.get("/v1/jobs?all=true", headers=bob).json()["jobs"] == []
    assert service.store.job(job).cancel_requested is False
    bob_events = api.get("/v1/events?follow=false", headers=bob).text
    assert job not in bob_events
    assert job in api.get("/v1/events?follow=false", headers=auth(tokens["alice"])).text
    # an admin sees every tenant's jobs; only an admin makes tenants
    assert [j["job_id"] for j in api.get("/v1/jobs", headers=auth(tokens["root"])).json()["jobs"]] == [job]
    assert api.post("/v1/tenants", json={"name": "carol"}, headers=bob).status_code == 403
    made = api.post("/v1/tenants", json={"name": "carol"}, headers=auth(tokens["root"]))
    assert made.status_code == 201
    assert api.get("/v1/jobs", headers=auth(made.json()["token"])).status_code == 200


def test_events_stream_as_server_sent_events_from_a_sequence_number(api, tokens) -> None:
    h = auth(tokens["alice"])
    ids = [api.post("/v1/jobs", json={"gpus": 1, "duration": 5}, headers=h).json()["job_id"] for _ in range(3)]
    text = api.get("/v1/events?follow=false", headers=h).text
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    assert [e["job_id"] for e in events if e["kind"] == "submitted"] == ids
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    later = api.get(f"/v1/events?follow=false&after={seqs[0]}", headers=h).text
    assert ids[0] not in later and ids[2] in later
    resumed = api.get("/v1/events?follow=false", headers={**h, "Last-Event-ID": str(seqs[1])}).text
    assert ids[1] not in resumed and ids[2] in resumed


def test_metrics_are_prometheus_text_with_queue_per_class(api, tokens) -> None:
    h = auth(tokens["alice"])
    for cls in ("eval", "eval", "sft"):
        api.post("/v1/jobs", json={"gpus": 1, "duration": 5, "job_class": cls}, headers=h)
    text = api.get("/metrics").text
    assert 'loom_queue_length{job_class="eval"} 2.0' in text
    assert 'loom_queue_length{job_class="sft"} 1.0' in text
    assert 'loom_jobs_submitted_total{job_class="eval"} 2.0' in text
    assert "loom_decision_latency_seconds_bucket" in text


def test_bad_query_parameters_are_422_naming_the_field(api, tokens) -> None:
    h = auth(tokens["alice"])
    r = api.get("/v1/jobs?state=SLEEPING", headers=h)
    assert r.status_code == 422 and r.json()["problems"][0]["field"] == "states"
    r = api.get("/v1/jobs?after=nope", headers=h)
    assert r.status_code == 422 and r.json()["problems"][0]["field"] == "after"
    r = api.get("/v1/jobs?limit=0", headers=h)
    assert r.status_code == 422 and r.json()["problems"][0]["field"] == "limit"
    r = api.get("/v1/events?after=-1", headers=h)
    assert r.status_code == 422 and r.json()["problems"][0]["field"] == "after"


def test_openapi_spec_lists_every_route(api) -> None:
    spec = api.get("/openapi.json").json()
    paths = set(spec["paths"])
    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel", "/v1/jobs/{job_id}/explain",
            "/v1/nodes", "/v1/events", "/v1/tenants", "/metrics", "/healthz"} <= paths
    assert "JobSubmission" in spec["components"]["schemas"]


def test_an_internal_error_reaches_the_client_without_a_traceback(api, tokens, service, monkeypatch) -> None:
    def broken(job_id: str):
        raise RuntimeError("secret internals at /srv/loom/store.py line 42")

    monkeypatch.setattr(service.store, "job", broken)
    r = api.get("/v1/jobs/anything", headers=auth(tokens["alice"]))
    assert r.status_code == 500
    assert r.json()["error"].startswith("internal error; logged as ")
    assert "secret" not in r.text and "Traceback" not in r.text


def test_explain_says_a_submitted_job_was_not_taken_up_yet(api, tokens) -> None:
    h = auth(tokens["alice"])
    job = api.post("/v1/jobs", json={"gpus": 1, "duration": 5}, headers=h).json()["job_id"]
    data = api.get(f"/v1/jobs/{job}/explain", headers=h).json()
    assert data["summary"].startswith("submitted") and data["decisions"] == [] and data["job"]["job_id"] == job


# ------------------------------------------------------------------ the CLI against a real server
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(service) -> Iterator[str]:
    import uvicorn

    port = _free_port()
    config = uvicorn.Config(create_app(service), host="127.0.0.1", port=port, log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(10)


def test_cli_commands_speak_the_api(server, tokens, tmp_path, monkeypatch) -> None:
    from loom.cli.main import app

    runner = CliRunner()
    monkeypatch.setenv("LOOM_URL", server)
    monkeypatch.setenv("LOOM_TOKEN", tokens["alice"])
    monkeypatch.setenv("LOOM_CLIENT_CONFIG", str(tmp_path / "none.yaml"))
    r = runner.invoke(app, ["submit", "--gpus", "2", "--duration", "30", "--class", "eval", "--job-id", "cli-1"])
    assert r.exit_code == 0, r.output
    assert r.output.strip() == "cli-1"
    spec = tmp_path / "job.yaml"
    spec.write_text("gpus: 1\ncommand: [python, train.py]\njob_class: sft\n")
    r = runner.invoke(app, ["submit", "-f", str(spec), "--priority", "5", "--json"])
    assert r.exit_code == 0, r.output
    second = json.loads(r.output)
    assert second["spec"]["command"] == ["python", "train.py"] and second["spec"]["priority"] == 5
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["submit", "--gpus", "1", "--json", "--", "train.py", "--steps", "3"])
    assert r.exit_code == 0, r.output
    third = json.loads(r.output)  # a script path relative to here is sent absolute: the service runs it elsewhere
    assert third["spec"]["command"] == [str(tmp_path / "train.py"), "--steps", "3"]
    runner.invoke(app, ["cancel", third["job_id"]])
    r = runner.invoke(app, ["queue", "--json"])
    assert [j["job_id"] for j in json.loads(r.output)] == ["cli-1", second["job_id"], third["job_id"]]
    assert "cli-1" in runner.invoke(app, ["status", "cli-1"]).output
    assert "submitted" in runner.invoke(app, ["explain", "cli-1"]).output
    assert runner.invoke(app, ["cancel", "cli-1"]).exit_code == 0
    events = runner.invoke(app, ["events", "--json"]).output.splitlines()
    assert [json.loads(e)["kind"] for e in events].count("submitted") == 3
    # user mistakes: a clear one-line error and exit code 2, no traceback
    r = runner.invoke(app, ["submit", "--gpus", "0", "--duration", "5"])
    assert r.exit_code == 2 and "gpus" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["status", "nope"])
    assert r.exit_code == 2 and "no job 'nope'" in r.output
    r = runner.invoke(app, ["queue"], env={"LOOM_TOKEN": "wrong"})
    assert r.exit_code == 2 and "unknown token" in r.output
    r = runner.invoke(app, ["queue", "--url", "http://127.0.0.1:9"])
    assert r.exit_code == 2 and "cannot reach" in r.output
