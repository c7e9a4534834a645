"""Tokens: refused up front when they cannot go in an HTTP header, and never in any log record of the
libraries below the adapter, with every one of them logging at DEBUG, on real requests to kubesim."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from kubeflow_fixtures import config, ident, kubeconfig, spec

from dispatch import AdapterConfig, Config, InvalidError
from dispatch.backend import place
from dispatch.logs import SECRETS
from dispatch_kubeflow.backend import open_backend
from dispatch_kubeflow.kube import LIBRARY_LOGGERS
from kubesim.auth import Permissions
from kubesim.sim import Simulator

pytestmark = pytest.mark.asyncio(loop_scope="module")

WINDOW = 0.3
BAD = ["s3cr3t\nQ9", "s3cr3t\r\nX-Evil: 1", "s3cr3t Q9", "s3cr3t\x00", "s3crét", "s3cr3t\x7f", "\ts3cr3t"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def kc(sim: Simulator, tmp_path_factory: Any) -> str:
    return kubeconfig(tmp_path_factory.mktemp("kc") / "kc", sim.url, sim.token("admin"))


@pytest.fixture
def everything_at_debug() -> Iterator[io.StringIO]:
    """Every record of every logger, formatted with its exception text, into one buffer."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    levels = {name: logging.getLogger(name).level for name in LIBRARY_LOGGERS}
    old_root = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG)
    try:
        yield out
    finally:
        root.removeHandler(handler)
        root.setLevel(old_root)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


@pytest.mark.parametrize("token", BAD)
async def test_a_token_that_cannot_go_in_a_header_is_refused_before_any_request(
    sim: Simulator, kc: str, token: str
) -> None:
    before = len(list(sim.requests))
    for make in (lambda: AdapterConfig("kubeflow", b"{}", token=token), lambda: Config(token=token)):
        with pytest.raises(InvalidError) as info:
            make()
        assert info.value.path == "token"
        assert token not in str(info.value) and "s3cr" not in str(info.value)
        assert "HTTP header" in str(info.value)
    assert len(list(sim.requests)) == before


async def test_a_kubeconfig_token_that_cannot_go_in_a_header_is_refused(
    sim: Simulator, tmp_path: Path
) -> None:
    before = len(list(sim.requests))
    kc = kubeconfig(tmp_path / "kc", sim.url, "abc\ndef")
    with pytest.raises(InvalidError) as info:
        await open_backend(config({"kubeconfig": kc}), probe_window=WINDOW)
    assert info.value.path == "kubeconfig" and "abc\ndef" not in str(info.value)
    assert len(list(sim.requests)) == before


async def test_no_library_logs_the_token_at_debug(
    sim: Simulator, kc: str, everything_at_debug: io.StringIO
) -> None:
    token = sim.add_identity(Permissions.admin("debug-logged"))
    b = await open_backend(config({"kubeconfig": kc}, token=token), probe_window=WINDOW)
    try:
        h = await place(b, spec(), ident("debug-logged"))
        await b.observe(h)
        await b.stop(h)
    finally:
        await b.close()
    text = everything_at_debug.getvalue()
    assert "dispatch_kubeflow.kube DEBUG GET" in text, "the Kubernetes layer logged nothing: DEBUG was not on"
    assert token not in text
    assert {r.identity for r in list(sim.requests) if r.identity == "debug-logged"}


async def test_a_library_record_quoting_the_token_is_scrubbed(
    sim: Simulator, kc: str, everything_at_debug: io.StringIO
) -> None:
    """What hpack (HTTP/2) or an HTTP library refusing a header would log: the token is cut out."""
    token = sim.add_identity(Permissions.admin("scrubbed"))
    b = await open_backend(config({"kubeconfig": kc}, token=token), probe_window=WINDOW)
    try:
        logging.getLogger("hpack.hpack").debug(
            "Encoding %s", [(b"authorization", f"Bearer {token}".encode())]
        )
        logging.getLogger("httpcore2.http11").debug(
            "send_request_headers.failed exception=%r", ValueError(token)
        )
        try:
            raise RuntimeError(f"Illegal header value b'Bearer {token}'")
        except RuntimeError:
            logging.getLogger("httpx2").exception("request failed")
    finally:
        await b.close()
    text = everything_at_debug.getvalue()
    assert text.count("***") >= 3 and "Illegal header value" in text
    assert token not in text
    assert token not in SECRETS  # forgotten once no client uses it
