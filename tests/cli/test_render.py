"""The renderer's three forms: plain (pipes), rich (terminals) and JSON."""

from __future__ import annotations

import io
import json

import pytest

from dispatch import (
    Actor,
    Capabilities,
    Cause,
    Epoch,
    Evidence,
    Image,
    JobRecord,
    JobSpec,
    Limits,
    Outcome,
    State,
    Transition,
)
from dispatch.cli.render import Renderer

SPEC = JobSpec(command=("x",), extensions=[Image("i")])
EVIDENCE = Evidence("Pod", "job-0", "OOMKilled", "killed", exit_code=137, node="n1", output=("last line",))
REC = JobRecord(
    job_id="j",
    spec=SPEC,
    created_at=0.0,
    updated_at=60.0,
    epoch=Epoch(2, 1),
    outcome=Outcome(State.FAILED, Cause.OUT_OF_MEMORY, (EVIDENCE,)),
)
T = Transition(
    60.0, Actor.CLUSTER, "failed", "Pod/job-0 OOMKilled", State.FAILED, Cause.OUT_OF_MEMORY, Epoch(2, 1)
)
CAPS = Capabilities(
    holds=True, extensions=frozenset({"dispatch/Image"}), limits=Limits(max_nodes=4), notes=("n",)
)


def render_all(r: Renderer) -> None:
    r.record(REC)
    r.records([REC, REC.replace(job_id="k", outcome=Outcome(State.RUNNING))])
    r.summary(REC, "cancel")
    r.transition("j", T)
    r.transitions("j", [T])
    r.outcome(REC)
    r.capabilities("memory", "<default>", "memory", CAPS)
    with r.progress("waiting") as status:
        if status is not None:
            status.update("still waiting")


@pytest.mark.parametrize("colour", [False, True])
def test_people_see_state_cause_and_evidence(colour: bool) -> None:
    out = io.StringIO()
    render_all(Renderer(out=out, colour=colour))
    text = out.getvalue()
    assert "failed" in text and "out_of_memory" in text
    assert "OOMKilled" in text and "exit code 137" in text and "last line" in text
    assert "j@2.1" in text
    assert "outcome: failed / out_of_memory" in text
    assert "holds:" in text and "maxNodes=4" in text


def test_plain_tables_have_a_header_row() -> None:
    out = io.StringIO()
    Renderer(out=out).records([REC])
    header, row = out.getvalue().splitlines()
    assert header.split() == ["JOB", "STATE", "CAUSE", "EPOCH", "UPDATED"]
    assert row.split()[:4] == ["j", "failed", "out_of_memory", "2.1"]


def test_json_times_are_rfc3339_unless_epoch_seconds_are_asked_for() -> None:
    out = io.StringIO()
    Renderer(out=out, as_json=True).record(REC)
    value = json.loads(out.getvalue())
    assert (value["createdAt"], value["updatedAt"]) == ("1970-01-01T00:00:00Z", "1970-01-01T00:01:00Z")
    out = io.StringIO()
    Renderer(out=out, output="yaml").record(REC)
    assert "createdAt: '1970-01-01T00:00:00Z'" in out.getvalue()


def test_programs_get_one_json_value_per_line() -> None:
    out = io.StringIO()
    r = Renderer(out=out, as_json=True, colour=True, epoch_times=True)
    assert not r.rich
    render_all(r)
    values = [json.loads(line) for line in out.getvalue().splitlines()]
    assert values[0] == REC.to_json()
    assert JobRecord.from_json(values[0]) == REC
    assert [v["jobId"] for v in values[1]] == ["j", "k"]
    assert values[3] == {"jobId": "j", "transition": T.to_json()}
    assert values[5] == {"record": REC.to_json()}
    assert values[6]["capabilities"] == CAPS.to_json()


def test_a_terminal_gets_a_live_line_per_job_and_a_pipe_gets_none() -> None:
    out = io.StringIO()
    r = Renderer(out=out, colour=True)
    with r.live_jobs() as live:
        live.update(REC)
        live.update(REC.replace(job_id="k", outcome=Outcome(State.RUNNING)))
        live.update(REC.replace(job_id="k", outcome=Outcome(State.SUCCEEDED)))
    text = out.getvalue()
    assert "out_of_memory" in text and "succeeded" in text and "elapsed" in text
    with Renderer(out=io.StringIO()).live_jobs() as none:
        assert none is None


def test_records_and_status_mark_a_job_whose_cluster_is_gone() -> None:
    out = io.StringIO()
    r = Renderer(out=out)
    r.record(REC.replace(outcome=Outcome(State.RUNNING)), gone="gone: the dev cluster is not running")
    r.records([REC.replace(outcome=Outcome(State.RUNNING))], gone={"j": "why"})
    text = out.getvalue()
    assert "cluster: gone: the dev cluster is not running; shown as last known" in text
    assert "running (last known)" in text
    out = io.StringIO()
    Renderer(out=out, as_json=True).record(REC, gone="why")
    assert json.loads(out.getvalue())["lastKnown"] == "why"


def test_the_probe_says_what_it_waits_for_on_stderr_when_not_a_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import logging

    from dispatch.cli.render import probe_progress

    log = logging.getLogger("dispatch_kubeflow.preflight")
    with probe_progress(Renderer(out=io.StringIO()), "opening"):
        log.info("probe: watching TrainJob %s for %gs", "dispatch-probe-1", 10.0)
        log.info("not about the probe")
    with probe_progress(Renderer(out=io.StringIO(), as_json=True), "opening", quiet=True):
        log.info("probe: quiet with --json")
    log.info("probe: after opening, nothing")
    err = capsys.readouterr().err
    assert err == "probe: watching TrainJob dispatch-probe-1 for 10s\n"
    assert logging.getLogger().level == logging.WARNING  # the root logger is left as it was


def test_a_multi_line_text_with_a_character_outside_ascii_stays_a_literal_block() -> None:
    """A Slurm script's comment holds an em dash: PyYAML, not allowed unicode, had turned the whole script
    into one double-quoted string of escapes (``submit --dry-run -o yaml``)."""
    out = io.StringIO()
    Renderer(out=out, output="yaml").mapping({"script": "#!/bin/bash\n# the master — node 0\nexec srun\n"})
    assert out.getvalue() == "script: |\n  #!/bin/bash\n  # the master — node 0\n  exec srun\n"
