"""`report.html` as a reader sees it: real `loom simulate` runs on slices of real traces, the page
opened as file:// in headless Chromium (Debian's chromium + chromedriver, installed by
scripts/setup.sh) at 1400 px, and checked for what a person would notice:

- no console errors (level SEVERE: script errors, failed resources), after load and after use;
- every <img> decodes (naturalWidth > 0) and every inline <svg> figure is drawn, also inside <details>;
- no horizontal page scroll at 1400 px, with the <details> closed (as loaded) and all opened;
- every in-page link (the nav) points to an element that exists;
- every <details> is closed when the page loads and has a <summary>;
- the decision-log filter works: typing a job id changes the count text, leaves exactly that job's
  rows visible, and clearing it shows every row again.

The checks assume only a well-formed report (no section names, no fixed layout), so the report can
change freely; each check returns the problems it found, and a report test lists them all at once.
`test_checks_catch_a_broken_page` runs every check on a deliberately broken page, so none of them
passes vacuously. Chromium missing is a failure, not a skip: scripts/setup.sh is the contract.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WIDTH, HEIGHT = 1400, 1000
SETUP = "run ./scripts/setup.sh (as root) to install Debian's chromium and chromium-driver and selenium"

# A slice of each real trace: small enough to be quick, big enough for every figure and table.
PHILLY = ["--trace", "philly", "--cluster", "philly", "--limit", "2000"]
SCENARIOS = {
    "philly-fcfs": PHILLY + ["--policy", "fcfs", "--placer", "best-fit"],
    # node failures with checkpoints and topology-aware recovery: failure/goodput sections;
    # --load so that jobs queue and the priority policy preempts
    "philly-failures": PHILLY + ["--policy", "priority", "--placer", "best-fit", "--load", "30",
                                 "--failures", "rate:0.02", "--checkpoint", "async",
                                 "--checkpoint-interval", "30m", "--recovery", "topology"],
    # reservations (the Gantt chart) and SLA tiers on a generated Acme Kalos workload
    "kalos-reserve": ["--trace", "csv:{kalos}", "--cluster", "acme-kalos", "--policy", "reserve",
                      "--limit", "600"],
    "kalos-sla": ["--trace", "csv:{kalos}", "--cluster", "acme-kalos", "--policy", "sla", "--limit", "600"],
}


# ---------------------------------------------------------------------------------------------
# the browser


def require_chromium() -> None:
    """Fail (never skip) with the fix when the browser, its driver or selenium is missing."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.is_file()]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: {SETUP}", pytrace=False)
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.fail(f"the selenium package is not installed: {SETUP}", pytrace=False)


def _processes() -> dict[int, tuple[int, str]]:
    """Live (not zombie) processes: pid -> (parent pid, command line), from /proc."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z":
            found[int(entry)] = (int(fields[1]), cmdline)
    return found


def _ours(driver_pid: int, home: str) -> set[int]:
    """The driver's descendants and any process naming our fresh browser directory."""
    procs = _processes()
    found = {pid for pid, (_, cmd) in procs.items() if home in cmd}
    todo = [driver_pid, *found]
    while todo:
        parent = todo.pop()
        for pid, (ppid, _) in procs.items():
            if ppid == parent and pid not in found:
                found.add(pid)
                todo.append(pid)
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium at 1400×1000 with its console log, quit (and checked gone) at the end."""
    require_chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    home = tempfile.mkdtemp(prefix="loom-chromium-")  # profile, config (crash reports), cache: all ours
    options = Options()
    options.binary_location = str(CHROMIUM)  # with the driver's path below: Selenium Manager never runs
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--user-data-dir={home}/profile", f"--window-size={WIDTH},{HEIGHT}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The crash handler detaches from the browser; under XDG_CONFIG_HOME=home its command line
    # names `home`, which is how the check below finds it (and ~/.config stays untouched).
    service = Service(str(CHROMEDRIVER), env={**os.environ, "XDG_CONFIG_HOME": f"{home}/config",
                                              "XDG_CACHE_HOME": f"{home}/cache"})
    try:
        driver = webdriver.Chrome(service=service, options=options)
    except Exception:
        shutil.rmtree(home, ignore_errors=True)
        raise
    driver.set_script_timeout(30)
    driver.set_page_load_timeout(120)
    driver_pid = service.process.pid
    try:
        yield driver
    finally:
        started = _ours(driver_pid, home) | {driver_pid}  # the driver, the browser, its helpers
        driver.quit()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(_alive(p) for p in started):
            time.sleep(0.1)
        left = sorted(p for p in started | _ours(-1, home) if _alive(p))  # -1: by `home` only
        for pid in left:  # only processes this fixture started
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(home, ignore_errors=True)
        assert not left, f"chromium processes {left} were still running after driver.quit()"


def open_page(driver, path: Path) -> list[dict]:
    """Load `path` as file:// and return the console messages logged while loading."""
    driver.get_log("browser")  # drop anything from an earlier page
    driver.get(path.resolve().as_uri())
    assert driver.execute_script("return document.readyState") == "complete"
    return driver.get_log("browser")


