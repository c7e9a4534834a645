"""The kubelet's processes mode over real HTTP: a pod's command runs as a local process, its output is the
pod log, its exit and signals the container status; a deletion sends SIGTERM, then SIGKILL after the
grace period; volumes map to local directories; nothing outlives its pod or the simulator. Behaviour
scripts keep running beside it."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kubesim import Simulator
from kubesim.clock import RealClock
from kubesim.controllers.processes import ProcessMode

from .conftest import call

NS = "default"
SPEED = 10.0
WAIT = 60.0
"""A hang guard for waits on conditions, never a measure (a loaded machine is slow)."""
PODS = f"/api/v1/namespaces/{NS}/pods"


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[Simulator]:
    mode = ProcessMode.at(tmp_path / "work", tmp_path / "volumes")
    async with Simulator(clock=RealClock(SPEED), processes=mode, bookmark_interval=0.05) as s:
        yield s


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def pod(
    name: str,
    command: list[str] | None,
    *,
    env: dict[str, str] | None = None,
    grace: int | None = None,
    restart: str = "Never",
    **spec: Any,
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "node",
        "image": "registry.example.com/train:1",
        "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
    }
    if command is not None:
        container["command"] = command
    body: dict[str, Any] = {"containers": [container], "restartPolicy": restart, **spec}
    if grace is not None:
        body["terminationGracePeriodSeconds"] = grace
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS}, "spec": body}


async def create(sim: Simulator, obj: dict[str, Any], path: str = PODS) -> dict[str, Any]:
    status, body = await call(sim, "POST", path, obj)
    assert status == 201, body
    return dict(body)


async def get(sim: Simulator, name: str) -> dict[str, Any] | None:
    status, body = await call(sim, "GET", f"{PODS}/{name}")
    return dict(body) if status == 200 else None


async def until(probe: Callable[[], Awaitable[Any]], what: str) -> Any:
    """Wait for ``probe()`` to return something true (polling), and return it."""
    deadline = asyncio.get_running_loop().time() + WAIT
    while True:
        found = await probe()
        if found:
            return found
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"no {what} within {WAIT:g} s")
        await asyncio.sleep(0.05)


def main_status(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(obj["status"]["containerStatuses"][0])


async def terminated(sim: Simulator, name: str) -> dict[str, Any]:
    """The pod once its main container terminated."""

    async def probe() -> dict[str, Any] | None:
        p = await get(sim, name)
        return p if p and "terminated" in (main_status(p).get("state") or {}) else None

    return dict(await until(probe, f"terminated container in {name}"))


async def log(sim: Simulator, name: str, *, waiting: bool = False, **params: str) -> list[str]:
    """The pod's log lines; with ``waiting``, none while its container has not started (a 400)."""
    ctx = ssl.create_default_context(cadata=sim.cert.cert_pem.decode()) if sim.cert is not None else None
    headers = {"Authorization": f"Bearer {sim.token('admin')}"}
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx) if ctx else None) as session,
        session.get(f"{sim.url}{PODS}/{name}/log", headers=headers, params=params) as resp,
    ):
        if waiting and resp.status == 400:
            return []
        assert resp.status == 200, await resp.text()
        return (await resp.text()).splitlines()


async def follow_log(sim: Simulator, name: str, started: asyncio.Event) -> list[str]:
    """Every line of the pod's log, followed to the container's end (``started`` once one came)."""
    ctx = ssl.create_default_context(cadata=sim.cert.cert_pem.decode()) if sim.cert is not None else None
    headers = {"Authorization": f"Bearer {sim.token('admin')}"}
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx) if ctx else None) as session,
        session.get(
            f"{sim.url}{PODS}/{name}/log",
            headers=headers,
            params={"follow": "true"},
            timeout=aiohttp.ClientTimeout(WAIT),
        ) as resp,
    ):
        assert resp.status == 200, await resp.text()
        lines = []
        async for raw in resp.content:
            lines.append(raw.decode().rstrip("\n"))
            started.set()
        return lines


async def line_in_log(sim: Simulator, name: str, text: str) -> None:
    async def probe() -> bool:
        return (await get(sim, name)) is not None and any(
            text in ln for ln in await log(sim, name, waiting=True)
        )

    await until(probe, f"{text!r} in the log of {name}")


