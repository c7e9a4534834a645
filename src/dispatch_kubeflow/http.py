"""A small HTTP/1.1 client on asyncio streams: what the Kubernetes layer needs, and nothing more.

One server per client; a pool of keep-alive connections to it; ``Content-Length``, chunked and
read-to-close bodies; streaming answers (watches, followed logs) as lines; a connect timeout and a
timeout on every read. TLS is the stdlib's :mod:`ssl`, with the context the caller builds
(:mod:`dispatch_kubeflow.tls`). No redirects, no compression, no HTTP/2: an API server needs none of
them, and each would cost a read command import time (httpx2 + httpcore2 + anyio + h11
cost one about 0.06 s of CPU). An HTTP proxy is supported as kubectl supports one (the kubeconfig's
``proxy-url``, else ``$HTTPS_PROXY``/``$HTTP_PROXY`` minus ``$NO_PROXY``, see
:func:`dispatch_kubeflow.kubeconfig.proxy_for`).

Failures are three exceptions, which :mod:`dispatch_kubeflow.kube` maps to dispatch's errors:
:class:`ConnectFailed` (nothing was sent), :class:`ConnectionLost` (the request may have reached the
server) and :class:`ProtocolError` (an answer that is not HTTP/1.1).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlencode, urlsplit

from msgspec import Struct, field

if TYPE_CHECKING:
    import ssl

__all__ = ["Client", "ConnectFailed", "ConnectionLost", "HTTPError", "ProtocolError", "Response", "Stream"]

_MAX_HEAD = 64 * 1024
"""The longest status line and headers accepted (an API server's are well under 4 KiB)."""
_MAX_IDLE = 8
"""Keep-alive connections kept open per client (a command sends its requests one after another)."""


class HTTPError(Exception):
    """No usable answer came."""


class ConnectFailed(HTTPError):
    """The connection could not be made (refused, timed out, TLS refused): nothing was sent."""


class ConnectionLost(HTTPError):
    """The connection broke or went silent after the request was sent (it may have had its effect)."""


class ProtocolError(ConnectionLost):
    """The server answered something that is not HTTP/1.1."""


class Response(Struct, frozen=True):
    """A whole answer: status, headers (names in lower case, in order, repeated as sent) and body."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def __repr__(self) -> str:
        return f"Response(status={self.status!r}, headers={self.headers!r}, body=<{len(self.body)} bytes>)"

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (case-insensitive), or ``None``."""
        return _first(self.headers, name)

    def header_all(self, name: str) -> list[str]:
        name = name.lower()
        return [v for k, v in self.headers if k == name]

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


def _first(headers: tuple[tuple[str, str], ...], name: str) -> str | None:
    name = name.lower()
    return next((v for k, v in headers if k == name), None)


class _Conn(Struct):
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)

    def usable(self) -> bool:
        """Still open (an idle connection the server closed shows EOF once the loop saw its FIN), and of
        the running event loop (a client used from a new ``asyncio.run`` cannot use the old one's)."""
        return (
            self.loop is asyncio.get_running_loop()
            and not self.writer.is_closing()
            and not self.reader.at_eof()
        )

    def close(self) -> None:
        """Close it, from its own event loop's thread (a transport is not thread-safe)."""
        with contextlib.suppress(Exception):
            if self.loop is asyncio.get_running_loop():
                self.writer.close()
            elif not self.loop.is_closed():
                self.loop.call_soon_threadsafe(self.writer.close)

    async def aclose(self) -> None:
        """Close, and wait a moment for the transport to finish (TLS sends its close_notify)."""
        self.close()
        if self.loop is not asyncio.get_running_loop():
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0):
                await self.writer.wait_closed()


