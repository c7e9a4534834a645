"""The alerting rules fire in the situations they name (``promtool test rules`` on the repository's
cases), and the metrics they read are what a real supervisor exports (``promtool check metrics``)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dispatch import ManualClock, metrics
from dispatch.cluster import Cluster
from dispatch.health import LIVENESS, Health
from dispatch.memory import MemoryBackend
from dispatch.records import MemoryStore, SqliteStore

from .helpers import SETTINGS, spec

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"


def promtool() -> str:
    """Debian's ``prometheus`` package's promtool; with ``CI`` set its absence fails the test."""
    path = shutil.which("promtool")
    if path is None:
        why = "promtool was not found (apt-get install prometheus)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the alert rule tests, but {why}")
        pytest.skip(why)
    return path


def run_promtool(*args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        [promtool(), *args], input=stdin, capture_output=True, text=True, cwd=DEPLOY, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


@pytest.fixture
def supervisor_metrics() -> Iterator[metrics.Metrics]:
    rec = metrics.enable(daemon="supervisor")
    try:
        yield rec
    finally:
        metrics.disable()


def samples(recorder: metrics.Metrics) -> dict[str, float]:
    text = recorder.exposition().decode()
    return {
        s.name + str(sorted(s.labels.items())): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_the_rules_are_valid_and_their_test_cases_pass() -> None:
    assert "SUCCESS" in run_promtool("check", "rules", "prometheus-alerts.yaml")
    out = run_promtool("test", "rules", "prometheus-alerts.test.yaml")
    assert "SUCCESS" in out


def test_every_alert_has_a_firing_case() -> None:
    import yaml

    rules = yaml.safe_load((DEPLOY / "prometheus-alerts.yaml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    cases = yaml.safe_load((DEPLOY / "prometheus-alerts.test.yaml").read_text())["tests"]
    fired = {t["alertname"] for c in cases for t in c["alert_rule_test"] if t["exp_alerts"]}
    quiet = {t["alertname"] for c in cases for t in c["alert_rule_test"] if not t["exp_alerts"]}
    assert fired == alerts, alerts - fired
    assert alerts - {"DispatchRequeueStorm"} <= quiet, alerts - quiet


async def test_a_supervisor_exports_its_own_metrics_and_promtool_accepts_them(
    supervisor_metrics: metrics.Metrics,
) -> None:
    clock = ManualClock()
    async with Cluster(MemoryBackend(SETTINGS, clock=clock), MemoryStore(clock), clock=clock) as cluster:
        await cluster.submit(spec(), job_id="slow")  # placed: starting for the start delay (1 s)
        sup = cluster.supervisor(poll=0.1, lease=5.0)
        await sup.step()  # first seen starting
        clock.advance(0.2)
        await sup.step()
        clock.advance(0.5)
        await sup.step()
        await sup.close()
    got = samples(supervisor_metrics)
    assert got["dispatch_jobs[('state', 'starting')]"] == 1.0
    assert got["dispatch_jobs_starting_oldest_seconds[]"] == pytest.approx(0.7)
    text = supervisor_metrics.exposition().decode()
    # Only the supervisor's series: no constant zeros for dispatch-admission's.
    assert "dispatch_admission_leader" not in text and "dispatch_admission_checks" not in text
    run_promtool("check", "metrics", stdin=text)


def test_dispatch_admission_exports_only_its_own_metrics() -> None:
    recorder = metrics.enable(daemon="admission")
    try:
        recorder.set("dispatch_admission_leader", 1)
        recorder.set("dispatch_leases_held", 3)  # the supervisor's: recorded by nobody here
        text = recorder.exposition().decode()
    finally:
        metrics.disable()
    assert "dispatch_admission_leader 1.0" in text
    assert "dispatch_leases_held" not in text and "dispatch_jobs" not in text
    run_promtool("check", "metrics", stdin=text)


def test_throttling_is_its_own_status_class() -> None:
    assert metrics.status_class(429) == "429"
    assert (metrics.status_class(403), metrics.status_class(503), metrics.status_class(0)) == (
        "4xx",
        "5xx",
        "error",
    )


async def test_a_store_that_cannot_be_reached_is_counted(
    supervisor_metrics: metrics.Metrics, tmp_path: Path
) -> None:
    clock = ManualClock()
    store = SqliteStore(tmp_path / "jobs.db", clock=clock)
    async with Cluster(MemoryBackend(SETTINGS, clock=clock), store, clock=clock) as cluster:
        await cluster.submit(spec(), job_id="j1")
        sup = cluster.supervisor(poll=0.1, lease=5.0)
        await sup.step()
        assert samples(supervisor_metrics)["dispatch_store_errors_total[]"] == 0.0
        await store.close()  # the store is gone from under the supervisor
        clock.advance(0.2)  # the next scan is due

        async def once() -> bool:
            return True

        await sup.run(until=once)  # a failed step is logged and counted, never raised
    assert samples(supervisor_metrics)["dispatch_store_errors_total[]"] >= 1.0


def test_the_probes_say_which_check_is_stale() -> None:
    now = [100.0]
    probes = Health(clock=lambda: now[0])
    assert probes.live() == [] and probes.ready() == ["starting: the main loop has not begun"]
    probes.expect(LIVENESS, 30)
    probes.expect("store", 60)
    # Alive from the start (a grace as long as the allowance); ready only once each check passed.
    assert probes.live() == []
    assert probes.ready() == ["loop: not ok yet (expected 0 s ago)", "store: not ok yet (expected 0 s ago)"]
    probes.mark("store")
    now[0] += 45
    assert probes.live() == ["loop: last ok 45 s ago (allowed 30 s)"]
    probes.mark(LIVENESS)
    assert probes.live() == [] and probes.ready() == []
    now[0] += 20  # the store last answered 65 s ago
    assert probes.live() == [] and probes.ready() == ["store: last ok 65 s ago (allowed 60 s)"]
