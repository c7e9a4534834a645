"""The kubelet's ``processes`` mode: a pod's main container runs its real command as a local process.

What the container would see, as near as a process on this machine can: its command and args, its env
(values and fieldRefs resolved, so ``DISPATCH_*`` and the Job's completion index come through), the
rendezvous address rewritten to the loopback one (each workload gets its own free port, since all pods
share one network here), and its persistent volumes mapped to local directories (a path under a mount
path, in env or argv, is rewritten to the volume's directory). Its output goes to the pod log. The image
is named, never pulled: the command runs with this machine's programs (``PATH``), in the mode's working
directory.

Stopping follows the kubelet and the container runtime: the stop signal goes to the container's main
process only (its PID 1), SIGKILL to every process of the container when the grace period ends
(``killContainer`` in ``pkg/kubelet/kuberuntime/kuberuntime_container.go``: at least
``minimumGracePeriodInSeconds``, 2 s) or when the main process exits (the PID namespace ends). A PID 1 that
installed no SIGTERM handler does not see SIGTERM at all (``pid_namespaces(7)``; ``sig_task_ignored`` in
the kernel's ``kernel/signal.c``), so such a process is not sent it here either and waits for SIGKILL.
Each pod's process leads its own process group, so nothing outlives its pod or kubesim.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from kubesim.clock import Clock, TimerHandle

__all__ = [
    "ADDRESS_VARS",
    "LOOPBACK",
    "MIN_GRACE",
    "PORT_VARS",
    "ProcessMode",
    "ProcessRunner",
    "command_of",
    "process_env",
    "rewrite_path",
    "volume_dirs",
    "workload_of",
]

log = logging.getLogger("kubesim.controllers")

LOOPBACK = "127.0.0.1"
ADDRESS_VARS = frozenset({"MASTER_ADDR", "PET_MASTER_ADDR"})
"""Rendezvous addresses (torch.distributed's, Kubeflow Trainer's torch runtime's): the loopback address."""
PORT_VARS = frozenset({"MASTER_PORT", "PET_MASTER_PORT"})
"""Rendezvous ports: the workload's own port, so two jobs running at once do not collide on one port."""
ENDPOINT_VARS = frozenset({"JAX_COORDINATOR_ADDRESS"})
"""``host:port`` rendezvous endpoints (Trainer's JAX runtime): both rewritten."""
PASSED = ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR")
"""What a process takes from kubesim's own environment (an image brings these; nothing else leaks in)."""
MIN_GRACE = 2.0
"""The kubelet's ``minimumGracePeriodInSeconds``: SIGKILL never comes sooner than this after SIGTERM."""
_READ = 1 << 16


@dataclass(frozen=True)
class ProcessMode:
    """The ``processes`` mode's setting: where pods' processes run, and where volumes keep their files."""

    workdir: Path
    volumes: Path

    @classmethod
    def at(cls, workdir: str | os.PathLike[str], volumes: str | os.PathLike[str]) -> ProcessMode:
        return cls(Path(workdir).resolve(), Path(volumes).resolve())


# ------------------------------------------------------------------------------------- pure parts


def command_of(container: Mapping[str, Any]) -> list[str] | None:
    """The container's command and args; None when it names no command (only the image knows it)."""
    command = [str(c) for c in container.get("command") or []]
    if not command:
        return None
    return command + [str(a) for a in container.get("args") or []]


def workload_of(pod: Mapping[str, Any]) -> str:
    """The key of the workload a pod's rank belongs to: a JobSet's run (its uid and restart attempt),
    else its Job, else the pod itself. Its ranks share one rendezvous port."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    jobset = labels.get("jobset.sigs.k8s.io/jobset-uid")
    if jobset:
        return f"jobset/{jobset}/{labels.get('jobset.sigs.k8s.io/restart-attempt', '0')}"
    job = labels.get("batch.kubernetes.io/controller-uid") or labels.get("controller-uid")
    return f"job/{job}" if job else f"pod/{meta.get('uid', '')}"


def rewrite_path(value: str, mounts: Mapping[str, Path]) -> str:
    """``value`` with a leading mount path (the whole value, or up to a ``/``) replaced by its directory."""
    for mount in sorted(mounts, key=len, reverse=True):
        if value == mount or value.startswith(mount.rstrip("/") + "/"):
            rest = value[len(mount.rstrip("/")) :].lstrip("/")
            return str(mounts[mount] / rest) if rest else str(mounts[mount])
    return value


def process_env(
    env: Mapping[str, str], base: Mapping[str, str], mounts: Mapping[str, Path], port: int
) -> dict[str, str]:
    """The process's environment: what it takes from kubesim's (``PASSED``), then the container's, with
    the rendezvous on the loopback address and ``port``, and mount paths mapped."""
    out = {k: base[k] for k in PASSED if k in base}
    for name, value in env.items():
        if name in ADDRESS_VARS:
            value = LOOPBACK
        elif name in PORT_VARS:
            value = str(port)
        elif name in ENDPOINT_VARS:
            value = f"{LOOPBACK}:{port}"
        else:
            value = rewrite_path(value, mounts)
        out[name] = value
    return out


def volume_dirs(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    claim: Callable[[str], Mapping[str, Any] | None],
    volume: Callable[[str], Mapping[str, Any] | None],
    root: Path,
) -> dict[str, Path]:
    """``{mountPath: local directory}`` for the container's mounts of persistent volume claims (the bound
    PersistentVolume's ``hostPath``, else ``root/<volume>``) and of ``emptyDir`` volumes (per pod, under
    ``root/pods``). Other volumes are not mapped."""
    spec = pod.get("spec") or {}
    uid = (pod.get("metadata") or {}).get("uid", "")
    by_name = {str(v.get("name")): v for v in spec.get("volumes") or []}
    out: dict[str, Path] = {}
    for m in container.get("volumeMounts") or []:
        v = by_name.get(str(m.get("name")))
        mount = str(m.get("mountPath") or "")
        if v is None or not mount.startswith("/"):
            continue
        base: Path | None = None
        pvc = (v.get("persistentVolumeClaim") or {}).get("claimName")
        if pvc:
            bound = str(((claim(str(pvc)) or {}).get("spec") or {}).get("volumeName") or "")
            if not bound:
                continue
            host = (((volume(bound) or {}).get("spec") or {}).get("hostPath") or {}).get("path")
            base = Path(host) if host and Path(host).is_relative_to(root) else root / bound
        elif "emptyDir" in v:
            base = root / "pods" / uid / str(v.get("name"))
        if base is None:
            continue
        sub = PurePosixPath(str(m.get("subPath") or ""))
        if sub.is_absolute() or ".." in sub.parts:
            continue  # the kubelet refuses such a subPath; nothing is mapped
        out[mount] = base / sub if str(sub) not in ("", ".") else base
    return out


def catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` installed a handler for ``signum`` (Linux: ``SigCgt`` in
    ``/proc/PID/status``); True where that cannot be read."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------------------ the runner


@dataclass
class _Proc:
    """One pod's process: its output and its end are read on the event loop (no thread per process)."""

    popen: subprocess.Popen[bytes]
    on_line: Callable[[str], None]
    on_exit: Callable[[int, str | None], None]
    done: asyncio.Future[None]
    status: int | None = None
    eof: bool = False
    partial: bytes = b""
    stopping: bool = False
    timer: TimerHandle | None = None
    drain: asyncio.TimerHandle | None = None


