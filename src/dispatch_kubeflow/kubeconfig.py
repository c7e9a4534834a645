"""Which server, namespace, TLS settings and credentials a kubeconfig context names — or the pod's own
service account (in-cluster) — read as kubectl reads them, without a Kubernetes library.

What is understood (what kubectl users put in a kubeconfig, and what dispatch's tests and docs rely on):
``current-context`` or a named context; the context's ``namespace``; the cluster's ``server``,
``certificate-authority`` / ``-data``, ``insecure-skip-tls-verify``, ``tls-server-name`` and
``proxy-url`` (an ``http://`` proxy; else the environment's, :func:`proxy_for`); the user's
``token``, ``tokenFile``, ``client-certificate`` / ``-data`` with ``client-key`` / ``-data``,
``username`` / ``password`` and ``exec`` credential plugins (``client.authentication.k8s.io`` v1 and
v1beta1). File paths in a kubeconfig are relative to its directory. ``auth-provider`` (removed from
kubectl in 1.26) is refused with what to use instead.

Where the configuration comes from when no file is given (:func:`load`): in-cluster (the pod's service
account, when ``$KUBERNETES_SERVICE_HOST`` is set and its token is mounted, and no context is named),
else the first file of ``$KUBECONFIG`` that exists, else ``~/.kube/config``. (kubectl merges every
file of ``$KUBECONFIG``; dispatch reads the first that exists.)

Every problem is an :class:`~dispatch.errors.InvalidError` naming the file and the path in it, never
quoting a credential. A kubeconfig written as JSON (kubesim's and the dev cluster's are) is read with the
stdlib's ``json``; YAML is imported only for one that is not, with libyaml's loader when it is installed.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from msgspec import Struct

from dispatch.errors import InvalidError
from dispatch.logs import shown

__all__ = ["SERVICE_ACCOUNT", "Context", "ExecPlugin", "in_cluster", "load", "parse", "proxy_for"]

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""Where Kubernetes mounts a pod's service account: ``token``, ``ca.crt``, ``namespace``."""
_EXEC_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")


class ExecPlugin(Struct, frozen=True):
    """A credential plugin: a command that prints an ``ExecCredential`` (kubectl's ``users[].user.exec``)."""

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    api_version: str = _EXEC_VERSIONS[0]
    install_hint: str = ""

    def __repr__(self) -> str:
        return shown(self, frozenset({"env"}))  # the environment may hold credentials


_SECRET_FIELDS = frozenset({"ca_data", "proxy_url", "token", "username", "password", "cert_data", "key_data"})
"""Kept out of :class:`Context`'s repr (a proxy URL may carry a password; the CA is only bulky)."""


class Context(Struct, frozen=True):
    """One resolved context: where the server is and how to prove who we are. Secrets stay out of repr."""

    source: str
    """The kubeconfig file (``in-cluster`` for the service account), for errors."""
    server: str
    namespace: str = "default"
    name: str = ""
    ca_file: str | None = None
    ca_data: bytes | None = None
    insecure: bool = False
    tls_server_name: str | None = None
    proxy_url: str | None = None
    token: str | None = None
    token_file: str | None = None
    username: str | None = None
    password: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    cert_data: bytes | None = None
    key_data: bytes | None = None
    exec: ExecPlugin | None = None

    def __repr__(self) -> str:
        return shown(self, _SECRET_FIELDS)


def load(kubeconfig: str | None, context: str | None) -> Context:
    """The context ``context`` (default: the current one) of file ``kubeconfig``; with no file, of the
    environment (see the module docstring)."""
    if kubeconfig:
        return parse(_read(kubeconfig), kubeconfig, context)
    if context is None and os.environ.get("KUBERNETES_SERVICE_HOST") and (SERVICE_ACCOUNT / "token").exists():
        return in_cluster()
    candidates = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    candidates.append(os.path.expanduser("~/.kube/config"))
    for path in candidates:
        if os.path.exists(path):
            return parse(_read(path), path, context)
    raise InvalidError(
        "no usable cluster configuration (in-cluster, $KUBECONFIG or ~/.kube/config): none of "
        f"{', '.join(candidates)} exists, and this is not a pod with a service account",
        path="kubeconfig",
    )


