"""A bounded log of the HTTP requests the simulator answered (for tests such as "read-only sent no writes").

Each record has the method, path, query, Kubernetes verb, identity name (never the token), status code
and timestamps. The log is a bounded deque, so recording costs the same on the millionth request.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

__all__ = ["WRITE_VERBS", "RequestLog", "RequestRecord"]

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@dataclass
class RequestRecord:
    """One answered request. ``identity`` is the authenticated identity's name ("" if unauthenticated).

    ``response_bytes`` counts the body bytes sent; for watch and log streams it grows while the stream
    is open (the record is made when the stream starts)."""

    method: str
    path: str
    query: tuple[tuple[str, str], ...]
    verb: str  # get/list/watch/create/update/patch/delete/deletecollection, or "" for non-resource paths
    identity: str
    status: int
    time: float  # wall-clock seconds
    sim_time: float  # simulated seconds
    resource: str = ""  # plural[/subresource]
    namespace: str = ""
    name: str = ""
    request_bytes: int = 0
    response_bytes: int = 0
    user_agent: str = ""  # the client's User-Agent header, as an audit log records it
    content_type: str = ""  # the answer's media type (application/json, ...protobuf, text/plain)

    def as_json_line(self) -> str:
        """One JSON line for ``serve --request-log``: what was asked, by whom, and the answer (the
        identity's name, never its token; the path without the query)."""
        when = (
            datetime.fromtimestamp(self.time, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        )
        return json.dumps(
            {
                "time": when,
                "identity": self.identity,
                "userAgent": self.user_agent,
                "method": self.method,
                "verb": self.verb,
                "path": self.path,
                "status": self.status,
                "bytes": self.response_bytes,
                "requestBytes": self.request_bytes,
            },
            separators=(",", ":"),
        )

    @property
    def is_write(self) -> bool:
        return self.verb in WRITE_VERBS

    def query_dict(self) -> dict[str, str]:
        return dict(self.query)


class RequestLog:
    """The last ``maxlen`` requests, oldest first."""

    def __init__(self, maxlen: int = 100_000) -> None:
        self._records: deque[RequestRecord] = deque(maxlen=maxlen)
        self._sinks: list[Callable[[RequestRecord], None]] = []
        self.total = 0  # requests seen since start (including those rotated away)

    def __repr__(self) -> str:
        return f"RequestLog(records={len(self._records)}, total={self.total})"

    def record(self, rec: RequestRecord) -> None:
        self._records.append(rec)
        self.total += 1

    def add_sink(self, sink: Callable[[RequestRecord], None]) -> None:
        """Call ``sink`` with each record once its request is finished (a watch or log stream: when the
        stream ends, with all its bytes counted)."""
        self._sinks.append(sink)

    def finish(self, rec: RequestRecord) -> None:
        """The server calls this when a request is done; passes the record to the sinks."""
        for sink in self._sinks:
            sink(rec)

    def __iter__(self) -> Iterator[RequestRecord]:
        return iter(list(self._records))

    def __len__(self) -> int:
        return len(self._records)

    def clear(self) -> None:
        self._records.clear()

    def filter(
        self,
        *,
        verb: str | None = None,
        identity: str | None = None,
        status: int | None = None,
        resource: str | None = None,
        method: str | None = None,
    ) -> list[RequestRecord]:
        """Records matching every given attribute."""
        out = []
        for r in self._records:
            if verb is not None and r.verb != verb:
                continue
            if identity is not None and r.identity != identity:
                continue
            if status is not None and r.status != status:
                continue
            if resource is not None and r.resource != resource:
                continue
            if method is not None and r.method != method:
                continue
            out.append(r)
        return out

    def bytes_total(self) -> tuple[int, int]:
        """(request bytes, response bytes) over the retained records."""
        return sum(r.request_bytes for r in self._records), sum(r.response_bytes for r in self._records)

    def writes(self, identity: str | None = None) -> list[RequestRecord]:
        """Requests whose verb writes (create/update/patch/delete/deletecollection)."""
        return [r for r in self._records if r.is_write and (identity is None or r.identity == identity)]
