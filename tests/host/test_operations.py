"""Metrics and structured logs (docs/operations.md): declared once, parsed by Prometheus' own parser,
and never carrying a secret."""

from __future__ import annotations

import io
import json
import logging
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dispatch import InvalidError, metrics
from dispatch.logs import configure, secret

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


@pytest.fixture
def recorder() -> Iterator[metrics.Metrics]:
    rec = metrics.enable("127.0.0.1:0")
    try:
        yield rec
    finally:
        metrics.disable()


def test_disabled_metrics_record_nothing_and_cost_no_import() -> None:
    assert metrics.current().enabled is False
    metrics.current().inc("dispatch_requeues_total", {"cause": "preempted", "rule": "requeue"})
    assert metrics.current().exposition() == b""


def test_the_exposition_parses_and_names_match_the_declarations(recorder: metrics.Metrics) -> None:
    recorder.inc("dispatch_requeues_total", {"cause": "preempted", "rule": "requeue max 3"})
    recorder.inc("dispatch_requeues_total", {"cause": "preempted", "rule": "requeue max 3"})
    recorder.set_all("dispatch_jobs", "state", {"running": 2}, every=("queued", "running"))
    recorder.observe("dispatch_event_record_lag_seconds", 0.02)
    recorder.inc(
        "dispatch_api_requests_total",
        {"verb": "create", "resource": "trainjobs", "status": metrics.status_class(201)},
    )
    port = metrics.served_port()
    assert port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    declared = {m.name.removesuffix("_total") for m in metrics.METRICS}
    assert declared <= set(families), declared - set(families)
    requeues = {
        tuple(sorted(s.labels.items())): s.value
        for s in families["dispatch_requeues"].samples
        if s.name == "dispatch_requeues_total"
    }
    assert requeues == {(("cause", "preempted"), ("rule", "requeue max 3")): 2.0}
    jobs = {s.labels["state"]: s.value for s in families["dispatch_jobs"].samples}
    assert jobs == {"queued": 0.0, "running": 2.0}


def test_labels_are_checked_against_the_declaration(recorder: metrics.Metrics) -> None:
    with pytest.raises(InvalidError, match="takes labels"):
        recorder.inc("dispatch_requeues_total", {"job": "j1"})
    with pytest.raises(InvalidError, match="no metric"):
        recorder.inc("dispatch_nope_total")


def test_no_label_is_a_job_id() -> None:
    # Bounded series: labels come from closed sets, never from jobs.
    assert all(not {"job", "job_id", "jobid", "name"} & set(m.labels) for m in metrics.METRICS)
    assert all(m.name.startswith("dispatch_") for m in metrics.METRICS)
    assert all(m.name.endswith("_total") == (m.kind == "counter") for m in metrics.METRICS)


def test_a_bad_address_is_refused() -> None:
    with pytest.raises(InvalidError) as info:
        metrics.enable("localhost")
    assert info.value.path == "metrics-address"
    assert metrics.current().enabled is False


def test_the_docs_table_is_the_declarations() -> None:
    page = DOCS.read_text()
    rows = page[page.index("<!-- metrics -->") : page.index("<!-- /metrics -->")].splitlines()[3:]
    assert rows == [metrics_row(m) for m in metrics.METRICS]


def metrics_row(m: metrics.Metric) -> str:
    labels = ", ".join(f"`{x}`" for x in m.labels) or "-"
    return f"| `{m.name}` | {m.kind} | {labels} | {', '.join(m.daemons)} | {m.help} |"


