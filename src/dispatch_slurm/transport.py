"""How Slurm's commands are run: here (``local``) or on a login node over ssh (``ssh``), behind one
interface. The only module that starts processes for the adapter.

The ``ssh`` transport uses the OpenSSH client in BatchMode with ``StrictHostKeyChecking=yes`` and the
``knownHosts`` file the settings name (no trust on first use). Each command is one argv, quoted once for
the remote shell with :func:`shlex.join`.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from typing import Protocol

from dispatch.errors import InvalidError, PermissionDeniedError, UnavailableError
from dispatch_slurm.answers import Result
from dispatch_slurm.settings import Settings, Ssh

__all__ = ["CommandLostError", "LocalTransport", "Result", "SshTransport", "Transport", "open_transport"]

COMMAND_TIMEOUT = 60.0
_SSH_UNREACHABLE = 255
# ssh's words for a connection that never opened: the command did not run.
_SSH_NEVER_CONNECTED = (
    "Could not resolve hostname",
    "connect to host",
    "Connection refused",
    "No route to host",
    "Network is unreachable",
    "Connection timed out during banner exchange",
)


class CommandLostError(UnavailableError):
    """A command that may have run, whose answer was lost: it timed out, or the ssh connection broke
    after it was sent. A reading takes it as unreachable; a write's effect is unknown."""


class Transport(Protocol):
    """Runs one command where Slurm's client commands work; counts what it ran (for the benchmark)."""

    name: str
    counts: dict[str, int]

    async def run(
        self, argv: Sequence[str], *, stdin: str | None = None, env: Mapping[str, str] | None = None
    ) -> Result:
        """Run ``argv`` (with ``env`` added to its environment); :class:`CommandLostError` when it
        timed out or its connection broke, ``UnavailableError`` when it could not be run at all."""
        ...

    async def stream(self, argv: Sequence[str]) -> asyncio.subprocess.Process:
        """Start a long-running command (``tail -F``) whose stdout the caller reads."""
        ...

    async def close(self) -> None:
        """Release what the transport holds (ssh: its shared connection)."""
        ...


async def _communicate(
    argv: Sequence[str], env: Mapping[str, str] | None, stdin: str | None, shown: tuple[str, ...]
) -> Result:
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env) if env is not None else None,
        )
    except FileNotFoundError:
        raise UnavailableError(f"{argv[0]} is not installed here (is this a Slurm login node?)") from None
    try:
        async with asyncio.timeout(COMMAND_TIMEOUT):
            out, err = await proc.communicate(stdin.encode() if stdin is not None else None)
    except BaseException as exc:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        if isinstance(exc, TimeoutError):
            raise CommandLostError(f"{shown[0]} did not answer within {COMMAND_TIMEOUT:g} s") from None
        raise
    assert proc.returncode is not None
    return Result(shown, proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


class LocalTransport:
    """Slurm's commands as subprocesses of this process (on a login node, or a node of the cluster)."""

    name = "local"

    def __init__(self, slurm_conf: str | None = None) -> None:
        self._env = dict(os.environ)
        if slurm_conf:
            self._env["SLURM_CONF"] = slurm_conf
        self.counts: dict[str, int] = {}

    async def run(
        self, argv: Sequence[str], *, stdin: str | None = None, env: Mapping[str, str] | None = None
    ) -> Result:
        self.counts[argv[0]] = self.counts.get(argv[0], 0) + 1
        return await _communicate(argv, {**self._env, **(env or {})}, stdin, tuple(argv))

    async def stream(self, argv: Sequence[str]) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=self._env
        )

    async def close(self) -> None:
        return None


class SshTransport:
    """Slurm's commands on a login node, through the OpenSSH client."""

    name = "ssh"

    def __init__(self, ssh: Ssh, slurm_conf: str | None = None) -> None:
        client = shutil.which("ssh")
        if client is None:
            raise UnavailableError("transport: ssh needs the OpenSSH client (ssh) on this machine")
        if not os.path.isfile(ssh.known_hosts):
            raise InvalidError(f"no such known_hosts file: {ssh.known_hosts}", path="ssh.knownHosts")
        # One ssh connection carries every command (ControlMaster): a command costs a channel, not a
        # handshake. The control socket lives in a private directory removed on close.
        self._control = tempfile.mkdtemp(prefix="dispatch-ssh-")
        self._closed = False
        self._base = [
            client,
            "-o", "ControlMaster=auto",
            "-o", f"ControlPath={self._control}/%C",
            "-o", "ControlPersist=60",
            "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={ssh.known_hosts}",
            "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "ConnectTimeout=15",
            "-o", "LogLevel=ERROR",
            "-p", str(ssh.port),
        ]  # fmt: skip
        if ssh.identity_file:
            self._base += ["-o", "IdentitiesOnly=yes", "-i", ssh.identity_file]
        if ssh.user:
            self._base += ["-l", ssh.user]
        self._base += ["--", ssh.host]
        self._prefix = f"SLURM_CONF={shlex.quote(slurm_conf)} " if slurm_conf else ""
        self._host = ssh.host
        self.counts: dict[str, int] = {}

    def _argv(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
        assigned = "".join(f"{k}={shlex.quote(v)} " for k, v in (env or {}).items())
        return [*self._base, self._prefix + assigned + shlex.join(argv)]

    async def run(
        self, argv: Sequence[str], *, stdin: str | None = None, env: Mapping[str, str] | None = None
    ) -> Result:
        self.counts[argv[0]] = self.counts.get(argv[0], 0) + 1
        result = await _communicate(self._argv(argv, env), None, stdin, tuple(argv))
        if result.returncode == _SSH_UNREACHABLE:
            text = result.stderr.strip()
            last = text.splitlines()[-1] if text else "no message"
            if "Host key verification failed" in text or "Permission denied" in text:
                raise PermissionDeniedError(f"ssh to {self._host} refused: {last}")
            if any(words in text for words in _SSH_NEVER_CONNECTED):
                raise UnavailableError(f"ssh to {self._host} failed: {last}")
            raise CommandLostError(f"ssh to {self._host} broke off: {last}")
        return result

    async def stream(self, argv: Sequence[str]) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *self._argv(argv), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
        )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        host = self._base[-1]
        ended = await asyncio.create_subprocess_exec(
            *self._base[:-2], "-O", "exit", "--", host,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        await ended.wait()
        shutil.rmtree(self._control, ignore_errors=True)


def open_transport(settings: Settings) -> LocalTransport | SshTransport:
    if settings.transport == "ssh":
        assert settings.ssh is not None  # the settings refuse ssh without it
        return SshTransport(settings.ssh, settings.slurm_conf)
    return LocalTransport(settings.slurm_conf)
