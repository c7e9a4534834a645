"""Where the connection comes from: settings kubeconfig and context, $KUBECONFIG, TLS with a CA."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import yaml
from kubeflow_fixtures import STOCK, config, install, kubeconfig

from dispatch import InvalidError, Mode, UnavailableError
from dispatch_kubeflow.backend import open_backend
from dispatch_kubeflow.kube import Retry
from kubesim.sim import Simulator

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_kubeconfig_from_the_environment(
    sim: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", kubeconfig(tmp_path / "kc", sim.url, sim.token("readonly")))
    b = await open_backend(config({}), probe_window=0.3)
    try:
        assert (await b.capabilities()).observe_only
        assert b.settings.kubeconfig is None
    finally:
        await b.close()


def _add_context(path: Path, token: str) -> None:
    doc = yaml.safe_load(path.read_text())
    doc["contexts"].append({"name": "other", "context": {"cluster": "kubesim", "user": "ro"}})
    doc["users"].append({"name": "ro", "user": {"token": token}})
    path.write_text(yaml.safe_dump(doc))


async def test_a_named_context(sim: Simulator, tmp_path: Path) -> None:
    path = Path(kubeconfig(tmp_path / "kc", sim.url, sim.token("admin")))
    _add_context(path, sim.token("readonly"))
    b = await open_backend(config({"kubeconfig": str(path), "context": "other"}), probe_window=0.3)
    try:
        assert b.mode is Mode.OBSERVE_ONLY  # the context's read-only user, not the current context's admin
    finally:
        await b.close()


def _write(path: Path, text: str) -> None:
    path.write_text(text)


async def test_a_kubeconfig_that_is_not_one_is_refused_without_echoing_it(tmp_path: Path) -> None:
    path = tmp_path / "kc"
    _write(path, "token: s3cr3t-value\n  - : [\n")
    with pytest.raises(InvalidError) as info:
        await open_backend(config({"kubeconfig": str(path)}))
    assert info.value.path == "kubeconfig" and "s3cr3t" not in str(info.value)


def _set_user(path: Path, user: dict[str, object]) -> None:
    doc = yaml.safe_load(path.read_text())
    doc["users"][0]["user"] = user
    path.write_text(yaml.safe_dump(doc))


@pytest.mark.parametrize(
    ("user", "words"),
    [
        ({"tokenFile": "/nonexistent/token"}, "Token file /nonexistent/token not found"),
        ({"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "false"}}, "returned 1"),
        (
            {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "/nonexistent/x"}},
            "Error",
        ),
    ],
)
async def test_credentials_that_cannot_be_obtained_name_the_kubeconfig(
    sim: Simulator, tmp_path: Path, user: dict[str, object], words: str
) -> None:
    path = Path(kubeconfig(tmp_path / "kc", sim.url, sim.token("admin")))
    _set_user(path, user)  # credentials read per request, not when the kubeconfig is loaded
    with pytest.raises(InvalidError, match="credentials could not be obtained") as info:
        await open_backend(config({"kubeconfig": str(path)}), probe_window=0.3)
    assert info.value.path == "kubeconfig" and words in str(info.value)


def _set_ca_data(path: Path, data: str) -> None:
    doc = yaml.safe_load(path.read_text())
    doc["clusters"][0]["cluster"]["certificate-authority-data"] = data
    path.write_text(yaml.safe_dump(doc))


async def test_certificate_data_that_is_not_base64_names_the_kubeconfig(
    sim: Simulator, tmp_path: Path
) -> None:
    path = Path(kubeconfig(tmp_path / "kc", sim.url, sim.token("admin")))
    _set_ca_data(path, "not base64!")
    with pytest.raises(InvalidError, match="base64") as info:
        await open_backend(config({"kubeconfig": str(path)}), probe_window=0.3)
    assert info.value.path == "kubeconfig"


@pytest.mark.parametrize("status", [200, 302])
async def test_a_server_that_is_not_an_api_server_is_explained(tmp_path: Path, status: int) -> None:
    from aiohttp import web

    async def login_page(request: web.Request) -> web.Response:
        return web.Response(status=status, text="<html>log in</html>", headers={"Location": "/login"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", login_page)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        kc = kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{port}", "token")
        with pytest.raises(UnavailableError, match="not a Kubernetes API answer"):
            await open_backend(config({"kubeconfig": kc}), probe_window=0.3)
    finally:
        await runner.cleanup()


async def test_tls_with_the_cluster_ca(tmp_path: Path) -> None:
    async with Simulator(install_runtimes=False, tls=True) as tls_sim:
        install(tls_sim, *(make() for make in STOCK.values()))
        assert tls_sim.url.startswith("https://")
        # Without the CA the certificate is not trusted, and the error says so.
        untrusted = kubeconfig(tmp_path / "untrusted", tls_sim.url, tls_sim.token("admin"))
        with pytest.raises(UnavailableError, match="CERTIFICATE_VERIFY_FAILED"):
            await open_backend(config({"kubeconfig": untrusted}), retry=Retry(attempts=1))
        kc = tls_sim.write_kubeconfig(tmp_path / "kc")
        b = await open_backend(config({"kubeconfig": str(kc)}), probe_window=0.3)
        try:
            assert b.facts.trainer_reconciles
        finally:
            await b.close()


async def test_the_one_lightkube_hook_beyond_its_public_api_is_still_there() -> None:
    """dispatch_kubeflow.kube builds its HTTP client from lightkube's ConnectionParams.httpx_params (no
    public lightkube API gives a client with a kubeconfig's authentication): fail here, loudly, if a
    lightkube release moves it, rather than at a user's first request."""
    from lightkube.config import client_adapter

    params = client_adapter.ConnectionParams
    assert callable(getattr(params, "httpx_params", None))
    assert list(inspect.signature(params.httpx_params).parameters) == ["self", "config"]