def test_json_log_lines_carry_the_context_and_never_a_secret() -> None:
    stream = io.StringIO()
    handler = configure("json", level=logging.DEBUG, stream=stream)
    try:
        secret("s3cret-token-value")
        log = logging.getLogger("dispatch.supervise")
        log.info(
            "requeued with s3cret-token-value",
            extra={"job_id": "j1", "epoch": "2.1", "action": "requeue", "cause": "preempted"},
        )
        log.warning("header Authorization: Bearer abc.def.ghi")
        logging.getLogger("httpx2").debug("Authorization: Bearer leaked")  # held at WARNING: dropped
        # A library's line (psycopg's pool, when the store refuses the password) is a JSON line too.
        logging.getLogger("psycopg.pool").warning(
            "error connecting in 'pool-1': password authentication failed"
        )
        logging.getLogger("psycopg.pool").info("connection ok")  # a library's INFO: not shown
        logging.getLogger("dispatch_slurm.backend").info("submitted Slurm job 7")  # every adapter's too
    finally:
        logging.getLogger().removeHandler(handler)
    lines = [json.loads(x) for x in stream.getvalue().splitlines()]
    assert len(lines) == 4
    assert (lines[2]["logger"], lines[2]["level"]) == ("psycopg.pool", "warning")
    assert lines[3]["logger"] == "dispatch_slurm.backend" and lines[3]["message"] == "submitted Slurm job 7"
    first = lines[0]
    assert first["level"] == "info" and first["logger"] == "dispatch.supervise"
    assert (first["job_id"], first["epoch"], first["action"], first["cause"]) == (
        "j1",
        "2.1",
        "requeue",
        "preempted",
    )
    text = stream.getvalue()
    assert "s3cret-token-value" not in text and "abc.def.ghi" not in text and "leaked" not in text
    assert logging.getLogger("httpx2").getEffectiveLevel() >= logging.WARNING


def test_an_unknown_log_format_is_refused() -> None:
    with pytest.raises(InvalidError) as info:
        configure("xml")
    assert info.value.path == "log-format"


def test_the_alert_rules_and_the_dashboard_name_only_declared_metrics() -> None:
    import re

    import yaml

    root = DOCS.parents[1] / "deploy" / "monitoring"
    exprs = [
        r["expr"]
        for g in yaml.safe_load((root / "prometheus-alerts.yaml").read_text())["groups"]
        for r in g["rules"]
    ]
    dashboard = json.loads((root / "grafana-dashboard.json").read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    declared = {m.name for m in metrics.METRICS}
    histograms = {m.name for m in metrics.METRICS if m.kind == "histogram"}
    used = {name for e in exprs for name in re.findall(r"\bdispatch_[a-z_]+", e)}
    allowed = declared | {f"{h}_{s}" for h in histograms for s in ("bucket", "sum", "count")}
    assert used and used <= allowed, used - allowed
    assert (
        len(
            [
                r
                for g in yaml.safe_load((root / "prometheus-alerts.yaml").read_text())["groups"]
                for r in g["rules"]
            ]
        )
        == 8
    )


STORE_WIDE = ("dispatch_jobs", "dispatch_jobs_starting_oldest_seconds")
"""Gauges every supervisor exports alike (each lists the whole store): only ``max`` aggregates them."""


def test_store_wide_gauges_are_aggregated_with_max_and_every_metric_is_on_the_dashboard() -> None:
    import re

    import yaml

    root = DOCS.parents[1] / "deploy" / "monitoring"
    rules = yaml.safe_load((root / "prometheus-alerts.yaml").read_text())["groups"]
    dashboard = json.loads((root / "grafana-dashboard.json").read_text())
    panel_exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs = [r["expr"] for g in rules for r in g["rules"]] + panel_exprs
    for expr in exprs:
        for name in STORE_WIDE:
            for hit in re.finditer(rf"\b{name}\b(?!_)", expr):
                before = expr[: hit.start()]
                assert re.search(r"max(\s+by\s*\([^)]*\))?\s*\($", before), (name, expr)
    declared = {m.name for m in metrics.METRICS}
    used = {name for e in panel_exprs for name in re.findall(r"\bdispatch_[a-z_]+", e)}
    shown = {n.removesuffix("_bucket") for n in used}
    assert declared <= shown, declared - shown
