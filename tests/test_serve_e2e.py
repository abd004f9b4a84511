"""End to end through the service (issue 19, slow tier): `loom serve` with the local backend and the
`priority` policy; a real training job (the example GPT through `loom run`) submitted through the
API is preempted by a higher-priority job, resumed later on the other emulated node, and finishes
with a loss curve bit-identical to an uninterrupted run of the same script."""

from __future__ import annotations

import signal

import pytest
from test_local_backend import EXAMPLE, ITERS, JOB_ARGS, _baseline

from loom.service.backends.runs import Layout
from loom.service.testing import kill_under, loss_curve, start, wait_for

pytestmark = pytest.mark.slow


def test_a_training_job_submitted_through_the_api_is_preempted_resumed_elsewhere_and_keeps_its_loss_curve(tmp_path):
    baseline, expected = _baseline(tmp_path, "--nproc", "1")
    (tmp_path / "inv.yaml").write_text("nodes: 2\ngpus_per_node: 1\npoll_s: 0.05\ngrace_s: 60\nhang_s: 300\n")
    data = tmp_path / "data"
    served = start(data, "--inventory", str(tmp_path / "inv.yaml"), "--policy", "priority", "--round-interval", "1")
    try:
        with served.client() as c:
            state = lambda job: c.status(job)["state"]
            c.submit({"job_id": "filler", "gpus": 1, "duration": 600.0})  # started first: not the victim
            wait_for(lambda: state("filler") == "RUNNING", 60, "filler running")
            c.submit({"job_id": "gpt", "gpus": 1, "duration": 60.0,
                      "command": [str(EXAMPLE), *JOB_ARGS, "--step-delay", "0.25"]})
            log = Layout(data / "local").workdir("gpt") / "loss.jsonl"
            wait_for(lambda: log.exists() and len(log.read_text().splitlines()) >= 4, 180, "gpt training")
            c.submit({"job_id": "urgent", "gpus": 1, "duration": 2.0, "priority": 5})
            wait_for(lambda: state("gpt") == "SUSPENDED", 180, "gpt preempted")
            assert len(log.read_text().splitlines()) < ITERS, "the job finished before it was preempted"
            c.cancel("filler")  # frees the other node: gpt resumes there
            wait_for(lambda: state("gpt") == "FINISHED", 300, "gpt finished")
            explained = c.explain("gpt")
            kinds = [d["kind"] for d in explained["decisions"]]
            assert kinds == ["start", "preempt", "resume"], kinds
            first, resumed = explained["decisions"][0], explained["decisions"][2]
            assert first["payload"]["allocation"]["nodes"] != resumed["payload"]["allocation"]["nodes"]
            assert all(d["status"] == "done" for d in explained["decisions"])
            assert state("urgent") == "FINISHED" and state("filler") == "CANCELLED"
        out, _ = baseline.communicate(timeout=300)
        assert baseline.returncode == 0, out
        assert loss_curve(log) == loss_curve(expected)  # bit for bit
        assert sorted(loss_curve(log)) == list(range(1, ITERS + 1))
    finally:
        served.kill(signal.SIGTERM)
        kill_under(data)
        if baseline.poll() is None:
            baseline.kill()
