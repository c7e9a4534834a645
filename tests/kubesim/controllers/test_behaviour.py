"""The behaviour-script grammar (pure parsing) and the Behaviours registry."""

from __future__ import annotations

import pytest

from kubescript import plan_rank
from kubesim.behaviour import Behaviours, Guard, ScriptError, parse_script, render_text


def test_steps_and_arguments() -> None:
    steps = parse_script("print hello world; sleep 2.5; slow-stop 40; exit 3")
    assert [s.verb for s in steps] == ["print", "sleep", "slow-stop", "exit"]
    assert steps[0].arg == "hello world"
    assert steps[1].seconds == 2.5
    assert steps[2].seconds == 40
    assert steps[3].code == 3


def test_verbs_without_arguments() -> None:
    assert [s.verb for s in parse_script("oom;preempt; lose-node ;evict;hang")] == [
        "oom",
        "preempt",
        "lose-node",
        "evict",
        "hang",
    ]


def test_guards_rank_and_env_chain() -> None:
    (step,) = parse_script("rank=1: env:DISPATCH_EPOCH=1.0: preempt")
    assert step.guards == (Guard("rank", "rank", "1"), Guard("env", "DISPATCH_EPOCH", "1.0"))
    assert step.applies(1, {"DISPATCH_EPOCH": "1.0"})
    assert not step.applies(0, {"DISPATCH_EPOCH": "1.0"})
    assert not step.applies(1, {"DISPATCH_EPOCH": "2.0"})


def test_print_placeholders() -> None:
    (step,) = parse_script("print rank {rank} of {env:WORLD} {env:MISSING}!")
    assert render_text(step.arg, 3, {"WORLD": "4"}) == "rank 3 of 4 !"


@pytest.mark.parametrize(
    ("script", "fragment"),
    [
        ("jump 3", "unknown verb 'jump'"),
        ("sleep soon", "'sleep' needs a number of seconds"),
        ("sleep -1", "finite number of seconds >= 0"),
        ("exit 256", "exit code 0..255"),
        ("exit", "exit code 0..255"),
        ("oom now", "'oom' takes no argument"),
        ("rank=x: exit 1", "rank guard"),
        ("env:1BAD=x: exit 1", "not an environment variable name"),
        ("env:X: exit 1", "an env guard is"),
        ("rank=0:", "must be followed by a verb"),
        ("oom-but-exit-0 1", "'oom-but-exit-0' takes no argument"),
        ("config-error", "name of the missing Secret"),
        ("config-error Bad_Name", "name of the missing Secret"),
        ("create-error", "container runtime's error message"),
    ],
)
def test_bad_scripts_name_the_step(script: str, fragment: str) -> None:
    with pytest.raises(ScriptError) as info:
        parse_script("print ok; " + script)
    assert "step 2" in str(info.value)
    assert fragment in str(info.value)


def test_behaviours_last_matching_rule_wins() -> None:
    b = Behaviours()
    b.set("job-a", "exit 1")
    b.set(lambda pod: pod["metadata"].get("labels", {}).get("x") == "y", "exit 2")
    assert b.script_for({"metadata": {"name": "job-a-0"}}) == "exit 1"
    assert b.script_for({"metadata": {"name": "job-a-0", "labels": {"x": "y"}}}) == "exit 2"
    assert b.script_for({"metadata": {"name": "other"}}) is None
    with pytest.raises(ScriptError):
        b.set("z", "bogus")
    b.clear()
    assert b.script_for({"metadata": {"name": "job-a-0"}}) is None


def test_escaped_semicolon_in_print() -> None:
    steps = parse_script(r"print a\; b; exit 0")
    assert [(s.verb, s.arg) for s in steps] == [("print", "a; b"), ("exit", "0")]


def test_start_errors_and_oom_but_exit_0_in_a_rank_plan() -> None:
    steps = parse_script("sleep 2; oom-but-exit-0; exit 3")
    plan = plan_rank(steps, 0, {})
    assert (plan.end, plan.verb, plan.code, plan.oom, plan.failed) == (2.0, "exit", 0, True, False)
    # A start error keeps the rank from starting wherever it stands; a guard can confine it.
    steps = parse_script("print hi; rank=1: config-error creds; exit 0")
    assert plan_rank(steps, 0, {}).end == 0.0
    blocked = plan_rank(steps, 1, {})
    assert (blocked.end, blocked.verb, blocked.failed) == (None, "config-error", False)
    assert blocked.start_error is not None and blocked.start_error.arg == "creds"
    (step,) = parse_script(r"create-error failed to reserve container name\; x")
    assert step.arg == "failed to reserve container name; x"
