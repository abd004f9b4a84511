"""`loom serve` as an operator runs it: a real process on 127.0.0.1 with the local backend (sleep-style
jobs as real processes on emulated nodes), driven through the API client; stopped by PID."""

from __future__ import annotations

import signal
import time

import pytest

from loom.service.testing import kill_under, start, wait_for

INVENTORY = "nodes: 4\ngpus_per_node: 2\nnodes_per_leaf: 2\npoll_s: 0.05\n"


@pytest.fixture
def served(tmp_path):
    (tmp_path / "inv.yaml").write_text(INVENTORY)
    data = tmp_path / "data"
    procs = []

    def launch(*extra: str):
        s = start(data, "--inventory", str(tmp_path / "inv.yaml"), "--round-interval", "1", *extra)
        procs.append(s)
        return s

    yield launch
    for s in procs:
        if s.proc.poll() is None:
            s.kill(signal.SIGTERM)
    kill_under(data)


def states(client) -> dict[str, str]:
    return {j["job_id"]: j["state"] for j in client.jobs(all=True)}


def test_jobs_submitted_to_the_service_run_on_the_emulated_nodes_and_finish(served) -> None:
    s = served()
    with s.client() as c:
        c.submit({"job_id": "a", "gpus": 2, "duration": 1.0})
        c.submit({"job_id": "b", "gpus": 8, "duration": 1.0, "job_class": "eval"})  # waits for a
        wait_for(lambda: states(c).get("a") == "RUNNING", what="a running")
        running = c.status("a")
        assert sum(running["allocation"]["gpus"]) == 2
        wait_for(lambda: states(c) == {"a": "FINISHED", "b": "FINISHED"}, what="both finished")
        b = c.explain("b")
        assert [d["kind"] for d in b["decisions"]] == ["start"] and b["decisions"][0]["status"] == "done"
        events = [e["kind"] for e in c.events()]
        assert events.count("submitted") == 2 and "decision" in events and "answer" in events
    # the backend kept each finished run's record until the service had stored the end, then dropped it
    wait_for(lambda: not list(s.data_dir.rglob("runs/*.json")), what="the run records dropped")


def test_a_cancel_stops_a_running_job_and_frees_its_gpus(served) -> None:
    s = served()
    with s.client() as c:
        c.submit({"job_id": "long", "gpus": 8, "duration": 600.0})
        wait_for(lambda: states(c).get("long") == "RUNNING", what="running")
        c.cancel("long")
        wait_for(lambda: states(c).get("long") == "CANCELLED", what="cancelled")
        assert all(n["free"] == n["gpus"] for n in c.nodes()["nodes"])
        c.submit({"job_id": "next", "gpus": 8, "duration": 0.5})
        wait_for(lambda: states(c).get("next") == "FINISHED", what="the next job ran")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_args(request) -> list[str]:
    """The store `loom serve` uses: SQLite in its data directory, or a real PostgreSQL server."""
    if request.param == "sqlite":
        return []
    return ["--db", request.getfixturevalue("postgres_server").create_database()]


def test_after_kill_9_the_restarted_service_adopts_running_jobs_and_loses_nothing(served, store_args) -> None:
    s = served(*store_args)
    with s.client() as c:
        c.submit({"job_id": "runs-through", "gpus": 4, "duration": 20.0})
        wait_for(lambda: states(c).get("runs-through") == "RUNNING", what="running")
        c.submit({"job_id": "queued", "gpus": 8, "duration": 0.5})
    s.kill(signal.SIGKILL)  # no shutdown: the job's processes keep running
    s2 = served(*store_args)
    with s2.client() as c:
        assert states(c)["runs-through"] in ("RUNNING", "FINISHED")  # adopted (it may have ended meanwhile)
        wait_for(lambda: states(c) == {"runs-through": "FINISHED", "queued": "FINISHED"}, timeout=90,
                 what="both finished after the restart")
        starts = [d for d in c.explain("runs-through")["decisions"] if d["kind"] == "start"]
        assert len(starts) == 1, "the running job was launched again after the restart"
        assert "adopted" in " ".join(t["event"] for t in c.explain("runs-through")["transitions"])