# ---------------------------------------------------------------------------------------------
# the checks: each returns a list of problems, in words the report's author can act on

def console_errors(entries: list[dict]) -> list[str]:
    return [f"console {e['level']}: {e['message']}" for e in entries if e.get("level") == "SEVERE"]


def details_problems(driver) -> list[str]:
    found = driver.execute_script("""
        return Array.from(document.querySelectorAll('details')).map(function (d, i) {
          var s = d.querySelector(':scope > summary');
          return {i: i, open: d.open, summary: s ? s.textContent.trim().slice(0, 80) : null};
        });""")
    problems = []
    for d in found:
        name = f"<details> #{d['i'] + 1} ({d['summary']!r})"
        if d["open"]:
            problems.append(f"{name} is open on load (every <details> must start closed)")
        if not d["summary"]:
            problems.append(f"<details> #{d['i'] + 1} has no <summary> with text")
    return problems


def open_all_details(driver) -> int:
    return driver.execute_script(
        "var d = document.querySelectorAll('details'); d.forEach(function (x) { x.open = true; });"
        "return d.length;")


def figure_problems(driver) -> list[str]:
    """Every <img> loads and decodes (lazy ones are made eager, so closed <details> count too), and
    every inline <svg> figure is drawn: a box of non-zero size with something in it."""
    failures = driver.execute_async_script("""
        var done = arguments[arguments.length - 1];
        var imgs = Array.from(document.images);
        var svgs = Array.from(document.querySelectorAll('svg')).filter(function (s) {
          return !s.parentElement.closest('svg'); });
        var bad = svgs.map(function (svg, i) {
          var what = '<svg> #' + (i + 1) + ' ' + JSON.stringify(svg.getAttribute('aria-label')
                     || (svg.querySelector('title') || {}).textContent || '');
          var box = svg.getBoundingClientRect();
          if (box.width < 1 || box.height < 1)
            return what + ': rendered ' + box.width + '×' + box.height + ' px';
          var inner = svg.getBBox();
          return inner.width > 0 || inner.height > 0 ? null : what + ': draws nothing';
        });
        Promise.all(imgs.map(function (img, i) {
          img.loading = 'eager';
          var what = '<img> #' + (i + 1) + ' alt=' + JSON.stringify(img.alt || '') + ' src='
                     + (img.getAttribute('src') || '').slice(0, 40);
          return img.decode().then(
            function () { return img.naturalWidth > 0 ? null : what + ': naturalWidth 0'; },
            function (e) { return what + ': does not decode (' + e.name + ')'; });
        })).then(function (r) { done(r.concat(bad).filter(function (x) { return x; })); });""")
    return list(failures)


