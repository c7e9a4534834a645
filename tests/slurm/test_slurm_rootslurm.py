"""The test clusters themselves: Slurm in a Debian root (several from one root at once, the root left as
made, nothing left running after a stop) and the outages every version's cluster can cause for the
tests (a controller SIGKILLed and restarted, munge stopped and started, the login node's ssh cut or
down). What dispatch makes of those outages is the adapter's tests'; here each outage must be real
(Slurm's commands fail meanwhile) and end (they work again, the running job still runs)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from slurm_fixtures import Site, start_root_slurm

from dispatch import UnavailableError
from dispatch_slurm import parse_settings
from dispatch_slurm.daemons import alive, free_ports
from dispatch_slurm.debroot import RELEASES, find_root
from dispatch_slurm.rootslurm import RootSlurm
from dispatch_slurm.transport import SshTransport

pytestmark = pytest.mark.timeout(300)


def _wait_for(predicate: Callable[[], bool], what: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _state(site: Site, job: str) -> str:
    return site.cluster.run("squeue", "-h", "-t", "all", "-j", job, "-o", "%T").stdout.strip()


def _sleeper(site: Site) -> str:
    job = (
        site.slurm("sbatch", "--parsable", "-o", "/dev/null", "--wrap", "srun sleep 300")
        .strip()
        .split(";")[0]
    )
    _wait_for(lambda: _state(site, job) == "RUNNING", f"job {job} to run")
    return job


def test_a_killed_controller_fails_every_query_until_it_is_started_again(site: Site) -> None:
    job = _sleeper(site)
    pid = site.cluster.kill_controller()
    assert not alive(pid)
    down = site.cluster.run("squeue", "-h", "-j", job, "-o", "%T", timeout=120)
    assert down.returncode != 0 or not down.stdout.strip(), down
    site.cluster.start_controller()
    _wait_for(lambda: _state(site, job) == "RUNNING", "the restarted controller to list the running job")
    site.slurm("scancel", job)


def test_a_stopped_munge_fails_every_command_until_it_is_started_again(site: Site) -> None:
    job = _sleeper(site)
    site.cluster.stop_munge()
    try:
        down = site.cluster.run("squeue", "-h", "-o", "%i", timeout=120)
        assert down.returncode != 0, down
        assert "munge" in down.stderr.lower() or "authentication" in down.stderr.lower(), down.stderr
    finally:
        site.cluster.start_munge()
    _wait_for(lambda: _state(site, job) == "RUNNING", "the job to be listed running again")
    site.slurm("scancel", job)


def _ssh_sites(site: Site) -> RootSlurm:
    if not isinstance(site.cluster, RootSlurm):
        pytest.skip(f"Slurm {site.version} is reached without ssh (transport: local)")
    return site.cluster


async def test_a_cut_ssh_connection_is_opened_again_by_the_next_command(site: Site) -> None:
    cluster = _ssh_sites(site)
    settings = parse_settings(json.dumps(site.settings()))
    assert settings.ssh is not None
    transport = SshTransport(settings.ssh, settings.slurm_conf)
    try:
        assert (await transport.run(["true"])).ok
        assert cluster.cut_ssh() >= 1  # the shared connection (ControlMaster) was one
        # A command sent while the client still takes the cut connection for open fails (ssh's 255:
        # unavailable); once the client noticed, the next command connects again.
        for _ in range(50):
            try:
                again = await transport.run(["squeue", "-h", "-o", "%i"])
                break
            except UnavailableError:
                await asyncio.sleep(0.2)
        else:
            raise AssertionError("no command got through after the cut")
        assert again.ok, again.error()
    finally:
        await transport.close()


async def test_a_login_node_down_is_unavailable_until_its_sshd_is_back(site: Site) -> None:
    cluster = _ssh_sites(site)
    settings = parse_settings(json.dumps(site.settings()))
    assert settings.ssh is not None
    transport = SshTransport(settings.ssh, settings.slurm_conf)
    try:
        assert (await transport.run(["true"])).ok
        cluster.stop_sshd()
        try:
            with pytest.raises(UnavailableError):
                await transport.run(["true"])
        finally:
            cluster.start_sshd()
        assert (await transport.run(["true"])).ok
    finally:
        await transport.close()


@pytest.mark.parametrize("version", list(RELEASES))
def test_two_clusters_run_from_one_root_and_leave_it_as_made(tmp_path: Path, version: str) -> None:
    a = start_root_slurm(tmp_path / "a", version)
    try:
        b = start_root_slurm(tmp_path / "b", version)
        try:
            job_a = a.run("sbatch", "--parsable", "-N", "2", "-o", "/dev/null", "--wrap", "srun sleep 300")
            job_b = b.run("sbatch", "--parsable", "-N", "2", "-o", "/dev/null", "--wrap", "srun sleep 300")
            assert job_a.stdout == job_b.stdout, (job_a, job_b)  # each counts from 1
            ref = job_a.stdout.strip()
            for cluster in (a, b):
                _wait_for(lambda c=cluster: _squeue(c, ref) == "RUNNING", "both jobs to run")  # type: ignore[misc]
            before_b = set(b.processes())
            a.kill_node("n1")  # a crashed host in cluster a
            assert before_b <= set(b.processes()), "cluster b lost processes to a's node failure"
            assert _squeue(b, ref) == "RUNNING"
            left = b.pids()
            b.stop()
            assert all(pid is None or not alive(pid) for pid in left.values()), left
        finally:
            b.stop()
        assert a.pids()["slurmctld"] is not None  # b's stop left a alone
    finally:
        a.stop()
    root = find_root(version)
    assert root is not None
    # What only a running cluster makes lives in its overlay, never in the shared root.
    assert not (root / "var" / "spool" / "dispatch").exists()
    assert not (root / str(tmp_path).lstrip("/")).exists()


def _squeue(cluster: RootSlurm, job: str) -> str:
    return cluster.run("squeue", "-h", "-t", "all", "-j", job, "-o", "%T").stdout.strip()


def test_daemon_ports_stay_out_of_the_ephemeral_range_and_apart_across_processes(tmp_path: Path) -> None:
    """CI saw a 24.11 slurmd fail to bind: its port followed one ``bind(0)`` chose, inside the range
    the kernel hands out as connections' source ports, and something took it first. Test clusters'
    ports now come from below that range, each claimed for the life of the process that chose it."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    mine = [p for _ in range(50) for p in free_ports(4, consecutive=3)]
    assert len(set(mine)) == len(mine)
    assert max(mine) < low
    for i in range(0, len(mine), 7):
        assert mine[i : i + 7] == list(range(mine[i], mine[i] + 7))
    chooser = "from dispatch_slurm.daemons import free_ports\nprint(*[p for _ in range(50) for p in free_ports(4, consecutive=3)])"
    theirs = subprocess.run([sys.executable, "-c", chooser], capture_output=True, text=True, check=True)
    assert not set(mine) & {int(p) for p in theirs.stdout.split()}
