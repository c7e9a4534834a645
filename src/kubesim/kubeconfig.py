"""Writing a kubeconfig that points kubectl, lightkube or the Kubernetes SDK at a running simulator."""

from __future__ import annotations

import base64
import fcntl
import json
import os
from pathlib import Path
from typing import IO, Any

__all__ = ["CONTEXT", "claim_kubeconfig", "kubeconfig_dict", "write_kubeconfig"]

CONTEXT = "kubesim"


def kubeconfig_dict(
    server: str, token: str, *, ca_pem: bytes | None = None, namespace: str = "default", user: str = "kubesim"
) -> dict[str, Any]:
    """A kubeconfig with one cluster, user and context (all named ``kubesim``, user as given)."""
    cluster: dict[str, Any] = {"server": server}
    if ca_pem is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": cluster}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [
            {"name": CONTEXT, "context": {"cluster": CONTEXT, "user": user, "namespace": namespace}}
        ],
        "current-context": CONTEXT,
        "preferences": {},
    }


def write_kubeconfig(
    path: str | os.PathLike[str],
    server: str,
    token: str,
    *,
    ca_pem: bytes | None = None,
    namespace: str = "default",
    user: str = "kubesim",
) -> Path:
    """Write the kubeconfig to ``path`` as JSON (mode 0600, as it holds a token); returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    # JSON, which is YAML: kubectl and every client read it, and dispatch reads it without importing a
    # YAML parser (a read command of the dev cluster spends no CPU on one).
    text = (
        json.dumps(kubeconfig_dict(server, token, ca_pem=ca_pem, namespace=namespace, user=user), indent=2)
        + "\n"
    )
    # The token must never be readable by others, not even for a moment: a new file is created 0600, and
    # an existing one (the mode of O_CREAT applies only to new files) is narrowed before the token goes in.
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return p


def claim_kubeconfig(path: str | os.PathLike[str]) -> IO[str]:
    """Hold ``<path>.lock`` (an exclusive ``flock``) for as long as the returned file stays open, so a
    second ``kubesim serve`` given the same kubeconfig refuses instead of overwriting the first one's
    (whose clients would then talk to a server that is not theirs). ``SystemExit`` names the holder."""
    lock = Path(f"{os.fspath(path)}.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    f = open(lock, "a+")  # noqa: SIM115 - held open on purpose: the lock lives as long as the file
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "?"
        f.close()
        raise SystemExit(
            f"kubesim: {os.fspath(path)} belongs to another kubesim that is still serving (pid {holder}); "
            "stop it first, or give --kubeconfig another path"
        ) from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f