class Stream:
    """An answer whose body is read as it arrives: ``status``, ``headers``, then :meth:`lines` or
    :meth:`read`. Its connection goes back to the pool if the body was read to its end, else is closed
    when the ``async with`` block ends."""

    def __init__(
        self, conn: _Conn, status: int, headers: tuple[tuple[str, str], ...], read_timeout: float | None
    ) -> None:
        self._conn = conn
        self.status = status
        self.headers = headers
        self.complete = False
        """The body was read to its end (its connection may serve another request)."""
        self._body = _body(conn.reader, headers, status, read_timeout)

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (case-insensitive), or ``None``."""
        return _first(self.headers, name)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive (a binary stream: protobuf watch frames)."""
        async for chunk in self._body:
            yield chunk
        self.complete = True

    async def read(self) -> Response:
        """The rest of the body, whole (for an error answer)."""
        data = b"".join([chunk async for chunk in self.chunks()])
        return Response(self.status, self.headers, data)

    async def lines(self) -> AsyncIterator[str]:
        """The body's lines as they arrive (without their ``\\n``/``\\r\\n``); the last one even unended."""
        pending = b""
        async for chunk in self.chunks():
            pending += chunk
            *done, pending = pending.split(b"\n")
            for line in done:
                yield line.rstrip(b"\r").decode("utf-8", "replace")
        if pending:
            yield pending.rstrip(b"\r").decode("utf-8", "replace")


