"""The pages are pure functions of records: what the jobs page lists, in which order, and its filters."""

from __future__ import annotations

import re

import pytest

from dispatch import decide
from dispatch.errors import InvalidError
from dispatch.model import Cause, JobRecord, JobSpec, Outcome, State
from dispatch.ui.pages import MAX_ROWS, Filters, JobRow, Unreadable, age, jobs_page

SPEC = JobSpec(command=("train",), nodes=1)


def _row(job: str, at: float, state: State = State.PENDING, cluster: str = "c1") -> JobRow:
    rec, _ = decide.submitted(job, SPEC, policy=None, held=False, now=at)
    return JobRow(rec.replace(outcome=Outcome(state)), cluster)


def _ids(page: str) -> list[str]:
    return re.findall(r'<tr class="job-row" data-job="([^"]+)"', page)


def test_newest_first_unreadable_on_top_and_at_most_max_rows() -> None:
    rows: list[JobRow | Unreadable] = [_row(f"j{i}", 1000.0 + i) for i in range(MAX_ROWS + 2)]
    rows.append(Unreadable("broken", "expected an integer, got 'two'"))
    page = jobs_page(rows, Filters(), now=5000.0)
    ids = _ids(page)
    assert len(ids) == MAX_ROWS and ids[:2] == [f"j{MAX_ROWS + 1}", f"j{MAX_ROWS}"]
    assert page.index('<tr class="unreadable">') < page.index('<tr class="job-row"')
    assert f"{MAX_ROWS + 3} jobs (the newest {MAX_ROWS} shown: the filters narrow it)" in page


def test_filters_keep_the_matching_rows_and_count_them() -> None:
    rows: list[JobRow | Unreadable] = [
        _row("a", 1.0, State.FAILED, "c1"),
        _row("b", 2.0, State.FAILED, "c2"),
        _row("c", 3.0, State.RUNNING, "c1"),
    ]
    page = jobs_page(rows, Filters(state=State.FAILED, cluster="c1"), now=10.0)
    assert _ids(page) == ["a"] and "1 of 3 jobs" in page
    assert '<a class="clear" href="/">clear</a>' in page
    assert _ids(jobs_page(rows, Filters(cause=Cause.PREEMPTED), now=10.0)) == []


def test_filters_are_read_strictly_from_the_query() -> None:
    assert Filters.parse({"state": "failed", "cause": "", "cluster": "c1"}) == Filters(
        State.FAILED, None, "c1"
    )
    assert not Filters.parse({}).active
    with pytest.raises(InvalidError, match="unknown cause 'oom': use one of none, exit_code") as info:
        Filters.parse({"cause": "oom"})
    assert info.value.path == "cause"
    with pytest.raises(InvalidError, match="unknown query parameter 'sort'"):
        Filters.parse({"sort": "age"})


def test_durations_read_as_people_say_them() -> None:
    assert [age(s) for s in (0.42, 45, 192, 7500, 3 * 86400 + 4 * 3600)] == [
        "0.4 s",
        "45 s",
        "3 min 12 s",
        "2 h 5 min",
        "3 d 4 h",
    ]


def test_the_plan_is_shown_while_it_is_the_next_step() -> None:
    from dispatch.model import DEFAULT_POLICY, Actor, Handle, Identity
    from dispatch.ui.pages import Tail, job_page

    rec, _ = decide.submitted("p", SPEC, policy=None, held=False, now=100.0)
    step = decide.started(rec, Handle("memory", Identity("p", rec.epoch), "p-1"), actor=Actor.USER, now=101.0)
    assert step is not None
    failed = step[0].replace(outcome=Outcome(State.FAILED, Cause.PREEMPTED))
    plan = decide.next(failed, DEFAULT_POLICY, 110.0)
    waiting, _ = decide.requeued(failed, plan, now=110.0)  # pending until the backoff has passed
    running = waiting.replace(
        handle=Handle("memory", Identity("p", waiting.epoch), "p-2"), outcome=Outcome(State.RUNNING)
    )

    def page(r: JobRecord) -> str:
        return job_page(JobRow(r, "c1"), [], Tail(0, 1), now=200.0)

    assert "<dt>plan</dt>" in page(waiting) and "requeue 1 of 3 under rule preempted" in page(waiting)
    assert "<dt>plan</dt>" not in page(running)  # placed: the START plan was decided, it is not next