def overflow_problems(driver, state: str) -> list[str]:
    """No horizontal page scroll: the page is no wider than the viewport (less its scrollbar)."""
    found = driver.execute_script("""
        var root = document.documentElement, limit = root.clientWidth;
        if (root.scrollWidth <= limit) return null;
        var wide = [];
        document.querySelectorAll('body *').forEach(function (el) {
          var r = el.getBoundingClientRect();
          if (r.width === 0 || r.right <= limit + 0.5) return;
          for (var c = el.firstElementChild; c; c = c.nextElementSibling)
            if (c.getBoundingClientRect().right > limit + 0.5) return;  // report the innermost
          var name = el.tagName.toLowerCase() + (el.id ? '#' + el.id : '')
                     + (el.className && typeof el.className === 'string'
                        ? '.' + el.className.trim().split(/\\s+/).join('.') : '');
          var sec = el.closest('section, details, div[id]');
          wide.push(name + ' right edge ' + Math.round(r.right) + ' px, width ' + Math.round(r.width)
                    + ' px' + (sec && sec !== el ? ' in ' + sec.tagName.toLowerCase()
                                + (sec.id ? '#' + sec.id : '') : '')
                    + ': ' + JSON.stringify((el.textContent || el.getAttribute('alt') || '')
                                            .trim().replace(/\\s+/g, ' ').slice(0, 60)));
        });
        return {scroll: root.scrollWidth, client: limit, wide: wide.slice(0, 8)};
        """)
    if found is None:
        return []
    return [f"horizontal scroll at {WIDTH} px ({state}): page {found['scroll']} px wide in a "
            f"{found['client']} px viewport; widest elements: " + "; ".join(found["wide"] or ["?"])]


def link_problems(driver) -> list[str]:
    broken = driver.execute_script("""
        return Array.from(document.querySelectorAll('a[href^="#"]')).map(function (a) {
          var id = decodeURIComponent(a.getAttribute('href').slice(1));
          if (id === '' || id === 'top' || document.getElementById(id)
              || document.getElementsByName(id).length) return null;
          return a.getAttribute('href') + ' (' + a.textContent.trim() + ')';
        }).filter(function (x) { return x; });""")
    problems = [f"in-page link {b} points to no element" for b in broken]
    if driver.execute_script("var n = document.querySelector('nav');"
                             "return n !== null && n.querySelectorAll('a[href]').length === 0"):
        problems.append("<nav> has no links")
    return problems


# The decision-log filter: the input (#jobfilter, else the page's only text input) and the table it
# filters (#declog, else the first table after the input); a row's job is its data-job attribute,
# else its cell under a "job" header.
FILTER_SETUP = """
    var input = document.getElementById('jobfilter');
    if (!input) {
      var inputs = Array.from(document.querySelectorAll('input')).filter(function (i) {
        return ['', 'text', 'search'].indexOf((i.getAttribute('type') || '').toLowerCase()) >= 0; });
      if (inputs.length !== 1) return {error: inputs.length + ' text inputs and no #jobfilter'};
      input = inputs[0];
    }
    var table = document.getElementById('declog');
    if (!table) table = Array.from(document.querySelectorAll('table')).find(function (t) {
      return input.compareDocumentPosition(t) & Node.DOCUMENT_POSITION_FOLLOWING; });
    if (!table) return {error: 'no table after the filter input'};
    [input, table].forEach(function (el) {  // a reader opens the <details> holding them
      for (var d = el.closest('details'); d; d = d.parentElement && d.parentElement.closest('details'))
        d.open = true; });
    var heads = Array.from(table.querySelectorAll('thead th, thead td')).map(function (h) {
      return h.textContent.trim().toLowerCase(); });
    var col = heads.indexOf('job');
    var rows = Array.from(table.querySelectorAll('tbody tr'));
    window.__loomRows = rows;
    window.__loomJob = function (r) {
      if (r.hasAttribute('data-job')) return r.getAttribute('data-job');
      return col >= 0 && r.cells[col] ? r.cells[col].textContent.trim() : null; };
    window.__loomTexts = function () {  // short texts outside the table: where a count is shown
      var m = new Map();
      document.querySelectorAll('body *').forEach(function (el) {
        if (!table.contains(el) && el.children.length === 0 && el.textContent.length < 200)
          m.set(el, el.textContent); });
      return m; };
    window.__loomBefore = window.__loomTexts();
    input.scrollIntoView({block: 'center'});
    return {input: input, rows: rows.length, jobs: rows.map(window.__loomJob)};
"""
FILTER_STATE = """
    var shown = window.__loomRows.filter(function (r) { return r.getClientRects().length > 0; });
    var changed = [], after = window.__loomTexts();
    after.forEach(function (text, el) {
      if (window.__loomBefore.get(el) !== text) changed.push(text.trim()); });
    return {shown: shown.map(window.__loomJob), changed: changed};
"""


