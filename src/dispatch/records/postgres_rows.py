"""A record and its row in a :class:`~dispatch.records.PostgresStore`: :class:`Rows`.

A row holds the record's JSON document (``doc``) and, in columns, what the record *is* when it differs
from the document: its ``revision``, ``created_at``, ``updated_at`` and lease (a lease change writes
those columns alone). Decoding a document is the bulk of a read, so documents already decoded are kept
by job id with the exact text they came from: used only while a row still holds that text, never stale.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from dispatch.errors import InvalidError
from dispatch.model import JobRecord, Lease
from dispatch.records._common import decode_record, record_text
from dispatch.records.store import Listing, read_rows

__all__ = ["ROW", "Rows"]

ROW = "doc, revision, created_at, updated_at, lease_holder, lease_expires_at"
"""The columns a record is read from: its document, then the columns that override the document's."""


class Rows:
    """Rows read from and written to the store at ``where`` (named in errors), and the documents
    already decoded (see the module docstring)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self._cache: dict[str, tuple[str, JobRecord]] = {}

    def decode(self, job_id: str, row: Sequence[Any]) -> JobRecord:
        """The record of a row read as ``ROW``: its document, with the row's revision, times and lease."""
        text, revision, created_at, updated_at, holder, expires_at = row[:6]
        hit = self._cache.get(job_id)
        if hit is not None and hit[0] == text:
            doc = hit[1]
        else:
            doc = decode_record(job_id, text, self.where)
            self.remember(text, doc)
        lease = doc.lease
        if holder is None:
            lease = None
        elif lease is None or lease.holder != holder or lease.expires_at != expires_at:
            if not isinstance(expires_at, float):
                raise InvalidError(
                    f"the stored record of job {job_id!r} in {self.where} has a lease holder without an expiry"
                )
            lease = Lease(holder, expires_at)
        if (
            doc.revision == revision
            and doc.updated_at == updated_at
            and doc.created_at == created_at
            and lease is doc.lease
        ):
            return doc
        return doc.replace(revision=revision, created_at=created_at, updated_at=updated_at, lease=lease)

    def rows(self, rows: Iterable[Sequence[Any]]) -> Listing:
        """The records of rows read as ``job_id, ROW``; one that does not decode is set aside."""
        return read_rows(((str(row[0]), row[1:]) for row in rows), self.decode)

    def remember(self, text: str, record: JobRecord) -> None:
        self._cache[record.job_id] = (text, record)

    def columns(self, record: JobRecord) -> dict[str, Any]:
        lease = record.lease
        text = record_text(record)
        self.remember(text, record)  # harmless if the transaction rolls back: keyed by text
        return {
            "job_id": record.job_id,
            "state": record.outcome.state.value,
            "terminal": record.outcome.state.terminal,
            "created_at": record.created_at,
            "updated_at": record.updated_at,
            "revision": record.revision,
            "lease_holder": lease.holder if lease is not None else None,
            "lease_expires_at": lease.expires_at if lease is not None else None,
            "doc": text,
        }

    def forget(self, job_id: str) -> None:
        """The record is gone: its document need not be kept."""
        self._cache.pop(job_id, None)

    def clear(self) -> None:
        self._cache.clear()
