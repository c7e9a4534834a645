"""A supervisor process for the process tests: ``python supervisor_child.py DB CLUSTER HOLDER [KILL_AT]``.

It supervises every record of the SQLite store ``DB`` on the :class:`FileCluster` in ``CLUSTER`` until
every record is final, then prints ``done``. With ``KILL_AT`` it SIGKILLs itself at that point of a
requeue: ``requeued`` (right after the requeue to 2.1 is written), ``stop-1`` (right after stopping
incarnation 1), ``ceased`` (right after writing that its compute is gone) or ``start-2`` (right after
creating incarnation 2, before the record says so).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence

from file_cluster import FileCluster

from dispatch import decide
from dispatch.model import Action, Cause, JobRecord, Policy, Rule, Transition
from dispatch.records import SqliteStore
from dispatch.supervise import Supervisor

POLICY = Policy({Cause.PREEMPTED: Rule(Action.REQUEUE, max=3, backoff=0.5)})


class KillingStore(SqliteStore):
    """SIGKILLs the process right after the write named by ``kill_at`` returned."""

    kill_at = ""

    async def update(
        self, record: JobRecord, *, expected_revision: int, transitions: Sequence[Transition] = ()
    ) -> JobRecord:
        out = await super().update(record, expected_revision=expected_revision, transitions=transitions)
        if any(t.what == self.kill_at for t in transitions):
            os.kill(os.getpid(), 9)
        return out


async def main(db: str, cluster: str, holder: str, kill_at: str) -> None:
    store = KillingStore(db, busy_timeout=30.0)
    store.kill_at = kill_at
    sup = Supervisor(
        FileCluster(cluster, kill_at=kill_at), store, policy=POLICY, holder=holder, lease=2.0, poll=0.1
    )

    async def all_final() -> bool:
        return all(decide.final(r, POLICY, sup.clock.now()) for r in await store.list())

    await sup.run(until=all_final)
    await store.close()
    print("done", flush=True)


if __name__ == "__main__":
    db, cluster, holder = sys.argv[1:4]
    asyncio.run(main(db, cluster, holder, sys.argv[4] if len(sys.argv) > 4 else ""))
