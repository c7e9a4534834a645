"""Following a job to its outcome (``dispatch run``): every transition as it happens, what it waits for
while nothing happens, the outcome, and the last lines its nodes printed; what Ctrl-C leaves behind."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dispatch import decide
from dispatch.cli.options import Options
from dispatch.cli.render import when
from dispatch.cli.standing import exit_code, next_steps
from dispatch.cluster import Cluster
from dispatch.errors import DispatchError
from dispatch.model import JobRecord, State

if TYPE_CHECKING:
    from dispatch.fleet import Fleet

__all__ = ["QUIET", "TAIL", "follow", "interrupted", "waiting_for"]


async def interrupted(opts: Options, cluster: Cluster | Fleet, job_id: str, where: str) -> str:
    """What Ctrl-C during ``run`` leaves behind, in words: a job waiting to be (re)started (a requeue's
    backoff) has nothing to start it until a supervisor runs, and that must be said."""
    try:
        rec = await asyncio.shield(cluster.record(job_id))
    except (DispatchError, asyncio.CancelledError):
        rec = None
    if rec is not None and rec.state is State.PENDING:
        return (
            f"interrupted: job {job_id} is pending ({rec.epoch}){where}: nothing starts it until a supervisor "
            f"runs — `{opts.again('supervise')}` will start it and apply the recovery policy; "
            f"`{opts.again('cancel', job_id)}` cancels it"
        )
    return (
        f"interrupted: job {job_id} keeps running{where}, unsupervised; "
        f"`{opts.again('status', job_id)}` follows it, `{opts.again('supervise')}` applies the recovery "
        f"policy, `{opts.again('cancel', job_id)}` cancels it"
    )


async def follow(opts: Options, cluster: Cluster | Fleet, rec: JobRecord, *, supervise: bool) -> int:
    """Supervise (or, without ``supervise``, only follow) the job to its final outcome, printing every
    transition, then the outcome and the last lines each node printed; the exit code of the outcome.

    Nothing waits silently: on a terminal a live line shows the job's state, cause and elapsed time,
    redrawn every second, and what it waits for once nothing has changed for :data:`QUIET` seconds;
    elsewhere a ``... waiting for ...`` line on stderr says so then, and again every :data:`QUIET`
    seconds while it lasts."""
    out = opts.out
    jid = rec.job_id
    printed = 0
    started = time.monotonic()
    latest = rec
    changed = said = started

    def tick() -> str:
        nonlocal said
        now = time.monotonic()
        line = _live_line(latest, started)
        if now - changed < QUIET:
            return line
        if status is not None:  # on a terminal, in the live line
            return f"{line}  waiting for {waiting_for(opts, latest)}"
        if not out.as_json and now - said >= QUIET:
            said = now
            opts.say(f"{when(time.time())}  {jid}@{latest.epoch}  waiting for {waiting_for(opts, latest)}")
        return line

    # In a fleet, each started line names the cluster it went to.
    names = None if isinstance(cluster, Cluster) else {m.seat.identity: m.name for m in cluster.members}
    with out.progress(_live_line(rec, started)) as status:
        ticker = asyncio.create_task(_tick(status, tick))

        async def show() -> JobRecord:
            nonlocal printed, latest, changed
            current = await cluster.record(jid)
            history = await cluster.history(jid)
            for t in history[printed:]:
                out.transition(jid, t, names)
            if len(history) > printed:
                changed = time.monotonic()
            printed = len(history)
            latest = current
            if status is not None:
                status.update(_live_line(current, started))
            return current

        try:
            if supervise:
                # This job only: another supervisor (`dispatch supervise`) holding its lease finishes it
                # instead, and this command follows the record until the outcome is final.
                sup = cluster.supervisor(jobs={jid}, poll=RUN_POLL, lease=RUN_LEASE)

                async def final() -> bool:
                    return decide.final(await show(), sup.policy, cluster.clock.now())

                await sup.run(until=final)
                rec = await show()
            else:
                async for rec in cluster.watch(jid):  # noqa: B007 - the last record is the outcome
                    await show()
        finally:
            ticker.cancel()
    out.outcome(rec)
    if rec.state is State.SUCCEEDED and not out.as_json:
        await _show_output(opts, cluster, rec)
    if rec.state is not State.SUCCEEDED and not out.as_json:
        for hint in next_steps(opts, rec):
            opts.say(f"next: {hint}")
    return exit_code(rec)


QUIET = 10.0
"""Seconds without a transition after which ``run`` (off a terminal) says what it waits for."""
TAIL = 5
"""Lines of each node's output ``run`` shows after the outcome."""
TAIL_WAIT = 5.0
"""Seconds ``run`` gives the cluster to answer for those lines."""
TAIL_NODES = 8
"""Nodes whose lines ``run`` shows; a larger job's others are for ``dispatch logs``."""


