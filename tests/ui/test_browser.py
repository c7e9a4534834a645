"""The page in a real headless browser (Debian's chromium, driven by selenium through Debian's
chromedriver), against the dev cluster, as a user meets it: ``dispatch run examples/preempted.yaml``,
then ``dispatch ui``, then a browser on it.

Real processes throughout (the ``dispatch`` console script, the dev cluster it starts in the
background, ``dispatch ui``), real HTTP, and the DOM the browser built. Screenshots are written as test
artifacts to ``$DISPATCH_ARTIFACTS/ui`` (default ``tests-artifacts/ui``, git-ignored); the run's summary
says where (``conftest.py``). Without chromium the tests are skipped with the reason, and with
``CI`` set they fail instead (``.ci/run`` installs it).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
HTML_LINE = "<img src=x onerror=document.title='owned'><b>bold</b>"
HTML_ID = "<img src=x onerror=document.title='owned'>"

pytestmark = pytest.mark.timeout(300)


def _need_browser() -> None:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if not missing:
        return
    why = f"{', '.join(missing)} missing: apt-get install chromium chromium-driver"
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


class Session:
    """The dispatch CLI with its own state directory (so its own dev cluster and store)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
        self.env["DISPATCH_STATE_DIR"] = str(home / "state")
        self.env["PATH"] = f"{BIN}{os.pathsep}{self.env.get('PATH', '')}"

    @property
    def requests(self) -> Path:
        """The dev cluster's request log: one JSON line per API request, with its verb and identity."""
        return self.home / "requests.log"

    def writes(self) -> list[dict[str, Any]]:
        lines = [json.loads(line) for line in self.requests.read_text().splitlines() if line.strip()]
        return [r for r in lines if r["verb"] in ("create", "update", "patch", "delete", "deletecollection")]

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "dispatch"), *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    _need_browser()
    s = Session(tmp_path_factory.mktemp("ui"))
    try:
        # Started by hand only to keep its request log (`dispatch run` would start it alike).
        started = s.run("dev-cluster", "start", "--request-log", str(s.requests))
        assert started.returncode == 0, started.stderr
        yield s
    finally:
        s.run("dev-cluster", "stop", timeout=30)


@pytest.fixture(scope="module")
def preempted(session: Session) -> str:
    """``dispatch run examples/preempted.yaml``: preempted, requeued under the policy, succeeded."""
    done = session.run("run", "examples/preempted.yaml", "--job-id", "preempted-1", timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "outcome: succeeded / none" in done.stdout
    return "preempted-1"


@pytest.fixture(scope="module")
def url(session: Session, preempted: str) -> Iterator[str]:
    """``dispatch ui`` on a free loopback port; its URL."""
    proc = subprocess.Popen(
        [str(BIN / "dispatch"), "ui", "--address", "127.0.0.1:0"],
        cwd=ROOT,
        env=session.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        found = re.search(r"serving the page at (http://\S+)", first)
        assert found, first + (proc.stderr.read() if proc.stderr and proc.poll() is not None else "")
        yield found.group(1)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""


def _chrome(*, javascript: bool = True) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)  # with both paths given, Selenium Manager downloads nothing
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
    ):
        options.add_argument(arg)
    if not javascript:
        options.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    return webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))


@pytest.fixture(scope="module")
def browser(artifacts: Path) -> Iterator[Any]:
    _need_browser()
    driver = _chrome()
    try:
        yield driver
    finally:
        driver.quit()


def _screenshot(driver: Any, artifacts: Path, name: str) -> Path:
    """The whole page (the window made as tall as the document), saved as an artifact."""
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    driver.set_window_size(1280, max(height, 600))
    path = artifacts / f"{name}.png"
    assert driver.save_screenshot(str(path)), path
    driver.set_window_size(1280, 900)
    return path


def _wait(driver: Any, condition: Any, timeout: float = 60) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.2).until(condition)