def test_an_admin_drains_a_node_and_new_jobs_go_elsewhere(served) -> None:
    s = served()
    with s.client() as c:
        nodes = c.drain("node0")["nodes"]
        assert {n["name"]: n["state"] for n in nodes}["node0"] == "drained"
        c.submit({"job_id": "x", "gpus": 6, "duration": 1.0})  # 8 GPUs up, 2 of them drained
        wait_for(lambda: states(c).get("x") == "FINISHED", what="x finished")
        assert "node0" not in c.explain("x")["decisions"][0]["payload"]["allocation"]["nodes"]
        c.submit({"job_id": "y", "gpus": 8, "duration": 0.5})  # needs every node: waits for node0
        time.sleep(1.5)
        assert states(c)["y"] == "PENDING"
        assert "6 free" in c.explain("y")["summary"]
        c.undrain("node0")
        wait_for(lambda: states(c).get("y") == "FINISHED", what="y ran once node0 was back")
    with s.client() as admin:
        token = admin.create_tenant("alice")["token"]
    from loom.service.client import Client, ServiceError, Target

    with Client(Target(s.url, token)) as alice, pytest.raises(ServiceError, match="admin"):
        alice.drain("node1")


def test_a_crashing_job_fails_and_is_counted_as_a_backend_error(served, tmp_path) -> None:
    script = tmp_path / "crash.py"
    script.write_text("import sys\nprint('about to fail', flush=True)\nsys.exit(3)\n")
    s = served()
    with s.client() as c:
        c.submit({"job_id": "bad", "gpus": 1, "command": [str(script)]})
        wait_for(lambda: states(c).get("bad") == "FAILED", timeout=90, what="the job failed")
        transitions = c.explain("bad")["transitions"]
        # the recovery pipeline read its log: no known error, so it is not retried blindly
        assert [t["new"] for t in transitions[-2:]] == ["RECOVERING", "FAILED"]
        assert "not retried" in transitions[-1]["event"] and "exit status 3" in transitions[-1]["event"]
        assert "unknown/Unknown" in transitions[-1]["event"]
    import httpx

    metrics = httpx.get(f"{s.url}/metrics").text
    assert 'loom_backend_errors_total{kind="job_failed_fatal"} 1.0' in metrics
    assert 'loom_job_transitions_total{new="FAILED",old="RECOVERING"} 1.0' in metrics


def test_an_admin_pauses_scheduling_and_resumes_it(served) -> None:
    s = served()
    with s.client() as c:
        assert c.policy() == {"policy": "fcfs", "placer": "best-fit", "round_interval": 1.0, "paused": False}
        assert c.policy(paused=True)["paused"] is True
        c.submit({"job_id": "held", "gpus": 1, "duration": 0.5})
        time.sleep(2.0)
        assert states(c)["held"] == "PENDING"  # no rounds while paused
        assert c.policy(paused=False, round_interval=2.0) == {"policy": "fcfs", "placer": "best-fit",
                                                               "round_interval": 2.0, "paused": False}
        wait_for(lambda: states(c).get("held") == "FINISHED", what="the job ran after the resume")
        token = c.create_tenant("bob")["token"]
    from loom.service.client import Client, ServiceError, Target

    with Client(Target(s.url, token)) as bob, pytest.raises(ServiceError, match="admin"):
        bob.policy(paused=True)


def test_a_preemption_in_flight_when_the_service_dies_is_not_taken_for_a_finish(served) -> None:
    s = served("--policy", "priority")
    with s.client() as c:
        c.submit({"job_id": "victim", "gpus": 8, "duration": 30.0})
        wait_for(lambda: states(c).get("victim") == "RUNNING", what="victim running")
        c.submit({"job_id": "urgent", "gpus": 8, "duration": 0.5, "priority": 9})
        wait_for(lambda: states(c).get("victim") in ("STOPPING", "SUSPENDED"), what="the preemption")
    s.kill(signal.SIGKILL)
    time.sleep(2.0)  # the victim checkpoints and exits while no service watches
    s2 = served("--policy", "priority")
    with s2.client() as c:
        wait_for(lambda: states(c).get("urgent") == "FINISHED", timeout=90, what="urgent finished")
        wait_for(lambda: states(c).get("victim") == "FINISHED", timeout=120, what="victim resumed and finished")
        runs = [t for t in c.explain("victim")["transitions"] if t["new"] == "RUNNING"]
        assert len(runs) >= 2, "the victim never ran again after its preemption: its stop was taken for a finish"
