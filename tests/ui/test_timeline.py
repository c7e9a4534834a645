"""The timeline's geometry is a pure function of a record's history: bars, segments, labels.

The histories are written by the same functions the host writes them with (``dispatch.decide`` and
``dispatch.fold``), so the picture is tested against the words the supervisor really records.
"""

from __future__ import annotations

from dispatch import decide
from dispatch.fold import fold
from dispatch.model import (
    DEFAULT_POLICY,
    Actor,
    Cause,
    Epoch,
    Evidence,
    Handle,
    Identity,
    JobRecord,
    JobSpec,
    Observation,
    Outcome,
    PlanAction,
    State,
    Transition,
)
from dispatch.ui.timeline import END_CAP, LEFT, RIGHT, layout, ticks, timeline

SPEC = JobSpec(command=("python", "train.py"), nodes=2)


class Story:
    """A job's life, written through the host's own record changes."""

    def __init__(self, job: str = "p1", at: float = 1000.0) -> None:
        self.rec, first = decide.submitted(job, SPEC, policy=None, held=False, now=at)
        self.history: list[Transition] = [first]

    def _apply(self, step: tuple[JobRecord, list[Transition]] | None) -> None:
        assert step is not None
        self.rec, ts = step
        self.history += ts

    def handle(self) -> Handle:
        ident = Identity(self.rec.job_id, self.rec.epoch)
        return Handle("memory", ident, f"{self.rec.job_id}-{self.rec.epoch.n}")

    def start(self, at: float) -> None:
        self._apply(decide.started(self.rec, self.handle(), actor=Actor.SUPERVISOR, now=at))

    def observe(self, at: float, state: State, cause: Cause = Cause.NONE, reason: str = "") -> None:
        handle = self.rec.handle
        assert handle is not None
        ev = (Evidence(kind="MemoryJob", name=handle.ref, reason=reason, node="node-0"),) if reason else ()
        self._apply(fold(self.rec, Observation(handle, Outcome(state, cause, ev), at), now=at))

    def requeue(self, at: float) -> None:
        plan = decide.next(self.rec, DEFAULT_POLICY, at)
        assert plan.action is PlanAction.REQUEUE
        self._apply(decide.requeued(self.rec, plan, now=at))
        self._apply(decide.ceased(self.rec, self.rec.handle, now=at + 1))  # type: ignore[arg-type]

    def hold(self, at: float) -> None:
        self._apply(decide.held(self.rec, self.rec.handle, "tok", now=at))  # type: ignore[arg-type]


def preempted_then_succeeded() -> Story:
    s = Story()
    s.start(1001)
    s.observe(1002, State.QUEUED)
    s.observe(1004, State.RUNNING)
    s.observe(1010, State.FAILED, Cause.PREEMPTED, "Preempted")
    s.requeue(1011)
    s.start(1042)
    s.observe(1043, State.RUNNING)
    s.observe(1050, State.SUCCEEDED, reason="Completed")
    return s


def test_a_preempted_and_requeued_job_is_two_bars_split_by_state() -> None:
    s = preempted_then_succeeded()
    tl = timeline(s.history, now=2000)
    assert [str(b.epoch) for b in tl.bars] == ["1.0", "2.1"]
    first, second = tl.bars
    # From placement (started) to end, one segment per state it was in, back to back.
    assert (first.start, first.end) == (1001, 1010)
    assert [(g.state, g.start, g.end) for g in first.segments] == [
        (State.PENDING, 1001, 1002),
        (State.QUEUED, 1002, 1004),
        (State.RUNNING, 1004, 1010),
    ]
    assert (first.state, first.cause, first.label) == (State.FAILED, Cause.PREEMPTED, "preempted")
    assert not first.live and first.placed
    assert (second.start, second.end) == (1042, 1050)
    assert [g.state for g in second.segments] == [State.PENDING, State.RUNNING]
    assert (second.state, second.label) == (State.SUCCEEDED, "succeeded")
    assert (tl.start, tl.end) == (1001, 1050)  # from the first placement (the submission is not drawn)


def test_the_requeue_is_labelled_with_the_rule_and_the_backoff_the_supervisor_recorded() -> None:
    tl = timeline(preempted_then_succeeded().history, now=2000)
    follow = tl.bars[0].follow
    assert follow is not None
    assert (follow.kind, str(follow.epoch), follow.rule, follow.backoff) == (
        "requeued",
        "2.1",
        "preempted",
        30.0,
    )
    assert follow.attempt == "1 of 3" and "requeue 1 of 3 under rule preempted" in follow.text
    assert follow.label == "requeued as 2.1 · 1 of 3 · rule preempted · backoff 30 s"
    assert tl.bars[1].follow is None


def test_the_evidence_of_each_incarnation_comes_from_its_own_history() -> None:
    tl = timeline(preempted_then_succeeded().history, now=2000)
    assert tl.bars[0].evidence == ("MemoryJob/p1-1 Preempted on node node-0",)
    assert tl.bars[1].evidence == ()  # succeeded has no cause: its evidence is the record's


def test_a_live_incarnation_runs_until_now() -> None:
    s = Story()
    s.start(1001)
    s.observe(1003, State.RUNNING)
    tl = timeline(s.history, now=1030)
    (bar,) = tl.bars
    assert bar.live and bar.end == 1030 and bar.label == "running"
    assert bar.segments[-1] == type(bar.segments[-1])(State.RUNNING, 1003, 1030)
    assert tl.end == 1030


