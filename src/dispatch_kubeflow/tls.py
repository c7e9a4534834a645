"""The TLS context of a kubeconfig context: the cluster's CA (file or data), or no verification when the
kubeconfig says ``insecure-skip-tls-verify``, and the client certificate and key (files or data).

``ssl`` loads a certificate chain from files only: data is written to a private file (mode 0600, in a
directory of its own only this user can enter) and removed as soon as it is loaded.
"""

from __future__ import annotations

import hashlib
import os
import ssl

from dispatch.errors import InvalidError
from dispatch_kubeflow.kubeconfig import Context

__all__ = ["ca_fingerprint", "context_for"]


def context_for(ctx: Context) -> ssl.SSLContext:
    """The TLS context to reach ``ctx.server`` (an ``https://`` one); errors name the kubeconfig."""
    try:
        if ctx.insecure:
            tls = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            tls.check_hostname = False
            tls.verify_mode = ssl.CERT_NONE
        else:
            data = ctx.ca_data
            cadata: str | bytes | None = None
            if data is not None:
                cadata = data.decode("ascii") if data.lstrip().startswith(b"-----") else data
            tls = ssl.create_default_context(cafile=ctx.ca_file, cadata=cadata)
    except (ssl.SSLError, OSError, UnicodeDecodeError) as exc:
        raise InvalidError(
            f"{ctx.source}: the cluster's certificate authority could not be loaded ({_why(exc)})",
            path="kubeconfig",
        ) from None
    _client_certificate(tls, ctx)
    return tls


def _why(exc: Exception) -> str:
    if isinstance(exc, ssl.SSLError):
        return f"SSLError: {exc.reason or exc}"
    if isinstance(exc, OSError):
        return f"{type(exc).__name__}: {exc.strerror or exc} {exc.filename or ''}".strip()
    return type(exc).__name__


def _client_certificate(tls: ssl.SSLContext, ctx: Context) -> None:
    has_cert = ctx.cert_file is not None or ctx.cert_data is not None
    has_key = ctx.key_file is not None or ctx.key_data is not None
    if not has_cert and not has_key:
        return
    if has_cert != has_key:
        missing = "client-key" if has_cert else "client-certificate"
        raise InvalidError(f"{ctx.source}: the user has a client {'certificate' if has_cert else 'key'} "
                           f"but no {missing} (or {missing}-data)", path="kubeconfig")  # fmt: skip
    try:
        if ctx.cert_data is None and ctx.key_data is None:
            tls.load_cert_chain(ctx.cert_file or "", ctx.key_file)
            return
        import tempfile

        with tempfile.TemporaryDirectory(prefix="dispatch-tls-") as private:  # mode 0700
            pem = os.path.join(private, "client.pem")
            fd = os.open(pem, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                for data, path in ((ctx.key_data, ctx.key_file), (ctx.cert_data, ctx.cert_file)):
                    if data is None:
                        with open(path or "", "rb") as src:
                            data = src.read()
                    f.write(data.rstrip(b"\n") + b"\n")
            try:
                tls.load_cert_chain(pem)
            finally:
                os.unlink(pem)
    except (ssl.SSLError, OSError) as exc:
        raise InvalidError(
            f"{ctx.source}: the client certificate and key could not be loaded ({_why(exc)})",
            path="kubeconfig",
        ) from None


def ca_fingerprint(ctx: Context) -> str:
    """SHA-256 (16 hex digits) of the CA the context names, "" when none or unreadable: with the server's
    address, the cluster's identity where its kube-system namespace is not readable."""
    raw = ctx.ca_data
    if raw is None and ctx.ca_file is not None:
        try:
            with open(ctx.ca_file, "rb") as f:
                raw = f.read()
        except OSError:
            return ""
    return hashlib.sha256(raw).hexdigest()[:16] if raw else ""