def in_cluster(account: Path = SERVICE_ACCOUNT) -> Context:
    """The pod's service account (mounted at ``account``): the API server's service address, its CA, the
    token (read again as Kubernetes rotates it) and the pod's namespace."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    ns_file = account / "namespace"
    namespace = ns_file.read_text().strip() if ns_file.exists() else "default"
    ca = account / "ca.crt"
    return Context(
        source="in-cluster",
        server=f"https://{host}:{port}",
        namespace=namespace or "default",
        ca_file=str(ca) if ca.exists() else None,
        token_file=str(account / "token"),
    )


def _read(path: str) -> Any:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise InvalidError(f"kubeconfig {path!r} could not be read: {why}", path="kubeconfig") from None
    if text.lstrip().startswith("{"):  # JSON (which is YAML): read without importing YAML
        import json

        try:
            return json.loads(text)
        except ValueError:
            pass  # a YAML flow mapping: the YAML loader says what is wrong, if anything
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        return yaml.load(text, Loader=loader)  # a safe loader (libyaml's when present)
    except yaml.YAMLError as exc:
        # Never echo the file's text: a kubeconfig holds credentials. Name the problem and the line.
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        raise InvalidError(
            f"{path} could not be read as a kubeconfig ({type(exc).__name__}{line})", path="kubeconfig"
        ) from None


class _Doc:
    """Typed reads from one kubeconfig document, each error naming the file and the path."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.base = Path(source).parent

    def fail(self, where: str, what: str, path: str = "kubeconfig") -> InvalidError:
        return InvalidError(f"{self.source}: {where}: {what}", path=path)

    def map(self, value: Any, where: str) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.fail(where, f"expected a mapping, got {type(value).__name__}")
        return value

    def text(self, m: Mapping[str, Any], key: str, where: str) -> str | None:
        value = m.get(key)
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            raise self.fail(f"{where}.{key}", f"expected a string, got {type(value).__name__}")
        return value

    def file(self, m: Mapping[str, Any], key: str, where: str) -> str | None:
        value = self.text(m, key, where)
        return None if value is None else str(self.base / os.path.expanduser(value))

    def data(self, m: Mapping[str, Any], key: str, where: str) -> bytes | None:
        value = self.text(m, key, where)
        if value is None:
            return None
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise self.fail(f"{where}.{key}", "not base64 (the value is not shown)") from None

    def named(self, doc: Mapping[str, Any], section: str, name: str, where: str) -> Mapping[str, Any]:
        entries = doc.get(section)
        if not isinstance(entries, list):
            raise self.fail(section, "expected a list")
        for i, entry in enumerate(entries):
            entry = self.map(entry, f"{section}[{i}]")
            if entry.get("name") == name:
                return self.map(entry.get(section[:-1]), f"{section}[{i}].{section[:-1]}")
        names = ", ".join(sorted(str(self.map(e, section).get("name")) for e in entries)) or "none"
        raise self.fail(where, f"names {section[:-1]} {name!r}, which is not in {section} (there: {names})")


def parse(doc: Any, source: str, context: str | None) -> Context:
    """The context ``context`` (default: ``current-context``) of kubeconfig document ``doc`` read from
    file ``source`` (relative paths in it are relative to the file's directory)."""
    d = _Doc(source)
    doc = d.map(doc, "the document")
    if context is None:
        context = d.text(doc, "current-context", "")
        if context is None:
            raise d.fail("current-context", "not set, and no context was named (settings: context)")
        ctx = d.named(doc, "contexts", context, "current-context")
    else:
        entries = doc.get("contexts")
        known = {
            e.get("name") for e in (entries if isinstance(entries, list) else []) if isinstance(e, Mapping)
        }
        if context not in known:
            there = ", ".join(sorted(str(n) for n in known)) or "none"
            raise InvalidError(f"{source}: no context {context!r} (contexts there: {there})", path="context")
        ctx = d.named(doc, "contexts", context, "contexts")
    where = f"contexts[{context}].context"
    cluster_name = d.text(ctx, "cluster", where)
    if cluster_name is None:
        raise d.fail(f"{where}.cluster", "missing")
    cluster = d.named(doc, "clusters", cluster_name, f"{where}.cluster")
    cwhere = f"clusters[{cluster_name}].cluster"
    server = d.text(cluster, "server", cwhere)
    if server is None:
        raise d.fail(f"{cwhere}.server", "missing")
    user_name = d.text(ctx, "user", where)
    user = d.named(doc, "users", user_name, f"{where}.user") if user_name is not None else {}
    uwhere = f"users[{user_name}].user"
    insecure = cluster.get("insecure-skip-tls-verify", False)
    if not isinstance(insecure, bool):
        raise d.fail(f"{cwhere}.insecure-skip-tls-verify", "expected true or false")
    if user.get("auth-provider") is not None and not any(k in user for k in ("token", "tokenFile", "exec")):
        raise d.fail(
            f"{uwhere}.auth-provider",
            "auth-provider plugins are not supported (kubectl dropped them in 1.26): use an exec plugin "
            "(e.g. gke-gcloud-auth-plugin, kubelogin)",
        )
    return Context(
        source=source,
        name=context,
        server=server,
        namespace=d.text(ctx, "namespace", where) or "default",
        ca_file=d.file(cluster, "certificate-authority", cwhere),
        ca_data=d.data(cluster, "certificate-authority-data", cwhere),
        insecure=insecure,
        tls_server_name=d.text(cluster, "tls-server-name", cwhere),
        proxy_url=d.text(cluster, "proxy-url", cwhere),
        token=d.text(user, "token", uwhere),
        token_file=d.file(user, "tokenFile", uwhere),
        username=d.text(user, "username", uwhere),
        password=d.text(user, "password", uwhere),
        cert_file=d.file(user, "client-certificate", uwhere),
        key_file=d.file(user, "client-key", uwhere),
        cert_data=d.data(user, "client-certificate-data", uwhere),
        key_data=d.data(user, "client-key-data", uwhere),
        exec=_exec(d, user.get("exec"), f"{uwhere}.exec"),
    )


