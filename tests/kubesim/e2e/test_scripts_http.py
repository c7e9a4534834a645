"""The script verbs the cause work needs, seen over real HTTP: ``oom-but-exit-0``, ``config-error``,
``create-error``, the kubelet's own check of the Secrets and ConfigMaps a container's env names, and an
OOM restarted in place under ``restartPolicy: OnFailure``."""

from __future__ import annotations

from typing import Any

from lightkube import AsyncClient
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.core_v1 import Pod, Secret

from kubesim import Simulator

from .conftest import TrainJob
from .test_scenarios_http import NS, cond, job_pods, main_status, no_controller_errors, summary, trainjob

EventJson = create_namespaced_resource("", "v1", "Event", "events")


async def reasons_for(client: AsyncClient, pod: str) -> list[tuple[str, str, str]]:
    """The (type, reason, message) of the Events about ``pod``, read with a field selector."""
    events = client.list(EventJson, namespace=NS, fields={"involvedObject.name": pod})
    return [(e["type"], e["reason"], e["message"]) async for e in events]


def bare_pod(name: str, env: list[dict[str, Any]], script: str = "print hi; hang") -> Pod:
    return Pod.from_dict(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "containers": [
                    {
                        "name": "node",
                        "image": "registry.example.com/train:1",
                        "env": [{"name": "KUBESIM_SCRIPT", "value": script}, *env],
                    }
                ]
            },
        }
    )


async def test_oom_but_exit_0_completes_the_trainjob_reading_oomkilled(
    sim: Simulator, client: AsyncClient
) -> None:
    await client.create(trainjob("oomz", script="print work; oom-but-exit-0", runtime="dispatch-torch"))
    await sim.settle()
    sim.advance(1)  # the Job syncs its ended pod a batch period later
    await sim.settle()
    tj = await client.get(TrainJob, "oomz", namespace=NS)
    assert summary(cond(tj, "Complete")) == ("True", "AllJobsCompleted")
    (pod,) = await job_pods(client, "oomz")
    term = main_status(pod).state.terminated
    assert (pod.status.phase, term.reason, term.exitCode) == ("Succeeded", "OOMKilled", 0)
    no_controller_errors(sim)


async def test_oom_under_on_failure_shows_restart_count_and_last_state(
    sim: Simulator, client: AsyncClient
) -> None:
    await client.create(trainjob("oomr", script="sleep 1; oom"))
    await sim.settle()
    sim.advance(1)
    (pod,) = await job_pods(client, "oomr")
    st = main_status(pod)
    assert st.restartCount == 1
    assert (st.lastState.terminated.reason, st.lastState.terminated.exitCode) == ("OOMKilled", 137)
    assert st.state.waiting.reason == "CrashLoopBackOff"
    sim.advance(10)  # the back-off, then the script runs again from the start
    (pod,) = await job_pods(client, "oomr")
    assert main_status(pod).state.running is not None
    sim.advance(1)
    (pod,) = await job_pods(client, "oomr")
    assert main_status(pod).restartCount == 2


async def test_config_error_waits_until_the_secret_exists(sim: Simulator, client: AsyncClient) -> None:
    await client.create(trainjob("cfg", script="env:X=1: print never; config-error creds; print up; hang"))
    await sim.settle()
    (pod,) = await job_pods(client, "cfg")
    waiting = main_status(pod).state.waiting
    assert pod.status.phase == "Pending"
    assert (waiting.reason, waiting.message) == ("CreateContainerConfigError", 'secret "creds" not found')
    assert ("Warning", "Failed", 'Error: secret "creds" not found') in await reasons_for(
        client, pod.metadata.name
    )
    sim.advance(10)  # the kubelet tries again after its sync back-off: still missing
    (pod,) = await job_pods(client, "cfg")
    assert main_status(pod).state.waiting.reason == "CreateContainerConfigError"
    await client.create(Secret.from_dict({"metadata": {"name": "creds", "namespace": NS}, "data": {}}))
    sim.advance(10)
    (pod,) = await job_pods(client, "cfg")
    assert pod.status.phase == "Running"
    assert main_status(pod).state.running is not None
    no_controller_errors(sim)


async def test_create_error_keeps_the_container_waiting(sim: Simulator, client: AsyncClient) -> None:
    message = 'failed to generate container "x" spec: failed to apply OCI options: no such file or directory'
    await client.create(trainjob("cre", script=f"create-error {message}"))
    await sim.settle()
    (pod,) = await job_pods(client, "cre")
    waiting = main_status(pod).state.waiting
    assert (waiting.reason, waiting.message) == ("CreateContainerError", message)
    assert main_status(pod).restartCount == 0


async def test_env_naming_a_missing_secret_or_key_is_a_config_error(
    sim: Simulator, client: AsyncClient
) -> None:
    secret_ref = {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "api", "key": "token"}}}
    await client.create(bare_pod("needs-secret", [secret_ref]))
    cm_ref = {"configMapRef": {"name": "settings"}}
    pod = bare_pod("needs-cm", [])
    pod.spec.containers[0].envFrom = [cm_ref]  # type: ignore[list-item]
    await client.create(pod)
    optional = {"name": "O", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k", "optional": True}}}
    await client.create(bare_pod("optional", [optional]))
    await sim.settle()

    async def waiting(name: str) -> tuple[str, str] | None:
        p = await client.get(Pod, name, namespace=NS)
        w = main_status(p).state.waiting
        return None if w is None else (w.reason, w.message)

    assert await waiting("needs-secret") == ("CreateContainerConfigError", 'secret "api" not found')
    assert await waiting("needs-cm") == ("CreateContainerConfigError", 'configmap "settings" not found')
    assert await waiting("optional") is None
    await client.create(
        Secret.from_dict({"metadata": {"name": "api", "namespace": NS}, "data": {"x": "eA=="}})
    )
    sim.advance(10)
    assert await waiting("needs-secret") == (
        "CreateContainerConfigError",
        "couldn't find key token in Secret default/api",
    )