def waiting_for(opts: Options, rec: JobRecord) -> str:
    """What a job that has not ended waits for, in words (the state's, its plan's, its evidence)."""
    state = rec.state
    if state is State.HELD:
        what = f"a release: it is held (`{opts.again('release', rec.job_id)}`)"
    elif state is State.PENDING and rec.plan is not None and rec.plan.not_before is not None:
        what = f"the supervisor's {rec.plan.action.value} at {when(rec.plan.not_before)}: {rec.plan.reason}"
    elif state is State.PENDING:
        what = "the supervisor to place it on the cluster (pending)"
    elif state is State.QUEUED:
        what = "the cluster to admit it (queued: capacity, quota or admission)"
    elif state is State.STARTING:
        what = "its nodes to start (starting: scheduling, images, containers)"
    else:
        what = (
            f"it to end: {state.value} since {when(rec.updated_at)}; a preempted, evicted or lost node "
            "ends it with that cause, and the recovery policy decides what follows"
        )
    if rec.outcome.evidence:
        what += f"; evidence: {rec.outcome.evidence[-1]}"
    return what


async def _show_output(opts: Options, cluster: Cluster | Fleet, rec: JobRecord) -> None:
    """The last :data:`TAIL` lines of each node of a job that succeeded, as ``run`` ends, when the
    cluster can read output (a failure's evidence already holds the failed node's last lines)."""
    if rec.handle is None:
        return
    try:
        own = cluster if isinstance(cluster, Cluster) else cluster.owner(rec)
        if not (await own.capabilities()).output:
            return
    except DispatchError:
        return
    shown = False
    for n in range(min(rec.spec.nodes, TAIL_NODES)):
        lines: list[str] = []
        why = ""
        try:
            async with asyncio.timeout(TAIL_WAIT):
                async for line in cluster.output(rec.job_id, node=n, tail=TAIL):
                    lines.append(line)
        except DispatchError as exc:
            why = str(exc)
        except TimeoutError:
            why = f"the cluster did not answer within {TAIL_WAIT:g} s"
        if not shown:
            opts.out.line(f"  output (the last {TAIL} lines of each node):")
            shown = True
        for line in lines:
            opts.out.line(f"    [node {n}] {line}")
        if why:
            opts.out.line(f"    [node {n}] (not read: {why})")
        elif not lines:
            opts.out.line(f"    [node {n}] (no output)")
    if rec.spec.nodes > TAIL_NODES:
        rest = f"nodes {TAIL_NODES} to {rec.spec.nodes - 1}"
        opts.out.line(f"    ({rest}: `{opts.again('logs', rec.job_id, '--tail', str(TAIL))}`)")


def _live_line(rec: JobRecord, started: float) -> str:
    cause = "" if rec.outcome.cause.value == "none" else f" ({rec.outcome.cause.value})"
    return f"{rec.job_id}@{rec.epoch}: {rec.state.value}{cause}  {time.monotonic() - started:.0f}s"


async def _tick(status: Any, text: Callable[[], str]) -> None:
    while True:
        await asyncio.sleep(1.0)
        line = text()
        if status is not None:
            status.update(line)


RUN_POLL = 0.5
RUN_LEASE = 15.0
"""``dispatch run``'s supervisor: poll interval and lease (seconds)."""