def filter_problems(driver, wait: float = 10) -> list[str]:
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    setup = driver.execute_script(FILTER_SETUP)
    if "error" in setup:
        return [f"decision-log filter not found: {setup['error']}"]
    jobs = [j for j in setup["jobs"] if j]
    if setup["rows"] < 2 or len(set(jobs)) < 2:
        return [f"decision log has {setup['rows']} rows for {len(set(jobs))} jobs: nothing to filter"]
    # a job id that is no part of another one, so exact and substring matching agree
    ids = sorted(set(jobs))
    pick = next((j for j in ids if not any(j != o and j in o for o in ids)), None)
    if pick is None:
        return ["every job id in the decision log is part of another one"]
    expected = sum(1 for j in setup["jobs"] if j == pick)
    field = setup["input"]
    field.click()
    field.send_keys(pick)
    try:
        state = WebDriverWait(driver, wait, poll_frequency=0.05).until(
            lambda d: (s := d.execute_script(FILTER_STATE)) and len(s["shown"]) < setup["rows"] and s)
    except Exception:  # TimeoutException: nothing was hidden
        return [f"typing job id {pick!r} into the filter hid none of the {setup['rows']} rows"]
    problems = []
    if state["shown"] != [pick] * expected:
        wrong = sorted({j for j in state["shown"] if j != pick})[:5]
        problems.append(f"filter {pick!r} shows {len(state['shown'])} rows, expected exactly its "
                        f"{expected}" + (f"; also shows jobs {wrong}" if wrong else ""))
    counts = {str(expected), f"{expected:,}"}
    if not any(re.search(rf"(?<![\d,.]){re.escape(c)}(?![\d,.])", t) for t in state["changed"] for c in counts):
        problems.append(f"filter {pick!r}: no count text changed to {expected} "
                        f"(texts that changed: {state['changed'][:5]})")
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys(Keys.BACKSPACE)
    try:
        WebDriverWait(driver, wait, poll_frequency=0.05).until(
            lambda d: len(d.execute_script(FILTER_STATE)["shown"]) == setup["rows"])
    except Exception:
        shown = len(driver.execute_script(FILTER_STATE)["shown"])
        problems.append(f"clearing the filter shows {shown} of {setup['rows']} rows")
    return problems


def page_problems(driver, path: Path, wait: float = 10) -> list[str]:
    """Every check on one page, as a reader meets it: as loaded, then with everything opened."""
    problems = console_errors(open_page(driver, path))
    problems += details_problems(driver)
    problems += overflow_problems(driver, "as loaded")
    problems += link_problems(driver)
    problems += filter_problems(driver, wait)
    open_all_details(driver)
    problems += figure_problems(driver)
    problems += overflow_problems(driver, "every <details> open")
    problems += console_errors(driver.get_log("browser"))
    return problems


# ---------------------------------------------------------------------------------------------
# tests


ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_exactly_the_readme_install_and_test_commands():
    """The README's first two commands (install, test) are what .ci/run runs, and nothing else:
    so a green CI means the README's install works on a fresh machine."""
    readme = [line.strip() for line in (ROOT / "README.md").read_text().splitlines()
              if line.startswith("    ") and line.strip()][:2]
    ci = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    assert ci[:2] == ["set -euo pipefail", 'cd "$(dirname "$0")/.."'], ci
    assert ci[2:] == readme == ["./scripts/setup.sh", "python3 -m pytest"], (readme, ci)


def test_setup_script_is_valid_bash_and_installs_the_browser():
    script = ROOT / "scripts" / "setup.sh"
    assert os.access(script, os.X_OK), f"{script} is not executable (the README runs it as ./scripts/setup.sh)"
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=60)
    text = script.read_text()
    for package in ("chromium", "chromium-driver"):
        assert re.search(rf"^\s+{package}\s", text, re.M), f"{package} missing from DEBIAN_PACKAGES"


