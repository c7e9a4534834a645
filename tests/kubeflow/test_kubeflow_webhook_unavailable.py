"""A create refused because the API server could not call an admission webhook (HTTP 500 "failed
calling webhook", the Trainer's webhook service down) is a refusal, not a lost answer: nothing was
stored, so it is ``UnavailableError`` naming the webhook, never ``OutcomeUnknownError``, and
``dispatch submit`` exits non-zero saying so. Against kubesim over real HTTP, the CLI as a subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest
import yaml
from kubeflow_fixtures import kubeconfig

from dispatch.errors import OutcomeUnknownError, UnavailableError
from dispatch_kubeflow.errors import map_status, unavailable_webhook
from kubesim.sim import Simulator

WEBHOOK = "validator.trainjob.trainer.kubeflow.org"
MESSAGE = (
    f'Internal error occurred: failed calling webhook "{WEBHOOK}": failed to call webhook: Post '
    '"https://kubeflow-trainer-controller-manager.kubeflow-system.svc:443/validate-trainer-kubeflow-org-'
    'v1alpha1-trainjob?timeout=10s": dial tcp 10.96.1.1:443: connect: connection refused'
)
JOB = {
    "command": ["python", "train.py"],
    "extensions": {
        "dispatch/Image": {"ref": "example.org/train:1"},
        "kubeflow/RuntimeRef": {"kind": "ClusterTrainingRuntime", "name": "torch-distributed"},
    },
}


async def _cli(*args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DISPATCH_TOKEN"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dispatch.cli", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode(), err.decode()


def test_the_webhook_is_read_from_the_servers_message() -> None:
    assert unavailable_webhook(MESSAGE) == WEBHOOK
    assert unavailable_webhook('admission webhook "x" denied the request: no') is None
    err = map_status(500, {"message": MESSAGE, "reason": "InternalError"}, what='create TrainJob "a"')
    assert isinstance(err, UnavailableError) and not isinstance(err, OutcomeUnknownError)
    assert WEBHOOK in str(err) and "nothing was created" in str(err)


@pytest.mark.asyncio(loop_scope="module")
async def test_submit_under_an_unavailable_webhook_exits_non_zero_naming_it(
    sim: Simulator, tmp_path: Path
) -> None:
    kc = kubeconfig(tmp_path / "kc", sim.url, sim.token("admin"))
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        yaml.safe_dump(
            {
                "adapter": "kubeflow",
                "settings": {"kubeconfig": kc},
                "store": {"sqlite": str(tmp_path / "j.db")},
            }
        )
    )
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(JOB))
    code, _, err = await _cli("--config", str(cluster), "check")  # the probe runs now, its findings kept
    assert code == 0, err

    sim.faults.fail_next(1000, 500, verb="create", path="/trainjobs$", message=MESSAGE)
    try:
        code, out, err = await _cli("--config", str(cluster), "submit", str(job), "--job-id", "hooked")
    finally:
        sim.faults.clear()
    assert code != 0, out + err
    assert WEBHOOK in err and "could not be called" in err
    assert "answer was lost" not in out + err
    # What became of the record is said: kept pending for a supervisor, and how to drop it.
    assert "the record of hooked is kept, pending: a supervisor" in err, err
    assert f"`dispatch --config {cluster} cancel hooked` drops it" in err

    code, out, err = await _cli("--config", str(cluster), "--json", "history", "hooked")
    assert code == 0, err
    assert "answer was lost" not in out  # a refusal: the record holds no write of unknown effect
    code, out, err = await _cli("--config", str(cluster), "--json", "status", "hooked")
    assert code == 0, err
    record = json.loads(out)
    # Nothing was created: no write of unknown effect; the record waits, pending, for a supervisor to
    # start it once the webhook answers again (docs/errors.md: a start that failed without effect).
    assert "unknownWrite" not in record and "outcome" not in record