async def watch_until_deleted(sim: Simulator, name: str, rv: str) -> dict[str, Any]:
    """The pod as its DELETED watch event shows it (its last status, written before it went)."""
    ctx = ssl.create_default_context(cadata=sim.cert.cert_pem.decode()) if sim.cert is not None else None
    headers = {"Authorization": f"Bearer {sim.token('admin')}"}
    params = {"watch": "1", "resourceVersion": rv, "fieldSelector": f"metadata.name={name}"}
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx) if ctx else None) as session,
        session.get(
            sim.url + PODS, headers=headers, params=params, timeout=aiohttp.ClientTimeout(WAIT)
        ) as resp,
    ):
        async for raw in resp.content:
            event = json.loads(raw)
            if event["type"] == "DELETED":
                return dict(event["object"])
    raise AssertionError(f"the watch of {name} ended before it was deleted")


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def pid_gone(pid: int) -> None:
    async def probe() -> bool:
        return gone(pid)

    await until(probe, f"the end of process {pid}")


def no_controller_errors(sim: Simulator) -> None:
    assert sim.controller_errors == []
    for c in sim.controllers:
        assert getattr(c, "errors", []) == [], (c.name, c.errors)


# ---------------------------------------------------------------------------------------------- tests


async def test_the_command_runs_with_the_containers_env_and_its_output_is_the_pod_log(
    sim: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBESIM_HOST_ONLY", "not for pods")  # kubesim's own environment stays its own
    code = """
        import os
        print("hello from", os.getcwd())
        print("X", os.environ["X"])
        print("host", os.environ.get("KUBESIM_HOST_ONLY"))
    """
    await create(sim, pod("hello", python(code), env={"X": "42"}))
    done = await terminated(sim, "hello")
    term = main_status(done)["state"]["terminated"]
    assert (done["status"]["phase"], term["exitCode"], term["reason"]) == ("Succeeded", 0, "Completed")
    assert await log(sim, "hello") == [f"hello from {tmp_path / 'work'}", "X 42", "host None"]
    no_controller_errors(sim)


async def test_an_exit_code_and_a_signal_reach_the_container_status(sim: Simulator) -> None:
    await create(sim, pod("three", python("import sys; print('failing'); sys.exit(3)")))
    await create(sim, pod("segv", python("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")))
    three = main_status(await terminated(sim, "three"))["state"]["terminated"]
    segv = main_status(await terminated(sim, "segv"))["state"]["terminated"]
    assert (three["exitCode"], three["reason"]) == (3, "Error")
    assert (segv["exitCode"], segv["reason"]) == (
        128 + 11,
        "Error",
    )  # 128 + the signal, as containerd reports
    assert "signal" not in segv  # the kubelet never fills it from a CRI status
    assert (await get(sim, "three") or {})["status"]["phase"] == "Failed"
    assert await log(sim, "three") == ["failing"]


async def test_a_deleted_pods_process_gets_sigterm_and_its_exit_is_the_last_status(sim: Simulator) -> None:
    code = """
        import signal, sys, time
        def stop(signum, frame):
            print("got SIGTERM, saving", flush=True)
            sys.exit(143)
        signal.signal(signal.SIGTERM, stop)
        print("ready", flush=True)
        while True:
            time.sleep(0.1)
    """
    created = await create(sim, pod("polite", python(code), grace=30))
    await line_in_log(sim, "polite", "ready")
    watching = asyncio.create_task(watch_until_deleted(sim, "polite", created["metadata"]["resourceVersion"]))
    await asyncio.sleep(0)
    status, _ = await call(sim, "DELETE", f"{PODS}/polite")
    assert status == 200
    last = await watching
    term = main_status(last)["state"]["terminated"]
    assert (term["exitCode"], term["reason"], last["status"]["phase"]) == (143, "Error", "Failed")
    no_controller_errors(sim)


@pytest.mark.parametrize(
    ("name", "code", "said"),
    [
        # A handler that does not exit: SIGKILL after the grace period.
        ("stubborn", "import signal, time\nsignal.signal(signal.SIGTERM, lambda s, f: print('ignoring', flush=True))\nprint('ready', flush=True)\ntime.sleep(600)", ["ready", "ignoring"]),
        # No handler at all: as a container's PID 1 it never sees SIGTERM, and is killed after the grace.
        ("deaf", "import time\nprint('ready', flush=True)\ntime.sleep(600)", ["ready"]),
    ],
)  # fmt: skip
async def test_a_process_still_running_after_the_grace_period_is_killed(
    sim: Simulator, name: str, code: str, said: list[str]
) -> None:
    created = await create(sim, pod(name, [sys.executable, "-c", code], grace=5))
    await line_in_log(sim, name, "ready")
    watching = asyncio.create_task(watch_until_deleted(sim, name, created["metadata"]["resourceVersion"]))
    followed = asyncio.Event()
    following = asyncio.create_task(follow_log(sim, name, followed))
    await followed.wait()
    await call(sim, "DELETE", f"{PODS}/{name}")
    last = await watching
    term = main_status(last)["state"]["terminated"]
    assert (term["exitCode"], term["reason"]) == (137, "Error")
    assert await following == said  # SIGTERM reached only the process with a handler


async def test_the_processes_of_a_container_end_with_it(sim: Simulator, tmp_path: Path) -> None:
    """A child left behind by the main process is killed when the main process exits, as the PID
    namespace's end kills it in a container."""
    code = """
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print("child", child.pid, flush=True)
    """
    await create(sim, pod("parent", python(code)))
    await terminated(sim, "parent")
    (line,) = await log(sim, "parent")
    await pid_gone(int(line.split()[1]))


async def test_a_forced_deletion_and_the_simulators_end_stop_the_processes(tmp_path: Path) -> None:
    mode = ProcessMode.at(tmp_path / "work", tmp_path / "volumes")
    code = "import os, time\nprint('pid', os.getpid(), flush=True)\ntime.sleep(600)"
    async with Simulator(clock=RealClock(SPEED), processes=mode) as s:
        await create(s, pod("forced", [sys.executable, "-c", code]))
        await create(s, pod("left", [sys.executable, "-c", code]))
        await line_in_log(s, "forced", "pid")
        await line_in_log(s, "left", "pid")
        forced = int((await log(s, "forced"))[0].split()[1])
        left = int((await log(s, "left"))[0].split()[1])
        status, _ = await call(s, "DELETE", f"{PODS}/forced", gracePeriodSeconds="0")
        assert status == 200 and await get(s, "forced") is None
        await pid_gone(forced)  # SIGTERM ignored (no handler), SIGKILL after the kubelet's minimum 2 s
        assert not gone(left)
    assert gone(left)  # the simulator stopped: so did every pod's process


async def test_a_pod_with_a_behaviour_script_keeps_running_its_script(sim: Simulator) -> None:
    scripted = pod("scripted", ["/no/such/program"], env={"KUBESIM_SCRIPT": "print scripted {rank}; exit 4"})
    await create(sim, scripted)
    term = main_status(await terminated(sim, "scripted"))["state"]["terminated"]
    assert term["exitCode"] == 4 and await log(sim, "scripted") == ["scripted 0"]


async def test_a_command_that_cannot_run_is_a_start_error_and_none_is_a_create_error(sim: Simulator) -> None:
    await create(sim, pod("missing", ["/no/such/program", "--flag"]))
    await create(sim, pod("imageonly", None))
    term = main_status(await terminated(sim, "missing"))["state"]["terminated"]
    assert (term["exitCode"], term["reason"]) == (128, "StartError")
    assert "/no/such/program" in term["message"]

    async def waiting() -> dict[str, Any] | None:
        p = await get(sim, "imageonly")
        w = (
            (main_status(p).get("state") or {}).get("waiting")
            if p and p["status"].get("containerStatuses")
            else None
        )
        return w if w and w.get("reason") == "CreateContainerError" else None

    why = await until(waiting, "CreateContainerError")
    assert "names no command" in why["message"] and "not pulled" in why["message"]


async def test_a_failed_process_restarts_in_place_under_on_failure(sim: Simulator) -> None:
    await create(sim, pod("again", python("print('attempt'); raise SystemExit(1)"), restart="OnFailure"))

    async def restarted() -> dict[str, Any] | None:
        p = await get(sim, "again")
        if p and p["status"].get("containerStatuses") and main_status(p)["restartCount"] >= 2:
            return p
        return None

    p = await until(restarted, "two restarts")
    assert main_status(p)["lastState"]["terminated"]["exitCode"] == 1
    assert await log(sim, "again", previous="true") == ["attempt"]


async def test_a_trainjobs_ranks_meet_on_the_loopback_address_with_their_own_port(sim: Simulator) -> None:
    """The torch runtime's PET_MASTER_ADDR names rank 0's pod; here every pod shares this machine's
    network, so it is the loopback address, and PET_MASTER_PORT a free port of the job's own."""
    code = """
        import os
        for k in ("PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NODE_RANK", "JOB_COMPLETION_INDEX", "PET_NNODES"):
            print(k, os.environ.get(k))
    """
    trainer = {"image": "registry.example.com/train:1", "command": python(code), "numNodes": 2}
    for name in ("tj-a", "tj-b"):
        tj = {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"runtimeRef": {"name": "dispatch-torch"}, "trainer": trainer},
        }
        await create(sim, tj, f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NS}/trainjobs")

    async def finished() -> list[dict[str, Any]] | None:
        _, body = await call(sim, "GET", PODS)
        done = [p for p in body["items"] if p["status"].get("phase") == "Succeeded"]
        return done if len(done) == 4 else None

    seen: dict[str, dict[str, dict[str, str]]] = {}
    for p in await until(finished, "four pods succeeded"):
        env = dict(line.split(" ", 1) for line in await log(sim, p["metadata"]["name"]))
        job = p["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"]
        seen.setdefault(job, {})[env["PET_NODE_RANK"]] = env
    for job in ("tj-a", "tj-b"):
        ranks = seen[job]
        assert sorted(ranks) == ["0", "1"]
        assert {r["PET_MASTER_ADDR"] for r in ranks.values()} == {"127.0.0.1"}
        assert len({r["PET_MASTER_PORT"] for r in ranks.values()}) == 1  # one port per job
        assert all(r["JOB_COMPLETION_INDEX"] == rank and r["PET_NNODES"] == "2" for rank, r in ranks.items())
    assert seen["tj-a"]["0"]["PET_MASTER_PORT"] != seen["tj-b"]["0"]["PET_MASTER_PORT"]
    no_controller_errors(sim)


