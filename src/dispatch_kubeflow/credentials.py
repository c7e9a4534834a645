"""The ``Authorization`` header of each request, from what a kubeconfig context names.

In order: a token given to dispatch (``--token``, ``$DISPATCH_TOKEN``), the context's ``token``, its
``tokenFile`` (read again each minute, as client-go does: service-account tokens rotate), its ``exec``
plugin (run when first needed, and again once the credential's ``expirationTimestamp`` is near or the
server answered 401), its ``username``/``password``. Client certificates are TLS's business
(:mod:`dispatch_kubeflow.tls`).

Credentials are obtained per request, not when the kubeconfig is read (as kubectl): a failure is a
:class:`CredentialError`, whose message names the file or command and never a secret. Each secret
obtained is handed to ``reveal`` first, so the caller can cut it out of every log record.
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Callable

from dispatch.config import check_token
from dispatch.errors import InvalidError
from dispatch_kubeflow.kubeconfig import Context, ExecPlugin

__all__ = ["TOKEN_FILE_SECONDS", "CredentialError", "Credentials"]

TOKEN_FILE_SECONDS = 60.0
"""How long a token read from a file is used before the file is read again."""
_EXEC_MARGIN = 10.0
"""An exec credential is renewed this many seconds before it expires."""
_EXEC_TIMEOUT = 60.0


class CredentialError(Exception):
    """The credentials could not be obtained (the message names the file or command, never a secret)."""


class Credentials:
    """The ``Authorization`` header for one context (``token``, if given, replaces the context's own)."""

    def __init__(
        self,
        context: Context,
        *,
        token: str | None = None,
        reveal: Callable[[str], None] = lambda _: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ctx = context
        self._override = token
        self._reveal = reveal
        self._clock = clock
        self._cached: str | None = None
        self._until = 0.0

    def __repr__(self) -> str:
        return f"<credentials of {self._ctx.source}>"

    @property
    def renewable(self) -> bool:
        """Whether a 401 may be cured by obtaining the credential again (a file or a plugin)."""
        return (
            self._override is None
            and self._ctx.token is None
            and bool(self._ctx.token_file or self._ctx.exec)
        )

    def expire(self) -> None:
        """Forget what was obtained (after a 401): the next request obtains it again."""
        self._cached, self._until = None, 0.0

    async def header(self) -> str | None:
        """``Authorization``'s value, or ``None`` when the context names no credential (client
        certificates, or none at all)."""
        if self._override is not None:
            return f"Bearer {self._override}"
        ctx = self._ctx
        if ctx.token is not None:
            return f"Bearer {ctx.token}"
        if ctx.token_file is None and ctx.exec is None:
            if ctx.username is not None and ctx.password is not None:
                raw = base64.b64encode(f"{ctx.username}:{ctx.password}".encode()).decode()
                return f"Basic {raw}"
            return None
        now = self._clock()
        if self._cached is None or now >= self._until:
            if ctx.token_file is not None:
                token, until = self._read_file(ctx.token_file), now + TOKEN_FILE_SECONDS
            else:
                assert ctx.exec is not None
                token, lifetime = await _run(ctx.exec, ctx.source)
                until = float("inf") if lifetime is None else now + lifetime - _EXEC_MARGIN
            self._reveal(token)
            self._cached, self._until = token, until
        return f"Bearer {self._cached}"

    def _read_file(self, path: str) -> str:
        try:
            with open(path, encoding="utf-8") as f:
                token = f.read().strip()
        except FileNotFoundError:
            raise CredentialError(f"token file {path} not found ({self._ctx.source}: tokenFile)") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise CredentialError(f"token file {path} could not be read ({type(exc).__name__})") from None
        return _checked(token, f"token file {path}")


def _checked(token: str, where: str) -> str:
    try:
        return check_token(token, path="kubeconfig")
    except InvalidError as exc:
        raise CredentialError(f"{where}: {exc.detail}") from None


async def _run(plugin: ExecPlugin, source: str) -> tuple[str, float | None]:
    """Run the plugin (no terminal: dispatch never prompts) and read its ``ExecCredential``: the token
    and how many seconds it stays valid (``None``: no expiry given)."""
    import asyncio

    info = {"apiVersion": plugin.api_version, "kind": "ExecCredential", "spec": {"interactive": False}}
    env = {**os.environ, **dict(plugin.env), "KUBERNETES_EXEC_INFO": json.dumps(info)}
    name = f"exec plugin {plugin.command!r} ({source})"
    try:
        proc = await asyncio.create_subprocess_exec(
            plugin.command,
            *plugin.args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), _EXEC_TIMEOUT)
        except TimeoutError:
            proc.kill()
            raise CredentialError(f"{name} gave no credential within {_EXEC_TIMEOUT:g} s") from None
    except OSError as exc:
        hint = f"; {plugin.install_hint.strip()}" if plugin.install_hint else ""
        raise CredentialError(f"{name}: {type(exc).__name__}: {exc.strerror or exc}{hint}") from None
    if proc.returncode != 0:
        # Its stderr is meant for a person (kubectl passes it through); its stdout may hold a credential.
        said = err.decode("utf-8", "replace").strip().splitlines()
        last = f": {said[-1][:300]}" if said else ""
        raise CredentialError(f"{name} returned {proc.returncode}{last}")
    try:
        cred = json.loads(out)
        status = cred["status"] if isinstance(cred, dict) and cred.get("kind") == "ExecCredential" else None
    except (ValueError, KeyError):
        status = None
    if not isinstance(status, dict):
        raise CredentialError(f"{name} printed no ExecCredential with a status")
    token = status.get("token")
    if not isinstance(token, str) or not token:
        what = (
            "client certificates (not supported; give it a token)"
            if "clientCertificateData" in status
            else "no token"
        )
        raise CredentialError(f"{name} returned {what}")
    token = _checked(token, name)
    expires = status.get("expirationTimestamp")
    if not isinstance(expires, str) or not expires:
        return token, None
    from datetime import datetime

    try:
        at = datetime.fromisoformat(expires).timestamp()
    except ValueError:
        raise CredentialError(f"{name}: expirationTimestamp {expires!r} is not RFC 3339") from None
    return token, at - time.time()