class ProcessRunner:
    """Starts pods' processes, feeds their output and exit back, stops them as a kubelet would."""

    def __init__(self, mode: ProcessMode, clock: Clock) -> None:
        self.mode = mode
        self.clock = clock
        self._procs: dict[str, _Proc] = {}
        self._ports: dict[str, int] = {}

    def port(self, workload: str) -> int:
        """The rendezvous port of a workload (chosen free when its first rank starts)."""
        if workload not in self._ports:
            self._ports[workload] = free_port()
        return self._ports[workload]

    def running(self, uid: str) -> bool:
        return uid in self._procs

    def start(
        self,
        uid: str,
        argv: list[str],
        env: Mapping[str, str],
        on_line: Callable[[str], None],
        on_exit: Callable[[int, str | None], None],
    ) -> None:
        """Run ``argv`` for pod ``uid``: each output line to ``on_line``, then its exit code (128 + the
        signal when a signal ended it, as the container runtime reports) to ``on_exit``, with why it
        could not start (the runtime's ``StartError``, code 128) when it could not."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "kubesim's processes mode runs pods' processes on the simulator's event loop"
            ) from None
        self.mode.workdir.mkdir(parents=True, exist_ok=True)
        try:
            popen = subprocess.Popen(
                argv,
                cwd=self.mode.workdir,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: signalled and killed as one
                close_fds=True,
            )
        except OSError as exc:  # the runtime's StartError: the task could not exec the command
            why = f"exec: {argv[0]!r}: {exc.strerror or exc}"
            loop.call_soon(on_exit, 128, why)
            return
        proc = _Proc(popen, on_line, on_exit, loop.create_future())
        self._procs[uid] = proc
        assert popen.stdout is not None
        fd = popen.stdout.fileno()
        os.set_blocking(fd, False)
        loop.add_reader(fd, self._readable, uid, proc)
        self._watch_exit(loop, uid, proc)

    def _watch_exit(self, loop: asyncio.AbstractEventLoop, uid: str, proc: _Proc) -> None:
        """Learn of the main process's end as it happens: a pidfd on Linux, else a poll."""
        try:
            pidfd = os.pidfd_open(proc.popen.pid)
        except (AttributeError, OSError):
            pidfd = -1
        if pidfd >= 0:

            def ready() -> None:
                loop.remove_reader(pidfd)
                os.close(pidfd)
                self._exited(uid, proc)

            loop.add_reader(pidfd, ready)
            return

        def poll() -> None:
            if proc.popen.poll() is None:
                loop.call_later(0.05, poll)
            else:
                self._exited(uid, proc)

        loop.call_later(0.05, poll)

    def _readable(self, uid: str, proc: _Proc) -> None:
        assert proc.popen.stdout is not None
        fd = proc.popen.stdout.fileno()
        try:
            chunk = os.read(fd, _READ)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if chunk:
            proc.partial += chunk
            *lines, proc.partial = proc.partial.split(b"\n")
            for line in lines:
                proc.on_line(line.decode(errors="replace"))
            return
        self._close_output(proc)
        self._finish(uid, proc)

    def _close_output(self, proc: _Proc) -> None:
        if proc.eof:
            return
        proc.eof = True
        assert proc.popen.stdout is not None
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(proc.popen.stdout.fileno())
        if proc.partial:
            proc.on_line(proc.partial.decode(errors="replace"))
            proc.partial = b""
        proc.popen.stdout.close()

    def _exited(self, uid: str, proc: _Proc) -> None:
        """The main process ended: so does every process of the container (its PID namespace ends)."""
        self._kill_group(proc)  # before reaping it: its id names the group only while it is unreaped
        proc.status = proc.popen.wait()
        # What it printed last is still in the pipe: read to the end, which the group's end brings
        # (bounded, for a process that left the group and kept the pipe).
        proc.drain = asyncio.get_running_loop().call_later(2.0, self._give_up_output, uid, proc)
        self._finish(uid, proc)

    def _give_up_output(self, uid: str, proc: _Proc) -> None:
        self._close_output(proc)
        self._finish(uid, proc)

    def _finish(self, uid: str, proc: _Proc) -> None:
        if proc.status is None or not proc.eof or proc.done.done():
            return
        if proc.timer is not None:
            proc.timer.cancel()
        if proc.drain is not None:
            proc.drain.cancel()
        if self._procs.get(uid) is proc:
            del self._procs[uid]
        proc.done.set_result(None)
        status = proc.status
        proc.on_exit(status if status >= 0 else 128 - status, None)

    def stop(self, uid: str, grace: float) -> None:
        """SIGTERM to the main process now (if it handles it), SIGKILL to the whole container after
        ``grace`` simulated seconds (at least :data:`MIN_GRACE`)."""
        proc = self._procs.get(uid)
        if proc is None or proc.stopping:
            return
        proc.stopping = True
        self._signal(proc, signal.SIGTERM)
        when = self.clock.now() + max(grace, MIN_GRACE)
        with contextlib.suppress(RuntimeError):
            proc.timer = self.clock.call_at(when, lambda: self._kill_group(proc))

    def kill(self, uid: str) -> None:
        """SIGKILL to every process of the pod now (its container ended by other means)."""
        proc = self._procs.get(uid)
        if proc is not None:
            proc.stopping = True
            self._kill_group(proc)

    def _signal(self, proc: _Proc, signum: int) -> None:
        if proc.status is not None or proc.popen.returncode is not None:
            return
        if not catches(proc.popen.pid, signum):
            return  # a container's PID 1 without a handler never sees it
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.popen.pid, signum)

    @staticmethod
    def _kill_group(proc: _Proc) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.popen.pid, signal.SIGKILL)

    async def close(self) -> None:
        """Kubesim stops: every pod's processes are killed, and waited for."""
        procs = list(self._procs.values())
        for proc in procs:
            proc.stopping = True
            self._kill_group(proc)
        if procs:
            await asyncio.wait([p.done for p in procs], timeout=10.0)