@pytest.mark.browser
def test_chromium_and_its_driver_are_installed_and_match():
    require_chromium()

    def version(binary: Path) -> str:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60).stdout
        found = re.search(r"(\d+)\.\d+\.\d+\.\d+", out)
        assert found, f"{binary} --version printed {out!r}"
        return found.group(1)

    assert version(CHROMIUM) == version(CHROMEDRIVER), f"chromium and chromedriver majors differ: {SETUP}"


BROKEN_PAGE = """<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>broken</title></head><body>
<nav><a href='#here'>here</a><a href='#nowhere'>nowhere</a></nav><h2 id='here'>here</h2>
<img alt='truncated png' src='data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB'>
<svg aria-label='empty chart' width='300' height='100'></svg>
<svg aria-label='no size' width='0' height='0'><rect width='5' height='5'/></svg>
<svg aria-label='fine chart' width='300' height='100'><rect width='50' height='50'/></svg>
<details open><summary>open</summary><div style='width:2400px'>too wide</div></details>
<details><p>no summary</p></details>
<p><input id='jobfilter'> <span id='shown'></span></p>
<table id='declog'><thead><tr><th>job</th></tr></thead><tbody>
<tr data-job='a1'><td>a1</td></tr><tr data-job='b2'><td>b2</td></tr><tr data-job='b2'><td>b2</td></tr>
</tbody></table>
<script>document.getElementById('jobfilter').oninput = function () { undefinedFunction(); };</script>
<script>console.error('deliberate error');</script></body></html>"""


@pytest.mark.browser
def test_checks_catch_a_broken_page(browser, tmp_path):
    """Each check finds its fault on a page made to have them all: none can pass vacuously."""
    page = tmp_path / "broken.html"
    page.write_text(BROKEN_PAGE)
    problems = "\n".join(page_problems(browser, page, wait=1))
    for expected in ("console SEVERE", "deliberate error", "undefinedFunction",  # also errors on use
                     "is open on load", "has no <summary>", "#nowhere", "does not decode",
                     '"empty chart": draws nothing', '"no size": rendered 0×0 px',
                     "horizontal scroll", "hid none of the 3 rows"):
        assert expected in problems, f"{expected!r} not reported; the checks said:\n{problems}"
    assert "#here" not in problems and "fine chart" not in problems
    good = tmp_path / "fine.html"
    good.write_text(BROKEN_PAGE.replace("undefinedFunction();", """
        var q = this.value.trim(), n = 0;
        document.querySelectorAll('#declog tbody tr').forEach(function (r) {
          var show = !q || r.dataset.job === q; r.style.display = show ? '' : 'none'; if (show) n++; });
        document.getElementById('shown').textContent = n + ' rows shown';""").replace(
        "console.error('deliberate error');", ""))
    problems = "\n".join(filter_problems(browser) if open_page(browser, good) == [] else ["console"])
    assert problems == "", problems


@pytest.fixture(scope="module")
def kalos_trace(tmp_path_factory) -> Path:
    """A day of generated Acme Kalos jobs (the workload the README's reservation and SLA runs use)."""
    out = tmp_path_factory.mktemp("kalos") / "kalos.csv"
    loom("workload", "generate", "--profile", "acme-kalos", "--days", "1", "--seed", "0", "--scale", "20",
         "--out", str(out), cwd=out.parent)
    return out


def loom(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The real command line, in its own process, as a user runs it."""
    proc = subprocess.run([sys.executable, "-m", "loom.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=900, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"loom {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_report_reads_well_in_chromium(scenario, browser, request, tmp_path):
    args = SCENARIOS[scenario]
    if any("{kalos}" in a for a in args):
        args = [a.format(kalos=request.getfixturevalue("kalos_trace")) for a in args]
    loom("simulate", *args, "--out", str(tmp_path / "run"), "-q", cwd=tmp_path)
    report = tmp_path / "run" / "report.html"
    assert report.is_file(), f"loom simulate {' '.join(args)} wrote no report.html"
    problems = page_problems(browser, report)
    assert not problems, f"{report} in Chromium at {WIDTH} px:\n  " + "\n  ".join(problems)
