"""Where the connection comes from: settings kubeconfig and context, $KUBECONFIG, TLS with a CA."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
import yaml
from kubeflow_fixtures import STOCK, config, install, kubeconfig

from dispatch import InvalidError, Mode, UnavailableError
from dispatch_kubeflow.backend import open_backend
from dispatch_kubeflow.kube import Retry
from kubesim.auth import Permissions
from kubesim.sim import Simulator
from kubesim.tls import make_self_signed

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
        ({"tokenFile": "/nonexistent/token"}, "token file /nonexistent/token not found"),
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


async def _reads_as(sim: Simulator, path: Path, identity: str) -> None:
    """A read-only open and one listing through kubeconfig ``path`` reach the cluster as ``identity``."""
    b = await open_backend(config({"kubeconfig": str(path)}, read_only=True))
    try:
        await b.list()
    finally:
        await b.close()
    assert sim.requests.filter(identity=identity, status=200)


async def test_a_token_file(sim: Simulator, tmp_path: Path) -> None:
    token = sim.add_identity(Permissions.admin("from-a-file"))
    (tmp_path / "token").write_text(token + "\n")
    path = Path(kubeconfig(tmp_path / "kc", sim.url, "unused"))
    _set_user(path, {"tokenFile": "token"})  # relative to the kubeconfig's directory, as kubectl reads it
    await _reads_as(sim, path, "from-a-file")


EXEC_PLUGIN = """#!{python}
import json, os, pathlib, sys
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
assert info["kind"] == "ExecCredential" and info["spec"]["interactive"] is False, info
assert os.environ["FROM_KUBECONFIG"] == "yes"
runs = pathlib.Path(sys.argv[1])
runs.write_text(runs.read_text() + "x" if runs.exists() else "x")
status = {{"token": "{token}", "expirationTimestamp": "{expires}"}}
print(json.dumps({{"apiVersion": info["apiVersion"], "kind": "ExecCredential", "status": status}}))
"""


@pytest.mark.parametrize(("expires", "runs"), [("2999-01-01T00:00:00Z", 1), ("2000-01-01T00:00:00Z", None)])
async def test_an_exec_plugin_runs_again_only_when_its_credential_expires(
    sim: Simulator, tmp_path: Path, expires: str, runs: int | None
) -> None:
    import sys

    token = sim.add_identity(Permissions.admin(f"exec-{runs}"))
    plugin = tmp_path / "plugin"
    plugin.write_text(EXEC_PLUGIN.format(python=sys.executable, token=token, expires=expires))
    plugin.chmod(0o700)
    path = Path(kubeconfig(tmp_path / "kc", sim.url, "unused"))
    exec_ = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": "./plugin",
        "args": [str(tmp_path / "runs")],
        "env": [{"name": "FROM_KUBECONFIG", "value": "yes"}],
    }
    _set_user(path, {"exec": exec_})
    await _reads_as(sim, path, f"exec-{runs}")
    requests = len(sim.requests.filter(identity=f"exec-{runs}"))
    ran = len((tmp_path / "runs").read_text())
    # A credential valid for years is obtained once; one already expired, for every request.
    assert ran == (runs if runs is not None else requests) and requests > 1


async def test_a_context_that_is_not_there_names_those_that_are(sim: Simulator, tmp_path: Path) -> None:
    path = Path(kubeconfig(tmp_path / "kc", sim.url, sim.token("admin")))
    with pytest.raises(InvalidError, match=r"no context 'prod' \(contexts there: kubesim\)") as info:
        await open_backend(config({"kubeconfig": str(path), "context": "prod"}))
    assert info.value.path == "context" and str(path) in str(info.value)


def _set_tls(path: Path, cluster: dict[str, object], user: dict[str, object]) -> None:
    doc = yaml.safe_load(path.read_text())
    doc["clusters"][0]["cluster"].update(cluster)
    doc["users"][0]["user"].update(user)
    path.write_text(yaml.safe_dump(doc))


async def test_insecure_skip_tls_verify_and_client_certificate_data(tmp_path: Path) -> None:
    import base64

    async with Simulator(install_runtimes=False, tls=True) as tls_sim:
        path = Path(kubeconfig(tmp_path / "kc", tls_sim.url, tls_sim.token("admin")))
        _set_tls(path, {"insecure-skip-tls-verify": True}, {})
        await _reads_as(tls_sim, path, "admin")
        # A client key that is not one: the kubeconfig is named, the key is not shown.
        pair = make_self_signed()
        cert_pem, key_pem = pair.cert_pem, pair.key_pem
        cert = base64.b64encode(cert_pem).decode()
        _set_tls(
            path,
            {},
            {"client-certificate-data": cert, "client-key-data": base64.b64encode(b"nokey").decode()},
        )
        with pytest.raises(InvalidError, match="client certificate and key could not be loaded") as info:
            await open_backend(config({"kubeconfig": str(path)}, read_only=True))
        assert info.value.path == "kubeconfig"
        # A good pair loads (kubesim asks for no client certificate: the token still identifies).
        _set_tls(path, {}, {"client-key-data": base64.b64encode(key_pem).decode()})
        await _reads_as(tls_sim, path, "admin")


class _TunnelProxy:
    """An HTTP proxy that only tunnels (CONNECT), and remembers what it was asked for and how."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []  # (target, Proxy-Authorization)
        self.port = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        target = head[0].split(" ")[1]
        auth = next(
            (h.split(":", 1)[1].strip() for h in head if h.lower().startswith("proxy-authorization")), ""
        )
        self.asked.append((target, auth))
        host, port = target.rsplit(":", 1)
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def test_an_https_cluster_through_the_kubeconfigs_proxy(tmp_path: Path) -> None:
    import base64

    proxy = _TunnelProxy()
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    proxy.port = server.sockets[0].getsockname()[1]
    try:
        async with Simulator(install_runtimes=False, tls=True) as tls_sim:
            path = tls_sim.write_kubeconfig(tmp_path / "kc")
            _set_tls(path, {"proxy-url": f"http://me:s3cr3t@127.0.0.1:{proxy.port}"}, {})
            await _reads_as(tls_sim, path, "admin")  # TLS to the server, verified, inside the tunnel
            port = tls_sim.url.rsplit(":", 1)[1]
            assert proxy.asked[0] == (f"127.0.0.1:{port}", "Basic " + base64.b64encode(b"me:s3cr3t").decode())
    finally:
        server.close()
