"""The service's dashboard in a real headless Chromium against a running `loom serve` (local
backend, sleep-style jobs): it loads with no console errors, asks for a token, and then shows a
submitted job move from the queue to running to finished, with its decision and reason, while the
page refreshes itself."""

from __future__ import annotations

import signal

import pytest
from test_report_browser import browser, console_errors  # noqa: F401  (the module-scoped fixture)

from loom.service.testing import kill_under, start, wait_for

pytestmark = pytest.mark.browser


def _text(driver, selector: str) -> str:
    return driver.execute_script(f"const e = document.querySelector({selector!r}); return e ? e.innerText : ''")



def test_the_dashboard_shows_a_submitted_job_change_state(browser, tmp_path) -> None:  # noqa: F811
    (tmp_path / "inv.yaml").write_text("nodes: 4\ngpus_per_node: 2\nnodes_per_leaf: 2\npoll_s: 0.05\n")
    data = tmp_path / "data"
    served = start(data, "--inventory", str(tmp_path / "inv.yaml"), "--round-interval", "1")
    try:
        with served.client() as client:
            client.submit({"job_id": "blocker", "gpus": 8, "duration": 6.0})  # holds every GPU for a while
            client.submit({"job_id": "watched", "gpus": 2, "duration": 4.0, "job_class": "eval"})
            browser.get_log("browser")
            browser.get(f"{served.url}/dashboard")
            assert browser.execute_script("return document.readyState") == "complete"
            assert browser.execute_script("return document.getElementById('main').hidden") is True
            browser.find_element("id", "token").send_keys(served.token)
            browser.find_element("css selector", "#login button").click()
            wait_for(lambda: "watched" in _text(browser, "#queue"), what="the waiting job in the queue table")
            wait_for(lambda: "watched" in _text(browser, "#running"), what="the job in the running table")
            assert "watched" not in _text(browser, "#queue")
            assert "node" in _text(browser, "#running")  # where it runs
            wait_for(lambda: "watched" not in _text(browser, "#running") and "blocker" not in _text(browser, "#running"),
                  timeout=90, what="both jobs finished")
            decisions = _text(browser, "#decisions")
            assert "watched" in decisions and "start" in decisions and "fcfs" in decisions
            tenants = _text(browser, "#tenants")
            assert "admin" in tenants
            svg = browser.execute_script("return document.querySelectorAll('#util svg').length")
            assert svg == 1, "the GPUs-in-use chart is missing"
            assert console_errors(browser.get_log("browser")) == []
            # a wrong token is said so on the page, not thrown
            browser.execute_script("sessionStorage.clear()")
            browser.get(f"{served.url}/dashboard")
            browser.find_element("id", "token").send_keys("wrong-token")
            browser.find_element("css selector", "#login button").click()
            wait_for(lambda: "unknown token" in _text(browser, "#status"), what="the token error")
    finally:
        served.kill(signal.SIGTERM)
        kill_under(data)
