"""The ssh transport against a real sshd on loopback: no trust on first use, clear refusals."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest
from slurm_fixtures import Sshd

from dispatch import InvalidError, PermissionDeniedError, UnavailableError
from dispatch_slurm import open_backend, parse_settings
from dispatch_slurm.localslurm import LocalSlurm
from dispatch_slurm.transport import CommandLostError


def ssh_settings(slurm: LocalSlurm, sshd: Sshd, known_hosts: Path) -> bytes:
    raw = {
        "transport": "ssh",
        "slurmConf": str(slurm.conf),
        "ssh": {
            "host": "127.0.0.1",
            "port": sshd.port,
            "user": "root",
            "identityFile": str(sshd.identity_file),
            "knownHosts": str(known_hosts),
        },
    }
    return json.dumps(raw).encode()


async def test_opening_over_ssh_reads_the_cluster(slurm: LocalSlurm, sshd: Sshd) -> None:
    backend = await open_backend(parse_settings(ssh_settings(slurm, sshd, sshd.known_hosts)), read_only=True)
    assert backend.cluster_id.startswith("slurm:")
    assert backend.transport.name == "ssh"
    await backend.close()


async def test_a_host_key_not_in_known_hosts_is_refused(
    slurm: LocalSlurm, sshd: Sshd, tmp_path: Path
) -> None:
    other = tmp_path / "other_key"
    made = await asyncio.create_subprocess_exec(
        "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)
    )
    assert await made.wait() == 0
    kind, key = (other.with_suffix(".pub")).read_text().split()[:2]
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[127.0.0.1]:{sshd.port} {kind} {key}\n")
    with pytest.raises(PermissionDeniedError) as caught:
        await open_backend(parse_settings(ssh_settings(slurm, sshd, wrong)))
    assert "127.0.0.1" in str(caught.value) and "Host key verification failed" in str(caught.value)


async def test_an_empty_known_hosts_is_no_trust_on_first_use(
    slurm: LocalSlurm, sshd: Sshd, tmp_path: Path
) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(PermissionDeniedError):
        await open_backend(parse_settings(ssh_settings(slurm, sshd, empty)))
    assert empty.read_text() == ""  # nothing was learnt


async def test_a_missing_known_hosts_file_is_refused_naming_it(
    slurm: LocalSlurm, sshd: Sshd, tmp_path: Path
) -> None:
    with pytest.raises(InvalidError) as caught:
        await open_backend(parse_settings(ssh_settings(slurm, sshd, tmp_path / "nope")))
    assert caught.value.path == "ssh.knownHosts"


async def test_a_command_over_ssh_gets_its_environment_and_an_unreachable_login_node_is_unavailable(
    slurm: LocalSlurm, sshd: Sshd
) -> None:
    """sacct runs with SLURM_TIME_FORMAT=%s on the login node (its End as epoch seconds whatever the
    node's zone); a login node that cannot be reached is unavailable (nothing ran), not a refusal."""
    backend = await open_backend(parse_settings(ssh_settings(slurm, sshd, sshd.known_hosts)), read_only=True)
    try:
        got = await backend.transport.run(["printenv", "SLURM_TIME_FORMAT"], env={"SLURM_TIME_FORMAT": "%s"})
        assert got.ok and got.stdout.strip() == "%s"
    finally:
        await backend.close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # nothing listens there once the socket is closed
    raw = json.loads(ssh_settings(slurm, sshd, sshd.known_hosts))
    raw["ssh"]["port"] = closed
    with pytest.raises(UnavailableError) as caught:
        await open_backend(parse_settings(json.dumps(raw)))
    assert not isinstance(caught.value, CommandLostError)
    assert "Connection refused" in str(caught.value)
