"""A loopback HTTP proxy in front of kubesim that can lose answers: the request reaches the server and
takes effect, then the connection is cut before the client reads the answer (a crash after create)."""

from __future__ import annotations

import re
from typing import Any

import aiohttp
from aiohttp import web

_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


class LossyProxy:
    """Forward every request to ``upstream``; cut the connection after forwarding the next ``n`` matching
    ones (``lose(method, path_regex, n)``)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.url = ""
        self.lost = 0
        self._rules: list[list[Any]] = []
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    def lose(self, method: str, path: str, n: int = 1) -> None:
        self._rules.append([method, re.compile(path), n])

    def _should_lose(self, method: str, path: str) -> bool:
        for rule in self._rules:
            if rule[2] > 0 and rule[0] == method and rule[1].search(path):
                rule[2] -= 1
                return True
        return False

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self._session.request(
            request.method, self.upstream + request.path_qs, headers=headers, data=body or None
        ) as resp:
            data = await resp.read()
            status = resp.status
            content_type = resp.headers.get("Content-Type", "application/json")
        if self._should_lose(request.method, request.path):
            self.lost += 1
            assert request.transport is not None
            request.transport.abort()  # the server acted; the client never hears of it
            raise ConnectionResetError("answer lost on purpose")
        return web.Response(body=data, status=status, headers={"Content-Type": content_type})

    async def start(self) -> str:
        self._session = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
