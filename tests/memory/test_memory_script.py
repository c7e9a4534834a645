"""Behaviour scripts (env KUBESIM_SCRIPT): grammar, refusal, and what each verb does to a job."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dispatch import Cause, Epoch, Identity, InvalidError, JobSpec, ManualClock, State
from dispatch.backend import place
from dispatch.memory import MemoryBackend, parse_script


def test_grammar() -> None:
    steps = parse_script("rank=1: env:A=b c: print hello {rank}; sleep 2.5; exit 7; ; slow-stop 3; hang")
    assert [s.verb for s in steps] == ["print", "sleep", "exit", "slow-stop", "hang"]
    assert [(g.kind, g.name, g.value) for g in steps[0].guards] == [
        ("rank", "rank", "1"),
        ("env", "A", "b c"),
    ]
    assert steps[0].arg == "hello {rank}"
    assert steps[1].seconds == 2.5
    assert steps[2].code == 7
    assert steps[3].seconds == 3.0


@pytest.mark.parametrize(
    ("script", "words"),
    [
        ("dance", "step 1 ('dance'): unknown verb 'dance'"),
        ("sleep 1; sleep soon", "step 2 ('sleep soon'): 'sleep' needs a number of seconds"),
        ("sleep -1", "finite number of seconds >= 0"),
        ("sleep inf", "finite number of seconds >= 0"),
        ("exit 256", "exit code 0..255"),
        ("exit", "exit code 0..255"),
        ("oom now", "'oom' takes no argument"),
        ("rank=x: exit 1", "rank guard"),
        ("env:A exit 1", "env guard"),
        ("env:1A=b: exit 1", "not an environment variable name"),
        ("rank=0:", "must be followed by a verb"),
    ],
)
def test_malformed_scripts_name_the_step(script: str, words: str) -> None:
    with pytest.raises(InvalidError) as caught:
        parse_script(script)
    assert caught.value.path == 'env["KUBESIM_SCRIPT"]'
    assert words in str(caught.value)


async def test_a_malformed_script_is_refused_before_anything_is_created(
    make: Callable[..., MemoryBackend], job: Callable[..., JobSpec]
) -> None:
    backend = make()
    spec = job("sleep 1; explode")
    for call in (
        backend.capabilities(spec),
        place(backend, spec, Identity("bad")),
        backend.prepare(spec, Identity("bad")),
    ):
        with pytest.raises(InvalidError) as caught:
            await call
        assert caught.value.path == 'env["KUBESIM_SCRIPT"]'
        assert "step 2 ('explode')" in str(caught.value)
    assert await backend.list() == []


async def test_default_behaviour_runs_five_seconds_then_succeeds(
    make: Callable[..., MemoryBackend], clock: ManualClock, job: Callable[..., JobSpec]
) -> None:
    backend = make(startDelay=1)
    handle = await place(backend, job(), Identity("plain"))
    assert (await backend.observe(handle)).state is State.STARTING
    clock.advance(1)
    assert (await backend.observe(handle)).state is State.RUNNING
    clock.advance(4.9)
    assert (await backend.observe(handle)).state is State.RUNNING
    clock.advance(0.1)
    obs = await backend.observe(handle)
    assert (obs.state, obs.cause) == (State.SUCCEEDED, Cause.NONE)
    (ev,) = obs.outcome.evidence
    assert (ev.kind, ev.name, ev.reason, ev.exit_code) == ("MemoryJob", handle.ref, "Completed", 0)
    assert ev.at == clock.now()


async def test_settings_default_script(
    make: Callable[..., MemoryBackend], clock: ManualClock, job: Callable[..., JobSpec]
) -> None:
    backend = make(startDelay=0, defaultScript="exit 4")
    handle = await place(backend, job(), Identity("d"))
    obs = await backend.observe(handle)
    assert (obs.state, obs.cause) == (State.FAILED, Cause.EXIT_CODE)


@pytest.mark.parametrize(
    ("script", "cause", "reason", "kind"),
    [
        ("sleep 2; exit 3", Cause.EXIT_CODE, "Error", "MemoryJob"),
        ("sleep 2; oom", Cause.OUT_OF_MEMORY, "OOMKilled", "MemoryJob"),
        ("sleep 2; preempt", Cause.PREEMPTED, "Preempted", "MemoryJob"),
        ("sleep 2; evict", Cause.EVICTED, "Evicted", "MemoryJob"),
        ("sleep 2; lose-node", Cause.NODE_LOST, "NodeLost", "MemoryNode"),
    ],
)
async def test_each_fault_verb(
    make: Callable[..., MemoryBackend],
    clock: ManualClock,
    job: Callable[..., JobSpec],
    script: str,
    cause: Cause,
    reason: str,
    kind: str,
) -> None:
    backend = make(startDelay=1)
    handle = await place(backend, job(f"print working; {script}; print never"), Identity("f"))
    clock.advance(2.5)
    assert (await backend.observe(handle)).state is State.RUNNING
    clock.advance(0.5)
    obs = await backend.observe(handle)
    assert (obs.state, obs.cause) == (State.FAILED, cause)
    (ev,) = obs.outcome.evidence
    assert (ev.kind, ev.reason, ev.node) == (kind, reason, "node-0")
    assert ev.at == clock.now()
    assert ev.output == ("working",)
    if cause is Cause.EXIT_CODE:
        assert ev.exit_code == 3
    if kind == "MemoryNode":
        assert ev.name == "node-0"


async def test_rank_guards_pick_the_failing_node(
    make: Callable[..., MemoryBackend], clock: ManualClock, job: Callable[..., JobSpec]
) -> None:
    backend = make(startDelay=0, nodes=3)
    handle = await place(
        backend,
        job("print rank {rank} of {env:DISPATCH_JOB_ID}; sleep 4; rank=2: sleep 1; rank=2: exit 9", nodes=3),
        Identity("ranks"),
    )
    clock.advance(4)
    assert (await backend.observe(handle)).state is State.RUNNING  # ranks 0 and 1 done, 2 still going
    clock.advance(1)
    obs = await backend.observe(handle)
    (ev,) = obs.outcome.evidence
    assert (obs.cause, ev.exit_code, ev.node) == (Cause.EXIT_CODE, 9, "node-2")
    assert ev.output == ("rank 2 of ranks",)
    assert "node 2 (node-2) exited with code 9" in ev.message


async def test_the_first_failing_rank_ends_the_job(
    make: Callable[..., MemoryBackend], clock: ManualClock, job: Callable[..., JobSpec]
) -> None:
    backend = make(startDelay=0, nodes=2)
    handle = await place(
        backend,
        job("rank=0: sleep 3; rank=0: oom; rank=1: sleep 1; rank=1: exit 2", nodes=2),
        Identity("first"),
    )
    clock.advance(1)
    obs = await backend.observe(handle)
    assert (obs.state, obs.cause, obs.outcome.evidence[0].node) == (State.FAILED, Cause.EXIT_CODE, "node-1")


async def test_epoch_guard_preempts_only_the_first_incarnation(
    make: Callable[..., MemoryBackend], clock: ManualClock, job: Callable[..., JobSpec]
) -> None:
    backend = make(startDelay=0)
    spec = job("sleep 2; env:DISPATCH_EPOCH=1.0: preempt; exit 0")
    first = await place(backend, spec, Identity("requeued"))
    clock.advance(2)
    assert (await backend.observe(first)).cause is Cause.PREEMPTED
    second = await place(backend, spec, Identity("requeued", Epoch(1, 0).requeued()))
    assert second.ref != first.ref
    clock.advance(2)
    obs = await backend.observe(second)
    assert (obs.state, obs.cause) == (State.SUCCEEDED, Cause.NONE)


async def test_hang_runs_until_stopped_and_slow_stop_lingers(
    make: Callable[..., MemoryBackend], clock: ManualClock, job: Callable[..., JobSpec]
) -> None:
    backend = make(startDelay=0, cessationDelay=2)
    handle = await place(backend, job("sleep 1; slow-stop 30; hang"), Identity("slow"))
    clock.advance(1000)
    assert (await backend.observe(handle)).state is State.RUNNING
    await backend.stop(handle)
    obs = await backend.observe(handle)
    assert (obs.state, obs.cause) == (State.CANCELLED, Cause.CANCELLED)
    clock.advance(29)
    assert not await backend.ceased(handle)
    clock.advance(1)
    assert await backend.ceased(handle)


async def test_slow_stop_not_yet_reached_does_not_apply(
    make: Callable[..., MemoryBackend], clock: ManualClock, job: Callable[..., JobSpec]
) -> None:
    backend = make(startDelay=0, cessationDelay=2)
    handle = await place(backend, job("sleep 10; slow-stop 30; hang"), Identity("not-yet"))
    clock.advance(5)
    await backend.stop(handle)
    clock.advance(2)
    assert await backend.ceased(handle)


async def test_script_ending_without_exit_succeeds(
    make: Callable[..., MemoryBackend], clock: ManualClock, job: Callable[..., JobSpec]
) -> None:
    backend = make(startDelay=0)
    handle = await place(backend, job("print a; sleep 1"), Identity("end"))
    clock.advance(1)
    assert (await backend.observe(handle)).state is State.SUCCEEDED


async def test_a_short_slow_stop_replaces_the_cessation_delay(
    make: Callable[..., MemoryBackend], clock: ManualClock, job: Callable[..., JobSpec]
) -> None:
    backend = make(startDelay=0, cessationDelay=5, nodes=2)
    handle = await place(backend, job("rank=0: slow-stop 1; hang", nodes=2), Identity("quick"))
    await backend.stop(handle)
    clock.advance(1)
    assert not await backend.ceased(handle)  # rank 1 has no slow-stop: it takes cessationDelay
    clock.advance(4)
    assert await backend.ceased(handle)
    single = await place(backend, job("slow-stop 0.5; hang"), Identity("single"))
    await backend.stop(single)
    clock.advance(0.5)
    assert await backend.ceased(single)


def test_an_escaped_semicolon_stays_in_the_text() -> None:
    steps = parse_script(r"print a\; b; exit 0")
    assert [(s.verb, s.arg) for s in steps] == [("print", "a; b"), ("exit", "0")]