async def test_a_claims_mount_is_a_local_directory(sim: Simulator, tmp_path: Path) -> None:
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "ckpt", "namespace": NS},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    await create(sim, claim, f"/api/v1/namespaces/{NS}/persistentvolumeclaims")
    code = """
        import os, sys
        path = os.path.join(os.environ["CKPT"], "state.txt")
        os.makedirs(os.environ["CKPT"], exist_ok=True)
        with open(path, "w") as f:
            f.write("saved")
        print(path, sys.argv[1])
    """
    writer = pod("writer", [*python(code), "/ckpt/arg"], env={"CKPT": "/ckpt/run-1"})
    writer["spec"]["volumes"] = [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}}]
    writer["spec"]["containers"][0]["volumeMounts"] = [{"name": "ckpt", "mountPath": "/ckpt"}]
    await create(sim, writer)
    done = await terminated(sim, "writer")
    assert done["status"]["phase"] == "Succeeded", await log(sim, "writer")
    _, pvc = await call(sim, "GET", f"/api/v1/namespaces/{NS}/persistentvolumeclaims/ckpt")
    _, pv = await call(sim, "GET", f"/api/v1/persistentvolumes/{pvc['spec']['volumeName']}")
    host = Path(pv["spec"]["hostPath"]["path"])
    assert host.parent == tmp_path / "volumes"  # the provisioner's hostPath is a real directory here
    assert (host / "run-1" / "state.txt").read_text() == "saved"
    assert await log(sim, "writer") == [f"{host / 'run-1' / 'state.txt'} {host / 'arg'}"]