def _live(driver: Any) -> None:
    from selenium.webdriver.common.by import By

    _wait(driver, lambda d: d.find_element(By.ID, "live-status").text == "live", 20)


def test_the_job_page_draws_both_incarnations_the_rule_and_the_output_tail(
    url: str, preempted: str, browser: Any, artifacts: Path
) -> None:
    from selenium.webdriver.common.by import By

    browser.get(f"{url}jobs/{preempted}")
    bars = browser.find_elements(By.CSS_SELECTOR, "svg.timeline g.bar")
    assert [b.get_attribute("data-epoch") for b in bars] == ["1.0", "2.1"]
    first, second = bars
    assert (first.get_attribute("data-state"), first.get_attribute("data-cause")) == ("failed", "preempted")
    assert first.find_element(By.CSS_SELECTOR, "text.label").text == "preempted"
    follow = first.find_element(By.CSS_SELECTOR, "text.follow").text
    assert "requeued as 2.1" in follow and "rule preempted" in follow and "backoff 1 s" in follow
    assert second.get_attribute("data-state") == "succeeded"
    assert second.find_element(By.CSS_SELECTOR, "text.label").text == "succeeded"
    # Each bar is split by state: the second ran before it succeeded.
    assert second.find_elements(By.CSS_SELECTOR, "rect.running")
    # The output tail of node 0 of the current incarnation, as the node printed it.
    tail = browser.find_element(By.ID, "tail").text.splitlines()
    assert tail == ["node 0, epoch 2.1: training", "node 0: done"]
    browser.find_element(By.LINK_TEXT, "node 1").click()
    assert browser.find_element(By.ID, "tail").text.splitlines()[-1] == "node 1: done"
    # The evidence of the first incarnation and the requeue in the history, as text.
    evidence = browser.find_element(By.CSS_SELECTOR, 'article.incarnation[data-epoch="1.0"]').text
    assert "preempted" in evidence.lower() and "requeue 1 of 3" in evidence
    browser.get(f"{url}jobs/{preempted}")
    _live(browser)
    _screenshot(browser, artifacts, "job-preempted")


def test_the_jobs_page_shows_a_job_submitted_while_it_is_open(
    url: str, preempted: str, session: Session, browser: Any, artifacts: Path
) -> None:
    from selenium.webdriver.common.by import By

    browser.get(url)
    row = browser.find_element(By.CSS_SELECTOR, f'tr[data-job="{preempted}"]')
    assert row.get_attribute("data-state") == "succeeded"
    assert [c.text for c in row.find_elements(By.TAG_NAME, "td")][1:3] == ["succeeded", "none"]
    assert row.find_element(By.TAG_NAME, "a").get_attribute("href") == f"{url}jobs/{preempted}"
    _live(browser)
    browser.execute_script("window.notReloaded = true")
    done = session.run("submit", "examples/hello.yaml", "--job-id", "live-1")
    assert done.returncode == 0, done.stderr
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-job="live-1"]'))
    assert browser.execute_script("return window.notReloaded") is True
    _screenshot(browser, artifacts, "jobs")
    # Filters are query parameters: the form works without JavaScript.
    browser.get(f"{url}?state=succeeded")
    ids = [r.get_attribute("data-job") for r in browser.find_elements(By.CSS_SELECTOR, "tr.job-row")]
    assert preempted in ids and all(
        r.get_attribute("data-state") == "succeeded"
        for r in browser.find_elements(By.CSS_SELECTOR, "tr.job-row")
    )


