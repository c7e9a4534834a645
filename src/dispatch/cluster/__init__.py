"""Opening a cluster: :func:`open` and the :class:`Cluster` it returns (operator and observer).

The operator writes (``submit``, ``cancel``, ``hold``, ``release``, ``resubmit``) go to the record
first and then to the backend, so that a crash in between leaves a record saying what was asked; every
record write goes through :class:`~dispatch.writer.RecordWriter` (one compare-and-swap loop). The
observer reads (``get``, ``list``, ``watch``) fold what the cluster reports into the records with
:func:`dispatch.fold.fold`.

A record belongs to the cluster of its current incarnation (SPEC §6.1): opened on another cluster, a
``Cluster`` shows such a record as last known (``record.cluster`` names its own) and writes nothing to
it; the writes raise :class:`~dispatch.errors.OtherClusterError`. Only :meth:`Cluster.forget` ends a
record of a cluster that is gone, and :meth:`Cluster.purge` deletes finished ones.
"""

from dispatch.writer import CAS_ATTEMPTS

from .base import POLL_MAX as POLL_MAX
from .base import POLL_MIN as POLL_MIN
from .facade import Cluster, backend_for, open
from .operator import CESSATION_WAIT as CESSATION_WAIT

__all__ = ["CAS_ATTEMPTS", "Cluster", "backend_for", "open"]
