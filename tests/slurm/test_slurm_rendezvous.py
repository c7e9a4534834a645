"""The rendezvous works with a real program (SPEC §13), on every Slurm version: a job of two nodes and
two processes per node follows torch.distributed's environment conventions — every process reaches the
master at MASTER_ADDR:MASTER_PORT over TCP, with its RANK, LOCAL_RANK, NODE_RANK and WORLD_SIZE. The
master's address is node 0's NodeAddr (here 127.0.0.1), not its NodeName (n1 resolves nowhere)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from slurm_fixtures import Site

from dispatch import JobSpec
from dispatch.backend import place
from dispatch.model import Identity, Observation, State
from dispatch_slurm import SlurmBackend, open_backend, parse_settings

pytestmark = pytest.mark.timeout(300)

# Rank 0 listens at MASTER_ADDR:MASTER_PORT and waits for every other rank; each other rank connects
# (retrying while the master is not up yet), says its rank, and reads the master's answer.
PROGRAM = """\
import os, socket, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
me = f"rank={rank} local={os.environ['LOCAL_RANK']} node={os.environ['NODE_RANK']} world={world}"
if rank == 0:
    server = socket.create_server((addr, port))
    met = []
    for _ in range(world - 1):
        conn, _ = server.accept()
        met.append(int(conn.recv(16).decode()))
        conn.sendall(b"welcome")
        conn.close()
    print(f"{me} master at {addr}:{port} met {sorted(met)}", flush=True)
else:
    deadline = time.monotonic() + 60
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    conn.sendall(str(rank).encode())
    print(f"{me} {conn.recv(16).decode()} from {addr}:{port}", flush=True)
"""


@pytest_asyncio.fixture
async def backend(site: Site) -> AsyncIterator[SlurmBackend]:
    b = await open_backend(parse_settings(json.dumps(site.settings())))
    yield b
    await b.close()


async def test_processes_on_two_nodes_meet_at_master_addr_and_port(backend: SlurmBackend, site: Site) -> None:
    # A port of its own: the clusters of parallel test workers share this host, and job ids (so the
    # default port, 29500 + the id) repeat across them.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"MASTER_PORT": str(port)}
    spec = JobSpec(command=("python3", "-c", PROGRAM), nodes=2, procs_per_node=2, env=env)
    h = await place(backend, spec, Identity(f"rendezvous-{site.version}"))
    async with asyncio.timeout(180):
        while True:
            obs = await backend.observe(h)
            if obs.outcome.terminal:
                break
            await asyncio.sleep(0.5)
    node0 = [line async for line in backend.output(h, node=0)]
    node1 = [line async for line in backend.output(h, node=1)]
    assert obs.state is State.SUCCEEDED, (obs.outcome, node0, node1)
    first = site.slurm("scontrol", "show", "hostnames", obs.outcome.evidence[0].node or "").split()[0]
    (addr,) = [
        w.split("=", 1)[1]
        for w in site.slurm("scontrol", "-o", "show", "node", first).split()
        if w.startswith("NodeAddr=")
    ]
    assert addr != first  # the NodeName resolves nowhere but in Slurm: the address is what the nodes reach
    (master,) = [line for line in node0 if "master" in line]
    assert master == f"rank=0 local=0 node=0 world=4 master at {addr}:{port} met [1, 2, 3]"
    others = sorted(line for line in node0 + node1 if "welcome" in line)
    assert others == [
        f"rank=1 local=1 node=0 world=4 welcome from {addr}:{port}",
        f"rank=2 local=0 node=1 world=4 welcome from {addr}:{port}",
        f"rank=3 local=1 node=1 world=4 welcome from {addr}:{port}",
    ]


async def test_processes_on_one_node_meet_at_the_loopback_without_asking_slurmctld(
    backend: SlurmBackend, site: Site
) -> None:
    """One node: every rank runs on it, so the master is the loopback address, and the script asks
    slurmctld nothing to find it (no ``scontrol show node`` RPC at each start: ``srun`` is the job's only
    question to the controller)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = JobSpec(
        command=("python3", "-c", PROGRAM), nodes=1, procs_per_node=2, env={"MASTER_PORT": str(port)}
    )
    prepared = await backend.prepare(spec, Identity(f"rendezvous-one-{site.version}"))
    assert "scontrol" not in prepared.request["script"]
    h = await backend.start(prepared)
    async with asyncio.timeout(180):
        while True:
            obs = await backend.observe(h)
            if isinstance(obs, Observation) and obs.outcome.terminal:
                break
            await asyncio.sleep(0.5)
    node0 = [line async for line in backend.output(h, node=0)]
    assert isinstance(obs, Observation) and obs.state is State.SUCCEEDED, (obs, node0)
    assert sorted(node0) == [
        f"rank=0 local=0 node=0 world=2 master at 127.0.0.1:{port} met [1]",
        f"rank=1 local=1 node=0 world=2 welcome from 127.0.0.1:{port}",
    ]
