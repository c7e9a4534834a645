"""Reading a kubeconfig as kubectl does (dispatch_kubeflow.kubeconfig): paths relative to the file, the
service account in a pod, and errors that name the file and the path without showing a credential."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatch import InvalidError
from dispatch_kubeflow.kubeconfig import in_cluster, parse, proxy_for

DOC = {
    "current-context": "c",
    "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", "namespace": "team-a"}}],
    "clusters": [
        {"name": "k", "cluster": {"server": "https://10.0.0.1:6443", "certificate-authority": "ca.pem"}}
    ],
    "users": [{"name": "u", "user": {"client-certificate": "/abs/cert.pem", "client-key": "key.pem"}}],
}


def test_paths_are_relative_to_the_kubeconfig_and_the_namespace_is_the_contexts() -> None:
    ctx = parse(DOC, "/home/me/.kube/config", None)
    assert (ctx.server, ctx.namespace) == ("https://10.0.0.1:6443", "team-a")
    assert (ctx.ca_file, ctx.cert_file, ctx.key_file) == (
        "/home/me/.kube/ca.pem",
        "/abs/cert.pem",
        "/home/me/.kube/key.pem",
    )


def test_no_secret_of_a_context_is_in_its_repr() -> None:
    secrets = {
        "token": "tok-3e1c9a",
        "username": "user-77ab",
        "password": "pw-5d02f1",
        "client-key-data": "a2V5LWRhdGEtOWY0Yg==",  # key-data-9f4b
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": "get-token",
            "env": [{"name": "CLOUD_SECRET", "value": "env-secret-c4e2"}],
        },
    }
    users = [{"name": "u", "user": {"client-certificate": "/abs/cert.pem", **secrets}}]
    clusters = [
        {
            "name": "k",
            "cluster": {"server": "https://10.0.0.1:6443", "proxy-url": "http://me:proxy-pw-81@p:3128"},
        }
    ]
    ctx = parse({**DOC, "users": users, "clusters": clusters}, "/home/me/.kube/config", None)
    assert (ctx.token, ctx.password, ctx.key_data) == ("tok-3e1c9a", "pw-5d02f1", b"key-data-9f4b")
    assert ctx.exec is not None and ctx.exec.env == (("CLOUD_SECRET", "env-secret-c4e2"),)
    shown = repr(ctx) + str(ctx) + repr(ctx.exec)
    for secret in (
        "tok-3e1c9a",
        "user-77ab",
        "pw-5d02f1",
        "key-data-9f4b",
        "a2V5",
        "env-secret-c4e2",
        "proxy-pw-81",
    ):
        assert secret not in shown, secret
    assert "server='https://10.0.0.1:6443'" in shown and "command='get-token'" in shown


@pytest.mark.parametrize(
    ("user", "where"),
    [
        ({"token": 7}, "users[u].user.token: expected a string"),
        ({"client-key-data": "s3cr3t!!"}, "users[u].user.client-key-data: not base64"),
        (
            {"exec": {"apiVersion": "client.authentication.k8s.io/v1alpha1", "command": "x"}},
            "exec.apiVersion",
        ),
        ({"auth-provider": {"name": "gcp"}}, "use an exec plugin"),
    ],
)
def test_errors_name_the_file_and_the_path(user: dict[str, object], where: str) -> None:
    doc = {**DOC, "users": [{"name": "u", "user": user}]}
    with pytest.raises(InvalidError) as info:
        parse(doc, "/k/config", None)
    assert info.value.path == "kubeconfig" and "/k/config" in str(info.value) and where in str(info.value)
    assert "s3cr3t" not in str(info.value)


def test_a_context_naming_a_cluster_that_is_not_there() -> None:
    doc = {**DOC, "clusters": [{"name": "other", "cluster": {"server": "https://x"}}]}
    with pytest.raises(InvalidError, match=r"names cluster 'k', which is not in clusters \(there: other\)"):
        parse(doc, "/k/config", None)


def test_the_pods_service_account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    (tmp_path / "token").write_text("t")
    (tmp_path / "namespace").write_text("jobs\n")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    ctx = in_cluster(tmp_path)
    assert (ctx.server, ctx.namespace, ctx.source) == ("https://[fd00::1]:6443", "jobs", "in-cluster")
    assert (ctx.token_file, ctx.ca_file) == (str(tmp_path / "token"), str(tmp_path / "ca.crt"))
    assert ctx.token is None  # read per request from the file, which Kubernetes rotates


@pytest.mark.parametrize(
    ("server", "environ", "proxy"),
    [
        ("https://api.example:6443", {"HTTPS_PROXY": "http://p:3128"}, "http://p:3128"),
        (
            "https://api.example:6443",
            {"https_proxy": "http://p:3128", "HTTP_PROXY": "http://q"},
            "http://p:3128",
        ),
        ("http://api.example", {"HTTPS_PROXY": "http://p:3128"}, None),
        ("http://api.example", {"HTTP_PROXY": "http://q:8080"}, "http://q:8080"),
        ("https://127.0.0.1:6443", {"HTTPS_PROXY": "http://p"}, None),  # this machine: never proxied
        ("https://localhost:6443", {"HTTPS_PROXY": "http://p"}, None),
        ("https://api.example:6443", {"HTTPS_PROXY": "http://p", "NO_PROXY": "other, example"}, None),
        ("https://api.example:6443", {"HTTPS_PROXY": "http://p", "NO_PROXY": ".api.example"}, "http://p"),
        ("https://10.1.2.3:6443", {"HTTPS_PROXY": "http://p", "no_proxy": "10.0.0.0/8"}, None),
        ("https://10.1.2.3:6443", {"HTTPS_PROXY": "http://p", "NO_PROXY": "10.1.2.3:443"}, "http://p"),
        ("https://10.1.2.3:6443", {"HTTPS_PROXY": "http://p", "NO_PROXY": "*"}, None),
    ],
)
def test_the_proxy_is_kubectls(server: str, environ: dict[str, str], proxy: str | None) -> None:
    doc = {**DOC, "clusters": [{"name": "k", "cluster": {"server": server}}]}
    assert proxy_for(parse(doc, "/k/config", None), environ) == proxy
    with_url = {**DOC, "clusters": [{"name": "k", "cluster": {"server": server, "proxy-url": "http://kc:1"}}]}
    assert proxy_for(parse(with_url, "/k/config", None), environ) == "http://kc:1"  # the kubeconfig's wins
