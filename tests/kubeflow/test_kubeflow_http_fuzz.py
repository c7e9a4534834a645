"""The response reader of the adapter's HTTP/1.1 client (dispatch_kubeflow.http), fuzzed with hypothesis.

A raw asyncio server on loopback plays back a generated answer cut at generated points (each piece
written and drained on its own, so the client's reads meet the cuts), then keeps the connection, closes it
or cuts it short. What must hold whatever the bytes:

- a well-framed answer (``Content-Length``, chunked with any chunk sizes, extensions and trailers, or read
  to close) is read back exactly: status, headers (names in lower case, in order) and body, whole or as
  lines, and a framed one leaves its connection to the next request;
- malformed framing (a status line that is not HTTP, a header without a colon, a length or chunk size that
  is not a number) is a ``ProtocolError``, and a body cut short a ``ConnectionLost`` — never another
  exception, never a short body taken for a whole one;
- after any failure, or a stream left before its end, the next request of the same client is answered
  right, on a new connection: a broken or half-read connection never goes back to the pool.

Written against the hand-made parser, kept for whatever replaces it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from itertools import pairwise
from typing import Any, TypeVar

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatch_kubeflow.http import Client, ConnectionLost, HTTPError, ProtocolError

T = TypeVar("T")
_FUZZ = settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=False
)
_LOOP = asyncio.new_event_loop()  # one loop for every example (a server per example, on its own port)


def run(coro: Callable[[], Awaitable[T]]) -> T:
    return _LOOP.run_until_complete(asyncio.wait_for(coro(), 20))


class Playback:
    """A server that answers the n-th request on any connection with ``script[n]``: the pieces to write
    one by one, then what to do (``keep`` the connection, ``close`` it)."""

    def __init__(self, script: list[tuple[list[bytes], str]]) -> None:
        self.script = script
        self.served = 0
        self.connections = 0
        self._server: asyncio.Server | None = None
        self.port = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.served < len(self.script):
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                pieces, then = self.script[self.served]
                self.served += 1
                for piece in pieces:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0)
                if then != "keep":
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()
                await writer.wait_closed()

    async def __aenter__(self) -> Playback:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2)

    def client(self) -> Client:
        return Client(f"http://127.0.0.1:{self.port}", timeout=5.0, headers={"User-Agent": "fuzz"})


def cut(data: bytes, points: list[int]) -> list[bytes]:
    """``data`` in pieces at the given offsets (taken modulo its length, sorted, deduplicated)."""
    if not data:
        return [data]
    offsets = sorted({p % len(data) for p in points} - {0})
    bounds = [0, *offsets, len(data)]
    return [data[a:b] for a, b in pairwise(bounds)]


# --- well-framed answers ---------------------------------------------------------------------------

_TOKEN = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_", min_size=1, max_size=12
)
_VALUE = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=30)
_RESERVED = {"content-length", "transfer-encoding", "connection"}
_HEADERS = st.lists(st.tuples(_TOKEN, _VALUE).filter(lambda h: h[0].lower() not in _RESERVED), max_size=6)
_STATUS = st.sampled_from([200, 201, 202, 400, 401, 403, 404, 409, 410, 422, 429, 500, 503])
_BODY = st.binary(max_size=3000)


@st.composite
def framed(draw: st.DrawFn) -> tuple[bytes, int, list[tuple[str, str]], bytes, str]:
    """An answer, its status, headers, body, and its framing (``length``, ``chunked`` or ``close``)."""
    status = draw(_STATUS)
    headers = draw(_HEADERS)
    body = draw(_BODY)
    framing = draw(st.sampled_from(["length", "chunked", "close"]))
    head = [f"HTTP/1.1 {status} {draw(st.sampled_from(['OK', 'Whatever', '']))}"]
    head += [f"{name}:{draw(st.sampled_from(['', ' ', '  ']))}{value}" for name, value in headers]
    if framing == "length":
        head.append(f"Content-Length: {len(body)}")
        payload = body
    elif framing == "chunked":
        head.append(f"{draw(st.sampled_from(['Transfer-Encoding', 'transfer-encoding']))}: chunked")
        sizes = draw(st.lists(st.integers(1, 700), max_size=12))
        payload, at = b"", 0
        for size in [*sizes, len(body)]:
            piece = body[at : at + size]
            at += len(piece)
            if not piece:
                continue
            ext = draw(st.sampled_from(["", ";a=b", ";x"]))
            digits = f"{len(piece):x}"
            digits = digits.upper() if draw(st.booleans()) else digits
            payload += f"{digits}{ext}\r\n".encode() + piece + b"\r\n"
        trailers = draw(st.sampled_from([b"", b"X-Trailer: 1\r\n"]))
        payload += b"0\r\n" + trailers + b"\r\n"
    else:
        head.append("Connection: close")
        payload = body
    raw = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload
    return raw, status, headers, body, framing


_AFTER = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nafter"


@_FUZZ
@given(
    answer=framed(),
    points=st.lists(st.integers(0, 10_000), max_size=8),
    method=st.sampled_from(["GET", "POST"]),
)
def test_a_framed_answer_is_read_whole_at_any_cuts(
    answer: tuple[bytes, int, list[tuple[str, str]], bytes, str], points: list[int], method: str
) -> None:
    raw, status, headers, body, framing = answer

    async def scenario() -> None:
        script = [(cut(raw, points), "close" if framing == "close" else "keep"), ([_AFTER], "close")]
        async with Playback(script) as server:
            client = server.client()
            try:
                got = await client.request(method, "/x", body=b"{}" if method == "POST" else None)
                assert got.status == status
                assert got.body == body
                sent = [(n.lower(), v.strip()) for n, v in headers]
                assert [h for h in got.headers if h[0] not in _RESERVED] == sent
                again = await client.request("GET", "/y")
                assert again.body == b"after"
                assert server.connections == (2 if framing == "close" else 1)
            finally:
                await client.close()

    run(scenario)


@_FUZZ
@given(
    lines=st.lists(
        st.text(
            alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\r\n"), max_size=40
        ),
        min_size=1,
        max_size=12,
    ),
    crlf=st.booleans(),
    ended=st.booleans(),
    points=st.lists(st.integers(0, 10_000), max_size=10),
)
def test_a_stream_yields_its_lines_at_any_cuts(
    lines: list[str], crlf: bool, ended: bool, points: list[int]
) -> None:
    sep = "\r\n" if crlf else "\n"
    text = sep.join(lines) + (sep if ended else "")
    data = text.encode()
    pieces = cut(data, points)
    chunked = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in pieces if p) + b"0\r\n\r\n"
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked

    async def scenario() -> None:
        async with Playback([(cut(raw, points), "keep"), ([_AFTER], "close")]) as server:
            client = server.client()
            try:
                async with client.stream("/watch") as stream:
                    got = [line async for line in stream.lines()]
                # every ended line, and the last one even unended unless it is empty
                want = lines if ended or lines[-1] else lines[:-1]
                assert got == want
                assert (await client.request("GET", "/y")).body == b"after"
                assert server.connections == 1
            finally:
                await client.close()

    run(scenario)


# --- malformed and truncated answers -----------------------------------------------------------------

_MALFORMED = [
    b"SMTP/1.0 220 ready\r\n\r\n",
    b"HTTP/1.1 OK 200\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nno colon here\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: five\r\n\r\nhello",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
]


@_FUZZ
@given(
    which=st.sampled_from(range(len(_MALFORMED))),
    points=st.lists(st.integers(0, 10_000), max_size=6),
    then=st.sampled_from(["keep", "close"]),
)
def test_malformed_framing_is_a_protocol_error_and_the_next_request_is_answered(
    which: int, points: list[int], then: str
) -> None:
    raw = _MALFORMED[which]

    async def scenario() -> None:
        async with Playback([(cut(raw, points), then), ([_AFTER], "close")]) as server:
            client = server.client()
            try:
                try:
                    await client.request("GET", "/x")
                except ProtocolError:
                    pass
                else:
                    raise AssertionError(f"accepted {raw!r}")
                assert (await client.request("GET", "/y")).body == b"after"
                assert server.connections == 2
            finally:
                await client.close()

    run(scenario)


@_FUZZ
@given(
    answer=framed().filter(lambda a: a[4] != "close"),
    keep=st.floats(0.0, 0.999),
    points=st.lists(st.integers(0, 10_000), max_size=6),
    streamed=st.booleans(),
)
def test_a_body_cut_short_is_lost_never_short_and_the_connection_is_not_reused(
    answer: tuple[bytes, int, list[tuple[str, str]], bytes, str],
    keep: float,
    points: list[int],
    streamed: bool,
) -> None:
    raw, _, _, _, _ = answer
    truncated = raw[: int(len(raw) * keep)]

    async def scenario() -> None:
        async with Playback([(cut(truncated, points), "close"), ([_AFTER], "close")]) as server:
            client = server.client()
            try:
                try:
                    if streamed:
                        async with client.stream("/x") as stream:
                            await stream.read()
                    else:
                        await client.request("GET", "/x")
                except ConnectionLost:
                    pass  # ProtocolError is one too: a cut head may be no HTTP at all
                else:
                    raise AssertionError(f"took {truncated!r} for a whole answer")
                assert (await client.request("GET", "/y")).body == b"after"
                assert server.connections == 2
            finally:
                await client.close()

    run(scenario)


@_FUZZ
@given(
    rest=st.binary(max_size=2000),
    chunked=st.booleans(),
    points=st.lists(st.integers(0, 10_000), max_size=6),
)
def test_a_stream_left_before_its_end_does_not_go_back_to_the_pool(
    rest: bytes, chunked: bool, points: list[int]
) -> None:
    body = b"first line\n" + rest
    if chunked:
        raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        raw += b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in cut(body, points) if p)
        raw += b"0\r\n\r\n"
    else:
        raw = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body

    async def scenario() -> None:
        async with Playback([(cut(raw, points), "keep"), ([_AFTER], "close")]) as server:
            client = server.client()
            try:
                async with client.stream("/x") as stream:
                    async for line in stream.lines():
                        assert line == "first line"
                        break  # leave, maybe with the rest of the body unread
                got = await client.request("GET", "/y")
                assert got.body == b"after"
            finally:
                await client.close()

    run(scenario)


@_FUZZ
@given(garbage=st.binary(max_size=400), points=st.lists(st.integers(0, 10_000), max_size=6))
def test_any_bytes_give_an_answer_or_an_http_error(garbage: bytes, points: list[int]) -> None:
    async def scenario() -> None:
        async with Playback([(cut(garbage, points), "close"), ([_AFTER], "close")]) as server:
            client = server.client()
            try:
                with contextlib.suppress(HTTPError):
                    await client.request("GET", "/x")
                assert (await client.request("GET", "/y")).body == b"after"
            finally:
                await client.close()

    run(scenario)
