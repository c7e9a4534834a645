"""What the adapter adds to an incarnation's classified outcome, and what of its compute remains (pure).

The backend's one fold (``Backend._fold``, used by ``observe``, ``list`` and the watch) classifies an
incarnation with the cause table (:mod:`dispatch_kubeflow.causes`), then adds what only the adapter knows: a
deletion that does not complete (:func:`with_stuck_deletion`) and the output tails of failed nodes
(:func:`attach_output`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from msgspec import Struct

from dispatch.model import Evidence, Outcome, State
from dispatch_kubeflow.names import NODE_CONTAINER
from dispatch_kubeflow.objects import as_map, meta_of
from dispatch_kubeflow.watching import Parts

__all__ = [
    "STUCK_AFTER",
    "DeletionClock",
    "Remains",
    "Tail",
    "attach_output",
    "failed_node_pods",
    "remains",
    "stuck_message",
    "terminated_node",
    "with_stuck_deletion",
]

STUCK_AFTER = 300.0
"""Seconds after its deletion began (beyond the pods' grace period) that a TrainJob still present is called
stuck: a finalizer nobody removes, or no garbage collector."""

LABEL_INDEX = "batch.kubernetes.io/job-completion-index"


def _name(obj: Mapping[str, Any] | None) -> str:
    return str(meta_of(obj).get("name", ""))


class Remains(Struct, frozen=True):
    """What of an incarnation is still on the cluster (empty: it has ceased). Times are the server's
    ``deletionTimestamp`` values as written (never compared with the local clock: clocks differ)."""

    trainjob: str | None = None
    trainjob_uid: str = ""
    trainjob_deleting_since: str | None = None
    finalizers: tuple[str, ...] = ()
    jobset: str | None = None
    pods: tuple[tuple[str, str | None], ...] = ()  # (pod name, deletionTimestamp)

    @property
    def ceased(self) -> bool:
        return self.trainjob is None and self.jobset is None and not self.pods

    def describe(self) -> str:
        """What remains, in words (for errors and evidence)."""

        def state(since: str | None) -> str:
            return "running" if since is None else f"terminating since {since}"

        parts: list[str] = []
        if self.trainjob is not None:
            if self.trainjob_deleting_since is None:
                parts.append(f'TrainJob "{self.trainjob}" (not being deleted)')
            else:
                fin = f", finalizers {list(self.finalizers)}" if self.finalizers else ""
                parts.append(
                    f'TrainJob "{self.trainjob}" (deleted since {self.trainjob_deleting_since}{fin})'
                )
        if self.jobset is not None:
            parts.append(f'JobSet "{self.jobset}"')
        for pod, since in self.pods:
            parts.append(f'pod "{pod}" ({state(since)})')
        return "; ".join(parts) if parts else "nothing"


def remains(
    trainjob: Mapping[str, Any] | None, jobset: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]]
) -> Remains:
    """What remains of an incarnation given its TrainJob, JobSet and pods as read now."""
    meta = meta_of(trainjob)
    fins = meta.get("finalizers")
    since = meta.get("deletionTimestamp")
    pod_list: list[tuple[str, str | None]] = []
    for p in pods:
        t = meta_of(p).get("deletionTimestamp")
        if _name(p):
            pod_list.append((_name(p), t if isinstance(t, str) else None))
    return Remains(
        trainjob=_name(trainjob) if trainjob is not None else None,
        trainjob_uid=str(meta.get("uid", "")),
        trainjob_deleting_since=since if isinstance(since, str) and trainjob is not None else None,
        finalizers=tuple(str(f) for f in fins) if isinstance(fins, list) else (),
        jobset=_name(jobset) if jobset is not None else None,
        pods=tuple(sorted(pod_list)),
    )


class DeletionClock:
    """When this process first saw each deletion (by TrainJob uid), on its own clock: a deletion is
    *stuck* once it has been seen unfinished for :data:`STUCK_AFTER` seconds. Measured locally because the
    server's ``deletionTimestamp`` and the local clock need not agree."""

    def __init__(self) -> None:
        self._seen: dict[str, float] = {}

    def stuck_for(self, left: Remains, now: float) -> float | None:
        """Seconds the deletion has been seen unfinished if that is past :data:`STUCK_AFTER`, else ``None``."""
        if left.trainjob is None or left.trainjob_deleting_since is None:
            self._seen.pop(left.trainjob_uid, None)
            return None
        first = self._seen.setdefault(left.trainjob_uid, now)
        return now - first if now - first > STUCK_AFTER else None


def stuck_message(left: Remains, seconds: float) -> str:
    return (
        f"its deletion has not completed in {seconds:.0f} s: {left.describe()}. A finalizer nobody removes, "
        "or no garbage collector running; its compute may still run. Once nothing of it runs, remove the "
        'finalizers (kubectl patch trainjob NAME --type=merge -p \'{"metadata":{"finalizers":null}}\')'
    )


def _stuck_evidence(name: str, left: Remains, seconds: float, now: float) -> Evidence:
    return Evidence(
        kind="TrainJob", name=name, reason="DeletionStuck", message=stuck_message(left, seconds), at=now
    )


def with_stuck_deletion(
    outcome: Outcome, name: str, parts: Parts | None, *, now: float, deletions: DeletionClock
) -> Outcome:
    """``outcome`` with a ``DeletionStuck`` evidence when the incarnation's deletion has been seen
    unfinished for :data:`STUCK_AFTER` seconds (see :class:`DeletionClock`)."""
    if parts is None or parts.trainjob is None:
        return outcome
    left = remains(parts.trainjob, parts.jobset, parts.pods)
    seconds = deletions.stuck_for(left, now)
    if seconds is None:
        return outcome
    stuck = _stuck_evidence(name, left, seconds, now)
    return outcome.replace(evidence=(*outcome.evidence, stuck))


# --- output tails ---------------------------------------------------------------------------------


def terminated_node(pod: Mapping[str, Any]) -> tuple[bool, int, str] | None:
    """``(previous, exit code, container id)`` of the ``node`` container's last failed run — in ``state``
    (``previous`` False) or, restarting in place, in ``lastState`` (True) — or ``None``."""
    statuses = as_map(pod.get("status")).get("containerStatuses")
    for cs in statuses if isinstance(statuses, list) else []:
        cs = as_map(cs)
        if cs.get("name") != NODE_CONTAINER:
            continue
        for previous, key in ((False, "state"), (True, "lastState")):
            term = as_map(as_map(cs.get(key)).get("terminated"))
            code = term.get("exitCode")
            if isinstance(code, int) and not isinstance(code, bool) and code != 0:
                return previous, code, str(term.get("containerID") or f"{key}:{cs.get('restartCount', 0)}")
    return None


def failed_node_pods(pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The pods whose ``node`` container failed (their output tails are evidence)."""
    return [p for p in pods if terminated_node(p) is not None]


class Tail(Struct, frozen=True):
    """The last lines of a failed node's ``node`` container, read while its pod was still there."""

    pod: str
    index: str
    node: str | None
    lines: tuple[str, ...]

    @classmethod
    def of(cls, pod: Mapping[str, Any], lines: tuple[str, ...]) -> Tail:
        index = as_map(meta_of(pod).get("labels")).get(LABEL_INDEX, "?")
        node = as_map(pod.get("spec")).get("nodeName")
        return cls(_name(pod), str(index), node if isinstance(node, str) else None, lines)

    @property
    def rank(self) -> int | None:
        """The node's index in the job, when its pod carries one."""
        return int(self.index) if self.index.isdigit() else None


def attach_output(outcome: Outcome, tails: Sequence[Tail]) -> Outcome:
    """A terminal failure with the output tail of each failed node in its evidence (on that pod's evidence
    if it has one, else as a pod evidence of its own). Anything else is returned unchanged."""
    if outcome.state is not State.FAILED or not tails:
        return outcome
    evidence = list(outcome.evidence)
    for tail in tails:
        for i, ev in enumerate(evidence):
            if ev.kind == "Pod" and ev.name == tail.pod:
                if not ev.output:
                    evidence[i] = ev.replace(output=tail.lines, rank=tail.rank)
                break
        else:
            evidence.append(
                Evidence(
                    kind="Pod",
                    name=tail.pod,
                    reason="Output",
                    message=f"the last {len(tail.lines)} lines of node {tail.index}",
                    node=tail.node,
                    output=tail.lines,
                    rank=tail.rank,
                )
            )
    return outcome.replace(evidence=tuple(evidence))
