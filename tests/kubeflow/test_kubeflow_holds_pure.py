"""The pure decisions behind holds: the hold annotation read back, the state it gives, and the admission
check state dispatch-admission derives from a TrainJob and its Workload."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch import State
from dispatch_kubeflow.causes import Snapshot, classify
from dispatch_kubeflow.holds import desired_check, held_by_us, pointer
from dispatch_kubeflow.names import ANNOTATION_HOLD


def _tj(*, held: bool, suspend: bool = True) -> dict[str, Any]:
    ann = {ANNOTATION_HOLD: "h-1"} if held else {}
    return {
        "kind": "TrainJob",
        "metadata": {
            "name": "t",
            "namespace": "ns",
            "annotations": ann,
            "labels": {"kueue.x-k8s.io/queue-name": "q"},
        },
        "spec": {"suspend": suspend},
    }


def _wl(*conditions: str) -> dict[str, Any]:
    return {"status": {"conditions": [{"type": c, "status": "True"} for c in conditions]}}


def test_state_reads_our_hold_as_held_and_kueues_as_queued() -> None:
    assert classify(Snapshot.of("t", _tj(held=True))).state is State.HELD
    assert classify(Snapshot.of("t", _tj(held=False))).state is State.QUEUED
    assert held_by_us(_tj(held=True)) == "h-1" and held_by_us(_tj(held=False)) is None
    assert held_by_us({"metadata": {"annotations": {ANNOTATION_HOLD: ""}}}) is None
    assert pointer("dispatch.dev/hold") == "/metadata/annotations/dispatch.dev~1hold"


@pytest.mark.parametrize(
    ("held", "state", "conditions", "want"),
    [
        (True, "Pending", (), "Pending"),
        (True, "Pending", ("QuotaReserved",), "Pending"),
        (True, "Ready", ("QuotaReserved",), "Retry"),
        (True, "Pending", ("Admitted",), "Retry"),
        (True, "Retry", ("Admitted",), None),  # Kueue has yet to act on it
        (True, "Ready", ("Admitted", "Evicted"), None),  # being evicted: Kueue resets the checks
        (False, "Pending", (), "Ready"),
        (False, "Ready", ("Admitted",), "Ready"),
        (False, "Retry", (), "Ready"),
        (False, "Rejected", (), None),  # never ours
    ],
)
def test_the_check_state_follows_the_hold(
    held: bool, state: str, conditions: tuple[str, ...], want: str | None
) -> None:
    got = desired_check(_wl(*conditions), {"name": "c", "state": state}, _tj(held=held))
    assert (got.state if got else None) == want
    if got is not None and held:
        assert "held by dispatch" in got.message and "ns/t" in got.message


def test_a_workload_not_owned_by_a_trainjob_is_ready() -> None:
    got = desired_check(_wl(), {"name": "c", "state": "Pending"}, None)
    assert got is not None and got.state == "Ready"