def _exec(d: _Doc, value: Any, where: str) -> ExecPlugin | None:
    if value is None:
        return None
    m = d.map(value, where)
    command = d.text(m, "command", where)
    if command is None:
        raise d.fail(f"{where}.command", "missing")
    if os.sep in command:  # kubectl: a path with a separator is relative to the kubeconfig's directory
        command = str(d.base / os.path.expanduser(command))
    version = d.text(m, "apiVersion", where) or _EXEC_VERSIONS[0]
    if version not in _EXEC_VERSIONS:
        raise d.fail(f"{where}.apiVersion", f"{version!r} is not one of {', '.join(_EXEC_VERSIONS)}")
    args = m.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise d.fail(f"{where}.args", "expected a list of strings")
    env: list[tuple[str, str]] = []
    for i, entry in enumerate(m.get("env") or []):
        e = d.map(entry, f"{where}.env[{i}]")
        name, val = e.get("name"), e.get("value")
        if not isinstance(name, str) or not isinstance(val, str):
            raise d.fail(f"{where}.env[{i}]", "expected a name and a value, both strings")
        env.append((name, val))
    return ExecPlugin(command, tuple(args), tuple(env), version, d.text(m, "installHint", where) or "")


def proxy_for(ctx: Context, environ: Mapping[str, str]) -> str | None:
    """The HTTP proxy to reach ``ctx.server`` through, as kubectl (Go's ``net/http``) chooses it: the
    kubeconfig's ``proxy-url``; else ``$HTTPS_PROXY`` for an https server, ``$HTTP_PROXY`` for an http
    one (either spelling), unless the server is this machine (``localhost``, a loopback address) or
    ``$NO_PROXY`` names it (``*``; a host, which also covers its subdomains; ``.domain``; an address; a
    CIDR block; each optionally with ``:port``)."""
    if ctx.proxy_url:
        return ctx.proxy_url
    from urllib.parse import urlsplit

    url = urlsplit(ctx.server)
    name = "https_proxy" if url.scheme == "https" else "http_proxy"
    proxy = environ.get(name.upper()) or environ.get(name)
    host = (url.hostname or "").lower()
    if not proxy or host == "localhost":
        return None
    port = url.port or (443 if url.scheme == "https" else 80)
    ip = _address(host)
    if ip is not None and ip.is_loopback:
        return None
    for entry in (environ.get("NO_PROXY") or environ.get("no_proxy") or "").split(","):
        entry = entry.strip().lower()
        if entry == "*":
            return None
        if not entry:
            continue
        name_part, _, port_part = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
        if port_part and port_part != str(port):
            continue
        if _no_proxy_match(host, ip, name_part or entry):
            return None
    return proxy


def _address(host: str) -> Any:
    if not host or not (host[0].isdigit() or ":" in host):
        return None
    import ipaddress

    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _no_proxy_match(host: str, ip: Any, entry: str) -> bool:
    if "/" in entry:
        import ipaddress

        try:
            return ip is not None and ip in ipaddress.ip_network(entry, strict=False)
        except ValueError:
            return False
    entry = entry.strip("[]")
    if entry.startswith("."):
        return host.endswith(entry)
    return host == entry or host.endswith("." + entry)