def test_a_job_id_and_an_output_line_holding_html_are_text(
    url: str, session: Session, browser: Any, artifacts: Path, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    job = tmp_path / "html.yaml"
    text = (ROOT / "examples" / "hello.yaml").read_text()
    job.write_text(re.sub(r"KUBESIM_SCRIPT: .*", f'KUBESIM_SCRIPT: "print {HTML_LINE}; exit 0"', text))
    done = session.run("run", str(job), "--job-id", "html-1")
    assert done.returncode == 0, done.stdout + done.stderr
    browser.get(f"{url}jobs/html-1")
    tail = browser.find_element(By.ID, "tail")
    assert tail.text == HTML_LINE
    assert tail.find_elements(By.XPATH, ".//*") == []  # no element was made of it
    assert browser.find_elements(By.CSS_SELECTOR, "main img, main b") == []
    assert browser.title != "owned"
    _screenshot(browser, artifacts, "job-html-output")
    browser.get(f"{url}jobs/{HTML_ID}")
    assert HTML_ID in browser.find_element(By.CSS_SELECTOR, "p.error").text
    assert browser.find_elements(By.CSS_SELECTOR, "main img") == [] and browser.title != "owned"


def test_with_javascript_off_the_page_is_complete_only_not_live(
    url: str, preempted: str, artifacts: Path
) -> None:
    from selenium.webdriver.common.by import By

    driver = _chrome(javascript=False)
    try:
        driver.get(f"{url}jobs/{preempted}")
        bars = driver.find_elements(By.CSS_SELECTOR, "svg.timeline g.bar")
        assert [b.get_attribute("data-state") for b in bars] == ["failed", "succeeded"]
        assert driver.find_element(By.ID, "tail").text.splitlines()[-1] == "node 0: done"
        assert driver.find_element(By.CSS_SELECTOR, "header .live.off").text == "not live: reload to refresh"
        assert not driver.find_element(By.ID, "live-status").is_displayed()
        driver.get(f"{url}?cause=preempted")  # a filter is a query: no script needed
        assert driver.find_elements(By.CSS_SELECTOR, "tr.job-row") == []
        assert "no job matches these filters" in driver.find_element(By.CSS_SELECTOR, "tr.empty").text
        _screenshot(driver, artifacts, "jobs-without-javascript")
    finally:
        driver.quit()


def test_the_page_sends_no_write_to_the_cluster(
    url: str, preempted: str, session: Session, browser: Any
) -> None:
    """Read-only: browsing every page, the output tails of both nodes included, sends not one write
    request to the cluster (the dev cluster's request log says so), while it does read the logs."""
    from selenium.webdriver.common.by import By

    before = session.writes()
    reads = len(session.requests.read_text().splitlines())
    for page in ("", f"jobs/{preempted}", f"jobs/{preempted}?node=1", "jobs/live-1", "?state=succeeded"):
        browser.get(url + page)
        assert browser.find_elements(By.ID, "live")
    assert session.writes() == before
    log_reads = [
        json.loads(line) for line in session.requests.read_text().splitlines()[reads:] if "/log" in line
    ]
    assert log_reads and all(r["verb"] == "get" for r in log_reads)


def test_a_failed_job_opens_on_its_failing_node_and_clusters_go_by_name(
    url: str, session: Session, browser: Any, artifacts: Path
) -> None:
    """``examples/oom.yaml``: node 1 runs out of memory. Its page's Output panel opens on node 1, and the
    cluster is shown by the name people know it by (the dev cluster's), its identity in the tooltip."""
    from selenium.webdriver.common.by import By

    done = session.run("run", "examples/oom.yaml", "--job-id", "oom-1", timeout=180)
    assert done.returncode == 1 and "outcome: failed / out_of_memory" in done.stdout, (
        done.stdout + done.stderr
    )
    browser.get(f"{url}jobs/oom-1")
    heading = browser.find_element(By.XPATH, "//section[h2[starts-with(normalize-space(.), 'Output')]]/h2")
    assert "node 1," in heading.text, heading.text
    assert browser.find_element(By.ID, "tail").text == "loading a batch too large"
    _screenshot(browser, artifacts, "job-oom")
    browser.get(url)
    cell = browser.find_element(By.CSS_SELECTOR, 'tr[data-job="oom-1"] td.cluster')
    assert cell.text == "dev cluster"
    identity = cell.find_element(By.TAG_NAME, "span").get_attribute("title")
    assert identity.startswith("kubernetes:"), identity
