"""Both ways kubesim makes its self-signed certificate give one that a TLS client trusts for 127.0.0.1."""

from __future__ import annotations

import asyncio
import shutil
import ssl
from collections.abc import Callable
from pathlib import Path

import pytest

from kubesim import tls
from kubesim.tls import SelfSignedCert


def _openssl(host: str) -> SelfSignedCert:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl tool on this machine")
    return tls._with_openssl(host)


@pytest.mark.parametrize("make", [tls._with_cryptography, _openssl], ids=["cryptography", "openssl"])
async def test_certificate_serves_tls_a_client_verifies(
    make: Callable[[str], SelfSignedCert], tmp_path: Path
) -> None:
    cert = make("127.0.0.1")
    assert "pem" in repr(cert) and "PRIVATE" not in repr(cert)
    (tmp_path / "c.pem").write_bytes(cert.cert_pem)
    (tmp_path / "k.pem").write_bytes(cert.key_pem)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
    client_ctx = ssl.create_default_context(cadata=cert.cert_pem.decode())

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx)
        assert await reader.read() == b"ok"  # the handshake verified the chain and the IP SAN
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