class Client:
    """Requests to the server at ``base_url`` (``http://`` or ``https://`` with ``ssl_context``), each
    carrying ``headers``. ``timeout`` bounds connecting and each read of a whole answer."""

    def __init__(
        self,
        base_url: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        timeout: float = 10.0,
        headers: Mapping[str, str] | None = None,
        proxy: str | None = None,
    ) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"expected an http:// or https:// server address, got {base_url!r}")
        self._proxy: tuple[str, int, str | None] | None = None
        """The HTTP proxy's host, port and ``Proxy-Authorization`` (an https server is reached through a
        CONNECT tunnel, an http one with absolute request targets)."""
        if proxy:
            p = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
            if p.scheme != "http" or not p.hostname:
                raise ValueError(
                    "expected an http:// proxy address (the address is not shown: it may hold a password)"
                )
            auth = None
            if p.username is not None:
                from base64 import b64encode
                from urllib.parse import unquote

                raw = f"{unquote(p.username)}:{unquote(p.password or '')}".encode()
                auth = f"Basic {b64encode(raw).decode()}"
            self._proxy = (p.hostname, p.port or 80, auth)
        self._tls = url.scheme == "https"
        self._host = url.hostname
        self._port = url.port or (443 if self._tls else 80)
        self._prefix = url.path.rstrip("/")
        self._authority = url.netloc.rsplit("@", 1)[-1]
        self._ssl = ssl_context
        self._server_hostname = server_hostname
        self.timeout = timeout
        self._headers = dict(headers or {})
        self._idle: list[_Conn] = []

    def __repr__(self) -> str:
        return f"<dispatch_kubeflow.http.Client {'https' if self._tls else 'http'}://{self._authority}>"

    async def _connect(self, connect_timeout: float) -> _Conn:
        tls: ssl.SSLContext | None = None
        if self._tls:
            if self._ssl is None:
                import ssl

                self._ssl = ssl.create_default_context()
            tls = self._ssl
        hostname = (self._server_hostname or self._host) if tls else None
        try:
            async with asyncio.timeout(connect_timeout):
                if self._proxy is None:
                    reader, writer = await asyncio.open_connection(
                        self._host, self._port, ssl=tls, server_hostname=hostname, limit=_MAX_HEAD
                    )
                else:
                    host, port, _ = self._proxy
                    reader, writer = await asyncio.open_connection(host, port, limit=_MAX_HEAD)
                    if tls:
                        try:
                            await self._tunnel(reader, writer, connect_timeout)
                            await writer.start_tls(tls, server_hostname=hostname)
                        except BaseException:
                            writer.close()
                            raise
        except TimeoutError:
            raise ConnectFailed(f"no connection within {connect_timeout:g} s") from None
        except OSError as exc:  # refused, unreachable, and ssl.SSLError (a certificate not trusted)
            raise ConnectFailed(str(exc) or type(exc).__name__) from None
        return _Conn(reader, writer)

    async def _tunnel(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seconds: float
    ) -> None:
        """Ask the proxy for a tunnel to the server (``CONNECT``); its refusal is a failed connection."""
        assert self._proxy is not None
        target = f"{self._host}:{self._port}" if ":" not in self._host else f"[{self._host}]:{self._port}"
        lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
        if self._proxy[2] is not None:
            lines.append(f"Proxy-Authorization: {self._proxy[2]}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        await writer.drain()
        try:
            status, _ = await _read_head(reader, seconds)
        except (_NothingBack, ConnectionLost, asyncio.IncompleteReadError) as exc:
            raise ConnectFailed(f"the proxy closed the tunnel to {target}: {exc}") from None
        if not 200 <= status < 300:
            raise ConnectFailed(f"the proxy refused a tunnel to {target}: HTTP {status}")

    def _head(
        self,
        method: str,
        path: str,
        params: Mapping[str, str] | None,
        headers: Mapping[str, str],
        length: int | None,
    ) -> bytes:
        target = self._prefix + path
        if params:
            target += ("&" if "?" in target else "?") + urlencode(params)
        lines = []
        if self._proxy is not None and not self._tls:  # a plain-HTTP proxy is sent the whole URL
            target = f"http://{self._authority}{target}"
            if self._proxy[2] is not None:
                lines.append(f"Proxy-Authorization: {self._proxy[2]}")
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self._authority}", *lines]
        merged = {**self._headers, **headers}
        for name, value in merged.items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise ValueError(f"header {name!r} holds a line break")  # never quote the value: a token
            lines.append(f"{name}: {value}")
        if length is not None:
            lines.append(f"Content-Length: {length}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def _send(
        self,
        method: str,
        path: str,
        params: Mapping[str, str] | None,
        headers: Mapping[str, str],
        body: bytes | None,
        *,
        connect_timeout: float,
        read_timeout: float | None,
        reuse: bool,
    ) -> tuple[_Conn, int, tuple[tuple[str, str], ...]]:
        """Send one request and read the answer's head, on an idle connection (``reuse``) or a new one.
        A GET on a reused connection the server had closed is sent again on a new one, as long as nothing
        came back (a write is not: the caller decides whether its effect may be doubled)."""
        head = self._head(
            method,
            path,
            params,
            headers,
            len(body) if body is not None else (0 if method in ("POST", "PUT", "PATCH") else None),
        )
        while True:
            fresh = True
            conn = None
            while reuse and self._idle:
                candidate = self._idle.pop()
                if candidate.usable():
                    conn, fresh = candidate, False
                    break
                candidate.close()
            if conn is None:
                conn = await self._connect(connect_timeout)
            try:
                try:
                    conn.writer.write(head + (body or b""))
                    await conn.writer.drain()
                except OSError as exc:
                    raise _NothingBack(f"{type(exc).__name__}: {exc}") from None
                status, got = await _read_head(conn.reader, read_timeout)
            except _NothingBack as exc:
                conn.close()
                if not fresh and method == "GET":
                    continue  # the server closed the idle connection as we reused it: once more, anew
                raise ConnectionLost(str(exc)) from None
            except (OSError, asyncio.IncompleteReadError, ProtocolError) as exc:
                conn.close()
                if isinstance(exc, ProtocolError):
                    raise
                raise ConnectionLost(f"{type(exc).__name__}: {exc}") from None
            except BaseException:
                conn.close()
                raise
            return conn, status, got

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
    ) -> Response:
        """Send one request and read its whole answer."""
        conn, status, got = await self._send(
            method, path, params, headers or {}, body,
            connect_timeout=self.timeout, read_timeout=self.timeout, reuse=True,
        )  # fmt: skip
        try:
            data = b"".join([c async for c in _body(conn.reader, got, status, self.timeout, method=method)])
        except BaseException:
            conn.close()
            raise
        if _keep_alive(got) and len(self._idle) < _MAX_IDLE:
            self._idle.append(conn)
        else:
            conn.close()
        return Response(status, got, data)

    @contextlib.asynccontextmanager
    async def stream(
        self,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        read_timeout: float | None = None,
    ) -> AsyncIterator[Stream]:
        """GET ``path`` and hand the answer over as it arrives; ``read_timeout`` bounds the silence
        between two reads (``None``: none). A watch holds its connection until it ends; a log read to its
        end gives it back (a command that reads a log pays one TLS handshake, not two)."""
        conn, status, got = await self._send(
            "GET", path, params, headers or {}, None,
            connect_timeout=self.timeout, read_timeout=read_timeout, reuse=True,
        )  # fmt: skip
        stream = Stream(conn, status, got, read_timeout)
        try:
            yield stream
        finally:
            if stream.complete and _keep_alive(got) and len(self._idle) < _MAX_IDLE:
                self._idle.append(conn)
            else:
                await conn.aclose()

    async def server_certificate(self) -> bytes | None:
        """The certificate (DER) the server presents, on a kept-alive connection (made now if none is
        idle, and kept for the next request); ``None`` over plain HTTP."""
        if not self._tls:
            return None
        conn = next((c for c in reversed(self._idle) if c.usable()), None)
        if conn is None:
            conn = await self._connect(self.timeout)
            self._idle.append(conn)
        tls = conn.writer.get_extra_info("ssl_object")
        der = tls.getpeercert(binary_form=True) if tls is not None else None
        return der if isinstance(der, bytes) else None

    async def close(self) -> None:
        while self._idle:
            await self._idle.pop().aclose()


