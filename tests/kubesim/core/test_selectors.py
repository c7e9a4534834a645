"""Label/field selector parsing and matching, including property tests against a reference model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubesim.errors import ApiError
from kubesim.resources import CONFIGMAPS, EVENTS, PODS
from kubesim.selectors import label_selector_from_dict, parse_field_selector, parse_label_selector

KEYS = st.sampled_from(["app", "tier", "example.com/team", "x"])
VALUES = st.sampled_from(["a", "b", "web", "v1.2", "A_b-c"])
LABELS = st.dictionaries(KEYS, VALUES, max_size=4)


@st.composite
def requirement(draw: st.DrawFn) -> tuple[str, object]:
    """A requirement as text plus a reference predicate over a label dict."""
    key = draw(KEYS)
    kind = draw(st.sampled_from(["=", "==", "!=", "in", "notin", "exists", "!"]))
    if kind in ("=", "=="):
        v = draw(VALUES)
        return f"{key}{kind}{v}", lambda lab, k=key, v=v: lab.get(k) == v
    if kind == "!=":
        v = draw(VALUES)
        return f"{key}!={v}", lambda lab, k=key, v=v: lab.get(k) != v
    if kind in ("in", "notin"):
        vs = draw(st.lists(VALUES, min_size=1, max_size=3))
        text = f"{key} {kind} ({', '.join(vs)})"
        if kind == "in":
            return text, lambda lab, k=key, vs=vs: k in lab and lab[k] in vs
        return text, lambda lab, k=key, vs=vs: k not in lab or lab[k] not in vs
    if kind == "exists":
        return key, lambda lab, k=key: k in lab
    return f"!{key}", lambda lab, k=key: k not in lab


@settings(max_examples=300, deadline=None)
@given(st.lists(requirement(), min_size=1, max_size=4), LABELS)
def test_label_selector_matches_reference_model(
    reqs: list[tuple[str, object]], labels: dict[str, str]
) -> None:
    text = ",".join(t for t, _ in reqs)
    sel = parse_label_selector(text)
    expected = all(pred(labels) for _, pred in reqs)  # type: ignore[operator]
    assert sel.matches(labels) is expected
    # the canonical rendering parses back to the same selector
    assert parse_label_selector(str(sel)).matches(labels) is expected


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab=!,() in", max_size=12))
def test_parser_never_crashes_and_errors_are_400(text: str) -> None:
    try:
        parse_label_selector(text)
    except ApiError as err:
        assert err.code == 400 and err.reason == "BadRequest"


@pytest.mark.parametrize(
    "bad", ["a in (", "a in b", "=b", "a b", "a=(", "a==b==c", "a in ()", "a>x", "-bad-=x"]
)
def test_malformed_label_selectors(bad: str) -> None:
    with pytest.raises(ApiError) as ei:
        parse_label_selector(bad)
    assert ei.value.code == 400


def test_empty_selector_matches_everything() -> None:
    assert parse_label_selector("").matches({}) and parse_label_selector(None).matches({"a": "b"})


def test_gt_lt_and_dict_form() -> None:
    assert parse_label_selector("gen>3").matches({"gen": "4"})
    assert not parse_label_selector("gen<3").matches({"gen": "4"})
    sel = label_selector_from_dict(
        {
            "matchLabels": {"app": "x"},
            "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}],
        }
    )
    assert sel.matches({"app": "x"}) and not sel.matches({"app": "x", "tier": "db"})


def test_field_selectors() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Running"},
    }
    assert parse_field_selector(PODS, "status.phase=Running,spec.nodeName==n1").matches(pod)
    assert parse_field_selector(PODS, "status.phase!=Pending").matches(pod)
    assert not parse_field_selector(PODS, "metadata.namespace=other").matches(pod)
    assert parse_field_selector(PODS, "spec.nodeName=").matches({"metadata": {"name": "q"}})
    ev = {"metadata": {"name": "e"}, "involvedObject": {"kind": "Pod", "name": "p", "uid": "u1"}}
    assert parse_field_selector(EVENTS, "involvedObject.name=p,involvedObject.kind=Pod").matches(ev)
    with pytest.raises(ApiError) as ei:
        parse_field_selector(CONFIGMAPS, "status.phase=Running")
    assert ei.value.message == "field label not supported: status.phase"
    with pytest.raises(ApiError):
        parse_field_selector(PODS, "nonsense")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-5, "<invalid>"),
        (0, "0s"),
        (119, "119s"),
        (125, "2m5s"),
        (600, "10m"),
        (3 * 3600 + 60, "3h1m"),
        (30 * 3600, "30h"),
        (3 * 86400 + 3600, "3d1h"),
        (400 * 86400, "400d"),
        (3 * 365 * 86400, "3y"),
    ],
)
def test_human_duration(seconds: int, text: str) -> None:
    from kubesim.tables import human_duration

    assert human_duration(seconds) == text


@pytest.mark.parametrize(
    ("etype", "now", "before", "sent"),
    [
        ("ADDED", True, False, "ADDED"),
        ("ADDED", False, False, None),
        ("DELETED", True, True, "DELETED"),
        ("DELETED", False, True, None),
        ("MODIFIED", True, True, "MODIFIED"),
        ("MODIFIED", True, False, "ADDED"),
        ("MODIFIED", False, True, "DELETED"),
        ("MODIFIED", False, False, None),
    ],
)
def test_watch_transitions(etype: str, now: bool, before: bool, sent: str | None) -> None:
    from kubesim.watch import transition

    assert transition(etype, now, before) == sent