def test_a_job_never_placed_is_a_pending_bar_from_its_submission() -> None:
    s = Story()
    (bar,) = timeline(s.history, now=1005).bars
    assert not bar.placed and bar.live
    assert [(g.state, g.start, g.end) for g in bar.segments] == [(State.PENDING, 1000, 1005)]


def test_holds_are_marks_and_a_resubmit_follows_with_the_user() -> None:
    s = Story()
    s.start(1001)
    s.observe(1002, State.RUNNING)
    s.hold(1003)
    s.observe(1004, State.HELD)
    s.observe(1008, State.FAILED, Cause.EXIT_CODE, "Error")
    s._apply(decide.gave_up(s.rec, decide.next(s.rec, DEFAULT_POLICY, 1009), now=1009))
    s._apply(decide.resubmitted(s.rec, SPEC, s.rec.epoch.resubmitted(), expected_revision=0, now=1020))
    s.start(1021)
    tl = timeline(s.history, now=1025)
    first, second = tl.bars
    assert [m.text for m in first.marks] == ["hold"]
    assert [g.state for g in first.segments] == [State.PENDING, State.RUNNING, State.HELD]
    assert first.final.startswith("gave up: policy default rule exit_code: fail")
    assert first.follow is not None and first.follow.label == "resubmitted as 2.0"
    assert second.live and str(second.epoch) == "2.0"


def test_layout_places_bars_in_time_and_labels_their_ends() -> None:
    tl = timeline(preempted_then_succeeded().history, now=2000)
    geo = layout(tl, width=1000)
    inner = 1000 - LEFT - RIGHT
    first, second = geo.rows

    def x(at: float) -> float:
        return round(LEFT + (at - 1001) / 49 * inner, 2)

    track = next(b for b in first.boxes if b.kind == "track")
    assert (track.x, round(track.x + track.w, 2)) == (x(1001), x(1010))
    running = next(b for b in first.boxes if b.kind == "running")
    assert (running.x, round(running.x + running.w, 2)) == (x(1004), x(1010))
    cap = next(b for b in first.boxes if b.kind == "end failed")
    assert cap.x == x(1010) - END_CAP and cap.title == "preempted"
    texts = {t.kind: t for t in first.texts}
    assert texts["label failed"].text == "preempted" and texts["label failed"].x == x(1010)
    assert "rule preempted" in texts["follow"].text and "backoff 30 s" in texts["follow"].text
    # The second bar's row is below the first; its end label is right-aligned at the canvas' edge.
    assert next(b for b in second.boxes if b.kind == "track").y > track.y
    end_label = next(t for t in second.texts if t.kind.startswith("label"))
    assert (end_label.text, end_label.anchor, end_label.x) == ("succeeded", "end", x(1050))
    # A dashed line leads into the second bar from the requeue that made it (the wait).
    assert first.lines == ()
    assert [(ln[0], ln[2], ln[4]) for ln in second.lines] == [(x(1011), x(1042), "wait")]
    assert "waited 31 s" in [t.text for t in second.texts]
    assert all(LEFT <= b.x <= 1000 - RIGHT for row in geo.rows for b in row.boxes)


def test_ticks_are_round_and_within_the_span() -> None:
    assert ticks(1000, 1050) == [1000, 1010, 1020, 1030, 1040, 1050]
    assert ticks(3, 9) == [3, 4, 5, 6, 7, 8, 9]
    assert ticks(0, 86400 * 40)[:2] == [0, 86400 * 10]
    assert ticks(5, 5) == [5]
    assert ticks(10.05, 10.6) == [10.1, 10.2, 10.3, 10.4, 10.5, 10.6]


def test_an_empty_history_draws_nothing() -> None:
    tl = timeline([], now=7)
    assert tl.bars == () and layout(tl).rows == ()


def test_a_requeue_line_that_names_no_rule_keeps_its_own_words() -> None:
    s = preempted_then_succeeded()
    history = [
        t.replace(why="1.0 ended failed/preempted; requeued by an older supervisor")
        if t.what == "requeued"
        else t
        for t in s.history
    ]
    follow = timeline(history, now=2000).bars[0].follow
    assert follow is not None and follow.rule == "" and follow.backoff is None
    assert follow.text.endswith("requeued by an older supervisor") and follow.label == "requeued as 2.1"


def test_epochs_of_the_bars_follow_the_record() -> None:
    s = preempted_then_succeeded()
    assert s.rec.epoch == Epoch(2, 1)
    assert timeline(s.history, now=0).bars[-1].epoch == s.rec.epoch


def test_a_requeue_line_written_before_rules_had_budgets_still_names_its_rule() -> None:
    s = preempted_then_succeeded()
    older = {
        "1.0 ended failed/preempted; policy rule preempted: requeue (max 3, backoff 30 s, cap 3600 s): "
        "requeue 1 of 3, after 30 s": ("preempted", 30.0),
        "1.0 ended failed/exit_code; policy default rule exit_code: requeue (max 2, backoff 5 s, cap 60 s): "
        "requeue 2 of 2, after 10 s": ("default", 10.0),
    }
    for why, (rule, backoff) in older.items():
        history = [t.replace(why=why) if t.what == "requeued" else t for t in s.history]
        follow = timeline(history, now=2000).bars[0].follow
        assert follow is not None and (follow.rule, follow.backoff) == (rule, backoff)
