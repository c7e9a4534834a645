"""A throw-away self-signed certificate for the TLS mode of the API server.

Uses the ``cryptography`` package when installed, else the ``openssl`` command line tool; if neither is
available, TLS mode raises a clear error.
"""

from __future__ import annotations

import datetime
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SelfSignedCert", "TLSUnavailable", "make_self_signed"]


class TLSUnavailable(RuntimeError):
    """Neither the cryptography package nor the openssl tool is available."""


@dataclass(frozen=True)
class SelfSignedCert:
    cert_pem: bytes
    key_pem: bytes

    def __repr__(self) -> str:
        return "SelfSignedCert(<pem>)"


def make_self_signed(host: str = "127.0.0.1") -> SelfSignedCert:
    """A certificate valid for ``host``, ``localhost`` and 127.0.0.1, for one year; also its own CA."""
    try:
        return _with_cryptography(host)
    except ImportError:
        return _with_openssl(host)


def _with_cryptography(host: str) -> SelfSignedCert:
    import ipaddress

    from cryptography import x509  # type: ignore[import-not-found,unused-ignore]
    from cryptography.hazmat.primitives import hashes, serialization  # type: ignore[import-not-found,unused-ignore]
    from cryptography.hazmat.primitives.asymmetric import ec  # type: ignore[import-not-found,unused-ignore]
    from cryptography.x509.oid import NameOID  # type: ignore[import-not-found,unused-ignore]

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubesim")])
    now = datetime.datetime.now(datetime.UTC)
    sans: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    ]
    if host not in ("localhost", "127.0.0.1"):
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return SelfSignedCert(
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )


def _with_openssl(host: str) -> SelfSignedCert:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise TLSUnavailable("TLS needs the 'cryptography' package or the 'openssl' tool; neither was found")
    san = "DNS:localhost,IP:127.0.0.1"
    if host not in ("localhost", "127.0.0.1"):
        san += f",IP:{host}" if host.replace(".", "").isdigit() else f",DNS:{host}"
    with tempfile.TemporaryDirectory(prefix="kubesim-tls-") as d:
        cert, key = Path(d) / "cert.pem", Path(d) / "key.pem"
        cmd = [
            openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "365", "-subj", "/CN=kubesim",
            "-addext", f"subjectAltName={san}", "-addext", "basicConstraints=critical,CA:TRUE",
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise TLSUnavailable(f"openssl could not make a certificate: {proc.stderr.strip()}")
        return SelfSignedCert(cert.read_bytes(), key.read_bytes())
