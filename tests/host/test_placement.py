"""Where an incarnation goes in a fleet (SPEC §15): :mod:`dispatch.placement`, a pure decision, tested alone.

The order (configured, or a weighted rendezvous hash of job id and epoch) and the choice (the first allowed
cluster that takes the job; away from the one a requeue ``elsewhere`` leaves; the checkpoint note), with
properties over generated fleets."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from dispatch.placement import Candidate, order, place

_names = st.lists(
    st.sampled_from(["east", "west", "lab", "cloud", "slurm", "k8s"]), min_size=1, max_size=6, unique=True
)  # cluster names, none inside another (the checks look for a name in the words)
_job = st.text("abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=20)
_epoch = st.integers(1, 50)


# --------------------------------------------------------------------------------------------- order


@given(_names, _job, _epoch)
def test_without_weights_the_order_is_the_configured_one(names: list[str], job: str, epoch: int) -> None:
    assert order(names, None, job, epoch) == names
    assert order(names, {}, job, epoch) == names


@given(_names, st.data(), _job, _epoch)
def test_with_weights_the_order_is_every_cluster_once_and_the_same_each_time(
    names: list[str], data: st.DataObject, job: str, epoch: int
) -> None:
    weights = {n: data.draw(st.floats(0.01, 100)) for n in names}
    got = order(names, weights, job, epoch)
    assert sorted(got) == sorted(names)
    # Any process, any time, any order of the configuration: the same order for this incarnation.
    assert order(list(reversed(names)), weights, job, epoch) == got
    assert order(names, dict(reversed(list(weights.items()))), job, epoch) == got


def test_weights_spread_the_jobs_in_proportion() -> None:
    weights = {"a": 3.0, "b": 1.0}
    first = Counter(order(["a", "b"], weights, f"job-{i}", 1)[0] for i in range(4000))
    assert 0.72 < first["a"] / 4000 < 0.78  # 3 in 4, by the hash's spread over 4000 ids
    three = {"a": 1.0, "b": 1.0, "c": 2.0}
    first = Counter(order(["a", "b", "c"], three, f"job-{i}", 1)[0] for i in range(4000))
    for name, share in (("a", 0.25), ("b", 0.25), ("c", 0.5)):
        assert abs(first[name] / 4000 - share) < 0.03, first


def test_each_incarnation_is_drawn_anew() -> None:
    """The epoch takes part: the next incarnation of a job is not bound to its first one's order."""
    weights = {"a": 1.0, "b": 1.0}
    firsts = {order(["a", "b"], weights, "job-x", epoch)[0] for epoch in range(1, 40)}
    assert firsts == {"a", "b"}


def test_a_heavier_cluster_comes_first_more_often_whatever_the_others() -> None:
    light = Counter(order(["a", "b"], {"a": 1.0, "b": 1.0}, f"j{i}", 1)[0] for i in range(2000))
    heavy = Counter(order(["a", "b"], {"a": 4.0, "b": 1.0}, f"j{i}", 1)[0] for i in range(2000))
    assert heavy["a"] > light["a"]


# --------------------------------------------------------------------------------------------- place


def _candidates(names: list[str], refusing: dict[str, str]) -> list[Candidate]:
    return [Candidate(n, f"id-{n}", refusing=refusing.get(n, "")) for n in names]


@given(_names, st.data())
def test_the_first_allowed_cluster_that_takes_it_is_chosen(names: list[str], data: st.DataObject) -> None:
    refusing = {n: "unreachable (down)" for n in data.draw(st.lists(st.sampled_from(names), unique=True))}
    allowed = data.draw(st.lists(st.sampled_from(names), unique=True))
    got = place(_candidates(names, refusing), allowed=allowed)
    takers = [n for n in names if (not allowed or n in allowed) and n not in refusing]
    if takers:
        assert got.chosen is not None and got.chosen.name == takers[0]
        assert got.why.startswith(f"placed on {takers[0]}: the first that takes it")
    else:
        assert got.chosen is None and got.why.startswith("no cluster")
    # Every allowed cluster passed over is named with its reason; a cluster not allowed never is.
    for name in names:
        before = not takers or names.index(name) < names.index(takers[0])
        if name in refusing and (not allowed or name in allowed) and before:
            assert f"{name}: unreachable (down)" in got.why
        if allowed and name not in allowed:
            assert f"{name}:" not in got.why and f"on {name}" not in got.why


def test_a_cluster_refusing_the_spec_is_passed_over_with_its_reason() -> None:
    got = place(
        [
            Candidate("slurm", "id-s", refusing="does not take this job (the job asks for 8 nodes; 4)"),
            Candidate("k8s", "id-k"),
        ]
    )
    assert got.chosen is not None and got.chosen.name == "k8s"
    assert got.why == (
        "placed on k8s: the first that takes it; passed over slurm: does not take this job "
        "(the job asks for 8 nodes; 4)"
    )


def test_no_cluster_allowed_takes_it() -> None:
    got = place(_candidates(["a", "b"], {"a": "unreachable (x)"}), allowed=["a"])
    assert got.chosen is None
    assert got.why == "no cluster of a takes it now (a: unreachable (x))"


@given(_names, st.data())
def test_a_requeue_elsewhere_leaves_its_cluster_while_another_takes_it(
    names: list[str], data: st.DataObject
) -> None:
    avoid = data.draw(st.sampled_from(names))
    refusing = {n: "busy" for n in data.draw(st.lists(st.sampled_from(names), unique=True))}
    got = place(_candidates(names, refusing), avoid=f"id-{avoid}")
    others = [n for n in names if n != avoid and n not in refusing]
    if others:
        assert got.chosen is not None and got.chosen.name == others[0]
        assert "the first other cluster that takes it" in got.why
        if names.index(avoid) < names.index(others[0]) and avoid not in refusing:
            assert f"{avoid}: the previous incarnation ran there (requeue elsewhere)" in got.why
    elif avoid not in refusing:
        assert got.chosen is not None and got.chosen.name == avoid
        assert got.why.startswith(f"placed on {avoid}: no other cluster takes it")
        assert all(f"{n}: busy" in got.why for n in names if n != avoid)
    else:
        assert got.chosen is None


def test_checkpoints_follow_only_to_a_cluster_that_sees_the_same_directory() -> None:
    a = Candidate("a", "id-a", checkpoints="lab-nfs")
    b_same = Candidate("b", "id-b", checkpoints="lab-nfs")
    b_other = Candidate("b", "id-b", checkpoints="cloud-bucket")
    b_none = Candidate("b", "id-b")
    follows = place([a, b_same], avoid="id-a", previous=a)
    assert follows.why.endswith("; its checkpoints follow (a and b see lab-nfs)")
    for b in (b_other, b_none):
        over = place([a, b], avoid="id-a", previous=a)
        assert over.why.endswith("; it starts over: b does not see a's checkpoints")
    alone = Candidate("a", "id-a")  # a cluster of its own, even placed back on itself: nothing to say
    assert "checkpoint" not in place([alone], previous=alone).why
    assert "checkpoint" not in place([a, b_other]).why  # a first incarnation has none to carry
