"""The page of a fleet of clusters (SPEC §11.2, §15) in a real headless browser: two Kubernetes clusters
(two ``python -m kubesim serve``, each its own), one fleet config naming both, a job preempted on the first
and requeued onto the second by ``dispatch run``, then ``dispatch ui`` on the fleet and chromium on it.

Each incarnation's bar names the cluster it ran on, the jobs page names each job's cluster, and the
filter by cluster keeps the jobs whose current incarnation is there. Real processes and real HTTP
throughout; screenshots in ``$DISPATCH_ARTIFACTS/ui`` (see ``conftest.py``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .test_browser import _chrome, _need_browser, _wait

BIN = Path(sys.executable).parent

pytestmark = pytest.mark.timeout(300)

JOB = """\
command: [python, -m, train]
env:
  KUBESIM_SCRIPT: "print epoch {env:DISPATCH_EPOCH}; env:DISPATCH_EPOCH=1.0: sleep 2; env:DISPATCH_EPOCH=1.0: preempt; sleep 2; exit 0"
extensions:
  dispatch/Image: {ref: "example.org/train:1"}
  kubeflow/RuntimeRef: {kind: ClusterTrainingRuntime, name: dispatch-torch}
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """Two kubesims (east, west) and a fleet config naming them; the environment the CLI runs in."""
    _need_browser()
    home = tmp_path_factory.mktemp("fleet-page")
    procs: list[subprocess.Popen[str]] = []
    try:
        for name in ("east", "west"):
            proc = subprocess.Popen(
                [sys.executable, "-m", "kubesim", "serve", "--kubeconfig", str(home / f"{name}.kubeconfig"),
                 "--speed", "4", "--no-kueue"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            procs.append(proc)
            assert proc.stdout is not None
            while "kubeconfig written" not in proc.stdout.readline():
                assert proc.poll() is None, "kubesim serve exited early"
        config = home / "fleet.yaml"
        config.write_text(
            "clusters:\n"
            "  east:\n"
            "    adapter: kubeflow\n"
            f"    settings: {{kubeconfig: {home / 'east.kubeconfig'}, namespace: default}}\n"
            "    store: {sqlite: jobs.db}\n"
            "    policy: {rules: {preempted: {action: requeue, max: 2, backoff: 1, elsewhere: true}}}\n"
            "  west:\n"
            "    adapter: kubeflow\n"
            f"    settings: {{kubeconfig: {home / 'west.kubeconfig'}, namespace: default}}\n"
            "placement: {order: [east, west]}\n"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
        env["DISPATCH_STATE_DIR"] = str(home / "state")
        env["DISPATCH_CONFIG"] = str(config)
        yield home, env
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)


@pytest.fixture(scope="module")
def url(fleet: tuple[Path, dict[str, str]]) -> Iterator[str]:
    """The job run (preempted on east, requeued onto west), then ``dispatch ui`` on the fleet."""
    home, env = fleet
    (home / "job.yaml").write_text(JOB)
    ran = subprocess.run(
        [str(BIN / "dispatch"), "run", str(home / "job.yaml"), "--job-id", "moved"],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "started  on east" in ran.stdout and "started  on west" in ran.stdout, ran.stdout
    proc = subprocess.Popen(
        [str(BIN / "dispatch"), "ui", "--address", "127.0.0.1:0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        found = re.search(r"serving the page at (http://\S+)", first)
        assert found, first + (proc.stderr.read() if proc.stderr and proc.poll() is not None else "")
        yield found.group(1)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


@pytest.fixture
def browser() -> Iterator[Any]:
    driver = _chrome()
    try:
        yield driver
    finally:
        driver.quit()


def test_each_bar_names_the_cluster_its_incarnation_ran_on(url: str, browser: Any, artifacts: Path) -> None:
    from selenium.webdriver.common.by import By

    browser.get(url + "jobs/moved")
    bars = browser.find_elements(By.CSS_SELECTOR, "svg.timeline g.bar")
    assert [(b.get_attribute("data-epoch"), b.get_attribute("data-cluster")) for b in bars] == [
        ("1.0", "east"),
        ("2.1", "west"),
    ]
    assert [t.text for t in browser.find_elements(By.CSS_SELECTOR, "svg.timeline text.cluster")] == [
        "east",
        "west",
    ]
    assert (
        bars[0].get_attribute("data-cause") == "preempted"
        and bars[1].get_attribute("data-state") == "succeeded"
    )
    heads = [h.text for h in browser.find_elements(By.CSS_SELECTOR, "article.incarnation h3")]
    assert "on west" in heads[0] and "on east" in heads[1], heads  # the newest first
    # Every state has its colour: a stopping stretch (the preempted pods going) is not drawn black.
    stopping = browser.find_elements(By.CSS_SELECTOR, "svg.timeline rect.stopping")
    assert stopping and {r.value_of_css_property("fill") for r in stopping} == {"rgb(125, 143, 163)"}
    facts = browser.find_element(By.CSS_SELECTOR, "dl.facts").text
    assert "west" in facts  # the job's cluster, by its name
    browser.save_screenshot(str(artifacts / "fleet-job.png"))


def test_the_jobs_page_names_each_jobs_cluster_and_filters_by_it(
    url: str, browser: Any, artifacts: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.get(url)
    assert "this fleet: east, west" in browser.find_element(By.CSS_SELECTOR, "p.meta").text
    row = browser.find_element(By.CSS_SELECTOR, 'tr.job-row[data-job="moved"]')
    assert row.find_element(By.CSS_SELECTOR, "td.cluster").text == "west"
    choose = Select(browser.find_element(By.CSS_SELECTOR, 'select[name="cluster"]'))
    assert [o.text for o in choose.options] == ["any cluster", "east", "west"]
    choose.select_by_visible_text("east")
    browser.find_element(By.CSS_SELECTOR, "form.filters button").click()
    # The form's GET is a navigation the browser makes after the click returns: wait for it.
    _wait(browser, lambda d: d.current_url.endswith("?state=&cause=&cluster=east"))
    assert browser.find_elements(By.CSS_SELECTOR, "tr.job-row") == []  # its current incarnation is on west
    browser.save_screenshot(str(artifacts / "fleet-filter-east.png"))
    browser.get(url + "?cluster=west")
    assert [r.get_attribute("data-job") for r in browser.find_elements(By.CSS_SELECTOR, "tr.job-row")] == [
        "moved"
    ]