class _NothingBack(Exception):
    """The connection ended before a single byte of the answer."""


async def _read(reader: asyncio.StreamReader, seconds: float | None, how: str, arg: int | bytes) -> bytes:
    try:
        async with asyncio.timeout(seconds):
            if how == "until":
                assert isinstance(arg, bytes)
                return await reader.readuntil(arg)
            assert isinstance(arg, int)
            return await (reader.readexactly(arg) if how == "exactly" else reader.read(arg))
    except TimeoutError:
        raise ConnectionLost(f"no answer within {seconds:g} s") from None
    except asyncio.LimitOverrunError:
        raise ProtocolError("an answer line longer than 64 KiB") from None


async def _read_head(
    reader: asyncio.StreamReader, seconds: float | None
) -> tuple[int, tuple[tuple[str, str], ...]]:
    try:
        raw = await _read(reader, seconds, "until", b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            raise _NothingBack("the server closed the connection without answering") from None
        raise ConnectionLost("the connection broke in the middle of the answer's head") from None
    except ConnectionResetError:
        raise _NothingBack("the server reset the connection without answering") from None
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ProtocolError(f"not an HTTP/1.1 answer: {lines[0][:80]!r}")
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise ProtocolError(f"a header line without a colon: {line[:80]!r}")
        headers.append((name.strip().lower(), value.strip()))
    status = int(parts[1])
    if 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
        return await _read_head(reader, seconds)
    return status, tuple(headers)


def _keep_alive(headers: tuple[tuple[str, str], ...]) -> bool:
    connection = ",".join(v for k, v in headers if k == "connection").lower()
    framed = any(k in ("content-length", "transfer-encoding") for k, _ in headers)
    return framed and "close" not in connection


async def _body(
    reader: asyncio.StreamReader,
    headers: tuple[tuple[str, str], ...],
    status: int,
    seconds: float | None,
    *,
    method: str = "GET",
) -> AsyncIterator[bytes]:
    """The body's bytes as they arrive, framed as the head says (RFC 9112 §6.3)."""
    if method == "HEAD" or status in (204, 304):
        return
    fields = dict(headers)
    try:
        if "chunked" in fields.get("transfer-encoding", "").lower():
            while True:
                size_line = await _read(reader, seconds, "until", b"\r\n")
                try:
                    size = int(size_line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise ProtocolError("a chunk size that is not hexadecimal") from None
                if size == 0:
                    while (await _read(reader, seconds, "until", b"\r\n")) != b"\r\n":
                        pass  # trailers: none that matter
                    return
                data = await _read(reader, seconds, "exactly", size + 2)
                yield data[:-2]
        elif "content-length" in fields:
            try:
                left = int(fields["content-length"])
            except ValueError:
                raise ProtocolError("a Content-Length that is not a number") from None
            while left > 0:
                data = await _read(reader, seconds, "read", min(left, 1 << 16))
                if not data:
                    raise ConnectionLost("the connection closed before the whole answer came")
                left -= len(data)
                yield data
        else:  # read to close
            while data := await _read(reader, seconds, "read", 1 << 16):
                yield data
    except asyncio.IncompleteReadError:
        raise ConnectionLost("the connection closed before the whole answer came") from None
    except OSError as exc:
        raise ConnectionLost(f"{type(exc).__name__}: {exc}") from None