async def test_an_annotation_preempts_a_running_pod_as_the_scheduler_would(sim: Simulator) -> None:
    code = """
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda s, f: (print("preempted, saving", flush=True), sys.exit(143)))
        print("ready", flush=True)
        time.sleep(600)
    """
    created = await create(sim, pod("victim", python(code)))
    await line_in_log(sim, "victim", "ready")
    watching = asyncio.create_task(watch_until_deleted(sim, "victim", created["metadata"]["resourceVersion"]))
    await asyncio.sleep(0)
    patch = {"metadata": {"annotations": {"kubesim.io/disrupt": "preempt"}}}
    status, _ = await call(sim, "PATCH", f"{PODS}/victim", patch, ctype="application/merge-patch+json")
    assert status == 200
    last = await watching
    disruption = next(c for c in last["status"]["conditions"] if c["type"] == "DisruptionTarget")
    assert (disruption["status"], disruption["reason"]) == ("True", "PreemptionByScheduler")
    assert main_status(last)["state"]["terminated"]["exitCode"] == 143


async def test_an_annotation_that_is_not_a_disruption_is_an_event(sim: Simulator) -> None:
    await create(sim, pod("calm", python("import time; print('ready', flush=True); time.sleep(600)")))
    await line_in_log(sim, "calm", "ready")
    patch = {"metadata": {"annotations": {"kubesim.io/disrupt": "dance"}}}
    await call(sim, "PATCH", f"{PODS}/calm", patch, ctype="application/merge-patch+json")

    async def event() -> dict[str, Any] | None:
        _, body = await call(
            sim, "GET", f"/api/v1/namespaces/{NS}/events", fieldSelector="involvedObject.name=calm"
        )
        return next((e for e in body["items"] if e["reason"] == "DisruptFailed"), None)

    found = await until(event, "a DisruptFailed Event")
    assert "kubesim.io/disrupt='dance'" in found["message"]
    assert (await get(sim, "calm") or {})["status"]["phase"] == "Running"
