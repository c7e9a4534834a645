"""The supervisor: fold what the cluster reports into records, decide the next action, perform it.

One :class:`Supervisor` works through the backend protocols alone (any adapter) and a
:class:`~dispatch.records.Store`. Each :meth:`Supervisor.step`:

1. **observes** — drains the backend's :class:`~dispatch.backend.Watcher` from the saved cursor
   (without waiting), or, on a backend without one, observes every leased record's incarnation; every
   ``resync`` seconds it also lists the cluster (``Backend.list``) to reconcile what a watch may miss,
   find objects of ours that match no record (:class:`UnmatchedPolicy`) and stop incarnations no record
   wants any more;
2. **leases** — takes (or renews) a time-bounded lease on every record that is not final and not leased
   by a live other supervisor; a record is acted on only under our live lease, checked again in every
   record write, so several supervisors over one store never act on one record, and the records of one
   that died are taken over once its leases expire;
3. **decides and acts** — for each leased record, :func:`dispatch.decide.next` gives the one action,
   which is performed through the backend and recorded with a compare-and-swap; then the next action,
   until the record waits on the cluster or on time. Nothing blocks: a previous incarnation whose pods
   linger is re-checked at a later step.

Requeue is: record "requeue to N+1" (one write, naming the policy rule) → ``stop`` the old incarnation →
wait until its compute is gone (``CessationSignal``; else until it is observed gone) → record that →
after the rule's backoff, ``prepare`` + ``start`` the new identity → record the handle. A crash between
any two of these is recovered from the record plus the cluster: ``start`` is idempotent per identity, a
``stop`` is idempotent, and a write whose effect is unknown is written into the record
(``unknown_write``) and settled by looking the identity up on the cluster before anything else.
:meth:`Supervisor.run` loops :meth:`step` until stopped (the daemon and ``dispatch run``).

One module per part, each using only those before it: :mod:`.report` (:class:`StepReport`),
:mod:`.ground` (what every part works over), :mod:`.decisions` (its small decisions over values, pure),
:mod:`.watchfeed` (the watch kept open), :mod:`.view` (what it reads of the cluster besides the watch),
:mod:`.leases` (which records it looks after, its leases, the fleet), :mod:`.folding` (readings folded
into records; every write, under the lease), :mod:`.acting` (decide and act on one record),
:mod:`.reconcile` (readings matched to records; unmatched objects; leftovers stopped) and :mod:`.loop`
(:class:`Supervisor`, which composes them: step, run, close).
"""

from dispatch.writer import LeaseLostError

from .acting import MAX_ACTIONS as MAX_ACTIONS
from .leases import CLAIM_BATCH as CLAIM_BATCH
from .leases import CLAIMABLE as CLAIMABLE
from .loop import RESYNC_JITTER as RESYNC_JITTER
from .loop import Supervisor
from .reconcile import ADOPTED_COMMAND as ADOPTED_COMMAND
from .reconcile import UnmatchedPolicy
from .report import StepReport
from .watchfeed import WatchFeed as WatchFeed

__all__ = ["LeaseLostError", "StepReport", "Supervisor", "UnmatchedPolicy"]
