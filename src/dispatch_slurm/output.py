"""A node's output on Slurm (SPEC §13 "Output"): the per-node files under the incarnation's directory,
read through the transport (``cat``, ``tail -c`` to follow)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from dispatch.errors import NotFoundError
from dispatch.model import Handle
from dispatch_slurm.observing import Observing
from dispatch_slurm.reader import SlurmJob
from dispatch_slurm.script import node_output

__all__ = ["lines"]


async def lines(
    observing: Observing, handle: Handle, *, node: int, follow: bool, tail: int | None, interval: float
) -> AsyncIterator[str]:
    """The lines of node ``node``'s output; with ``follow``, until the job has ended (read again each
    ``interval`` seconds, at most one)."""
    queries = observing.queries
    job = await observing.find(handle)
    path = node_output(observing.info.workdir, handle.identity, node)
    # The node count from the reading, else from the job's directory: an ended job that only the
    # completion log (or nothing) still knows keeps its node files.
    nodes = job.node_count if job is not None else 0
    if node < 0 or (node >= nodes and not await queries.exists(path)):
        raise NotFoundError(
            f"incarnation {handle.identity} has {max(nodes, 1)} node(s); there is no node {node}"
        )
    if tail is not None and tail <= 0:
        return
    text = await _read(observing, path, job)
    shown = text.splitlines()
    if tail is not None:
        shown = shown[-tail:]
    for line in shown:
        yield line
    if not follow:
        return
    offset = len(text.encode())
    pending = ""
    pause = min(1.0, interval)
    while True:
        job = await observing.find(handle)
        ended = job is None or (job.final and not job.completing)
        chunk = await queries.text(path, offset=offset)
        offset += len(chunk.encode())
        pending += chunk
        *done, pending = pending.split("\n")
        for line in done:
            yield line
        if ended:
            if pending:
                yield pending
            return
        await asyncio.sleep(pause)


async def _read(observing: Observing, path: str, job: SlurmJob | None) -> str:
    # A node that runs but has not written yet is given a moment: its first line is on its way.
    text = ""
    for _ in range(30):
        text = await observing.queries.text(path)
        if text or job is None or job.state != "RUNNING":
            return text
        await asyncio.sleep(0.1)
    return text
