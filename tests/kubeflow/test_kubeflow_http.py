"""The adapter's HTTP/1.1 client (dispatch_kubeflow.http) against a raw asyncio server on loopback: body
framings, keep-alive, a connection the server closed while idle, silence and answers that are not HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from dispatch_kubeflow.http import Client, ConnectFailed, ConnectionLost, ProtocolError

pytestmark = pytest.mark.asyncio(loop_scope="module")


class Server:
    """Answers each request with what ``answer`` (request line -> raw bytes) says; counts connections."""

    def __init__(self) -> None:
        self.connections = 0
        self.answers: dict[str, bytes] = {}
        self.close_after: set[str] = set()
        self.heads: list[str] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head.decode("latin-1"))
                target = head.split(b" ")[1].decode()
                length = next(
                    (
                        int(h.split(b":")[1])
                        for h in head.split(b"\r\n")
                        if h.lower().startswith(b"content-length")
                    ),
                    0,
                )
                await reader.readexactly(length)
                answer = self.answers.get(target.split("?")[0])
                if answer is None:
                    await asyncio.sleep(3600)  # silence
                    return
                writer.write(answer)
                await writer.drain()
                if target.split("?")[0] in self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()


@pytest_asyncio.fixture(loop_scope="module")
async def server() -> AsyncIterator[Server]:
    s = Server()
    await s.start()
    try:
        yield s
    finally:
        await s.stop()


def _client(server: Server, timeout: float = 5.0) -> Client:
    return Client(f"http://127.0.0.1:{server.port}", timeout=timeout, headers={"User-Agent": "test"})


async def test_framings_and_keep_alive(server: Server) -> None:
    server.answers = {
        "/length": b'HTTP/1.1 200 OK\r\nContent-Length: 5\r\nWarning: 299 - "a"\r\nWarning: 299 - "b"\r\n\r\nhello',
        "/chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n",
        "/empty": b"HTTP/1.1 204 No Content\r\n\r\n",
    }
    client = _client(server)
    try:
        first = await client.request("GET", "/length", params={"a": "b c"})
        assert (first.status, first.body, first.header_all("warning")) == (
            200,
            b"hello",
            ['299 - "a"', '299 - "b"'],
        )
        assert (await client.request("POST", "/chunked", body=b"{}")).body == b"abcde"
        assert (await client.request("DELETE", "/empty")).body == b""
        assert server.connections == 1  # one connection, kept alive
    finally:
        await client.close()


async def test_a_stream_yields_lines_and_gives_its_connection_back(server: Server) -> None:
    chunks = b"".join(
        f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in (b'{"a":1}\n{"b"', b":2}\r\n", b"last")
    )
    server.answers = {
        "/watch": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n",
        "/after": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    }
    client = _client(server)
    try:
        async with client.stream("/watch") as stream:
            assert [line async for line in stream.lines()] == ['{"a":1}', '{"b":2}', "last"]
        assert (await client.request("GET", "/after")).body == b"ok"
        assert server.connections == 1
    finally:
        await client.close()


async def test_a_connection_the_server_closed_while_idle_is_replaced(server: Server) -> None:
    server.answers = {
        "/bye": b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nbye",
        "/hi": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi",
    }
    server.close_after = {"/bye"}  # closes without saying "Connection: close"
    client = _client(server)
    try:
        assert (await client.request("GET", "/bye")).body == b"bye"
        await asyncio.sleep(0.05)
        assert (await client.request("GET", "/hi")).body == b"hi"
        assert server.connections == 2
    finally:
        await client.close()


async def test_silence_not_http_and_refused(server: Server) -> None:
    server.answers = {"/smtp": b"220 mail.example ESMTP\r\n\r\n"}
    client = _client(server, timeout=0.3)
    try:
        with pytest.raises(ConnectionLost, match=r"no answer within 0\.3 s"):
            await client.request("GET", "/silent")
        with pytest.raises(ProtocolError, match=r"not an HTTP/1\.1 answer"):
            await client.request("GET", "/smtp")
    finally:
        await client.close()
    await server.stop()
    with pytest.raises(ConnectFailed):
        await _client(server).request("GET", "/x")


async def test_a_plain_http_server_through_a_proxy_gets_the_whole_url(server: Server) -> None:
    """The raw server plays the proxy: it is sent the absolute URL, the proxy's credentials and the
    server's own Host."""
    server.answers = {"http://api.example:8080/api": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"}
    client = Client("http://api.example:8080", proxy=f"http://u:p%40ss@127.0.0.1:{server.port}")
    try:
        assert (await client.request("GET", "/api")).body == b"ok"
    finally:
        await client.close()
    assert server.heads[-1].startswith(
        "GET http://api.example:8080/api HTTP/1.1\r\nHost: api.example:8080\r\n"
    )
    assert "Proxy-Authorization: Basic dTpwQHNz\r\n" in server.heads[-1]  # u:p@ss


async def test_a_client_used_from_another_event_loop_connects_anew(server: Server) -> None:
    """``dispatch.sync`` and tests run a client's calls in more than one event loop: a kept-alive
    connection of another loop is dropped, not reused."""
    server.answers = {"/ok": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"}
    client = _client(server)
    try:
        assert (await client.request("GET", "/ok")).body == b"ok"
        elsewhere = await asyncio.to_thread(asyncio.run, client.request("GET", "/ok"))  # a new loop
        assert elsewhere.body == b"ok" and server.connections == 2
        assert (await client.request("GET", "/ok")).body == b"ok"
    finally:
        await client.close()
