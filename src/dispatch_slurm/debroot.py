"""Debian roots holding other Slurm versions than this host's, made with ``mmdebstrap``, kept in a cache.

Sites run Slurm 23.02 to 26.x, this host Debian 12's 22.05. Another Debian release's Slurm runs here in
a root of its own (never by adding that release to this host's apt sources, which would upgrade libc
under everything else): Debian 13 (trixie) holds Slurm 24.11, Debian unstable (sid) 26.05.
:mod:`dispatch_slurm.rootslurm` starts a cluster inside one.

A root lives outside the repository, in ``$DISPATCH_SLURM_ROOTS`` (else
``$XDG_CACHE_HOME/dispatch/slurm-roots``, else ``~/.cache/dispatch/slurm-roots``), in a directory named
after its release and a digest of its recipe, so a changed recipe makes a new root instead of reusing an
old one. It is made into a temporary directory and renamed when complete, under a lock: a root that
exists is whole, and two processes asking at once make it once. Making one needs root privileges and
the Debian mirror this host installs from (the first ``URIs:`` of its apt sources). Cold, a root takes
about a minute and 300 MB.

Command line (``.ci/run`` makes the roots when missing)::

    python -m dispatch_slurm.debroot make [24.11 26.05]   # makes what is missing, prints the paths
    python -m dispatch_slurm.debroot path 24.11           # the root's path, exit 1 if not made
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "PACKAGES",
    "RELEASES",
    "Release",
    "cache_dir",
    "find_root",
    "make_root",
    "mirror",
    "slurm_version",
]

PACKAGES = (
    "slurmctld", "slurmd", "slurm-client", "slurmdbd", "munge", "openssh-server",
    "bash", "procps", "iproute2", "python3-minimal", "python3-numpy",
)  # fmt: skip
"""What every root holds: Slurm's daemons and clients, slurmdbd (whose database is this host's
MariaDB), munge, an sshd for the login node, and what the tests' jobs run (the training issue's
program needs numpy)."""

DEFAULT_MIRROR = "http://deb.debian.org/debian"


@dataclass(frozen=True, slots=True)
class Release:
    slurm: str
    """The Slurm version (major.minor) this Debian release holds."""
    suite: str
    aptopts: tuple[str, ...] = ()

    def recipe(self) -> list[str]:
        """mmdebstrap's arguments but the target (the whole recipe: its digest names the root)."""
        opts = [f"--aptopt={opt}" for opt in self.aptopts]
        return ["--variant=apt", *opts, f"--include={','.join(PACKAGES)}", self.suite]

    @property
    def name(self) -> str:
        digest = hashlib.sha256("\0".join(self.recipe()).encode()).hexdigest()[:10]
        return f"{self.suite}-{digest}"


RELEASES = {
    r.slurm: r
    for r in (
        Release("24.11", "trixie"),
        # The archive serves sid's Release file past its short Valid-Until.
        Release("26.05", "sid", ('Acquire::Check-Valid-Until "false"',)),
    )
}


def cache_dir() -> Path:
    explicit = os.environ.get("DISPATCH_SLURM_ROOTS")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dispatch" / "slurm-roots"


def mirror(sources: Path = Path("/etc/apt/sources.list.d/debian.sources")) -> str:
    """The Debian mirror this host installs from: the first ``URIs:`` of its deb822 sources that is
    not the security archive (``$DISPATCH_DEBIAN_MIRROR`` overrides it)."""
    explicit = os.environ.get("DISPATCH_DEBIAN_MIRROR")
    if explicit:
        return explicit
    try:
        text = sources.read_text()
    except OSError:
        return DEFAULT_MIRROR
    for uri in re.findall(r"^URIs:\s*(\S+)", text, re.M):
        if "security" not in uri:
            return str(uri)
    return DEFAULT_MIRROR


def _release(version: str) -> Release:
    try:
        return RELEASES[version]
    except KeyError:
        raise ValueError(f"no Debian root for Slurm {version}: known are {', '.join(RELEASES)}") from None


def find_root(version: str) -> Path | None:
    """The root holding Slurm ``version`` when it has been made, else ``None``."""
    root = cache_dir() / _release(version).name
    return root if root.is_dir() else None


def make_root(version: str, *, quiet: bool = True) -> Path:
    """The root holding Slurm ``version``, made first when missing (under a lock; about a minute)."""
    release = _release(version)
    source = mirror()
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    root = cache / release.name
    with (cache / f"{release.suite}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if root.is_dir():
            return root
        if shutil.which("mmdebstrap") is None:
            raise RuntimeError("making a Debian root needs mmdebstrap (Debian: apt-get install mmdebstrap)")
        partial = root.with_name(root.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        log = root.with_name(root.name + ".log")
        argv = ["mmdebstrap", "--quiet", *release.recipe(), str(partial), source]
        started = time.monotonic()
        with log.open("w") as out:
            done = subprocess.run(argv, stdout=out if quiet else None, stderr=subprocess.STDOUT, check=False)
        if done.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            raise RuntimeError(f"mmdebstrap of {release.suite} failed (exit {done.returncode}; log {log})")
        partial.rename(root)
        with log.open("a") as out:
            out.write(f"made in {time.monotonic() - started:.1f} s: {' '.join(argv)}\n")
        return root


def slurm_version(root: Path) -> str:
    """The version of the slurmctld package installed in ``root`` (``24.11.5``), read from dpkg's
    status file."""
    status = (root / "var" / "lib" / "dpkg" / "status").read_text()
    for stanza in status.split("\n\n"):
        if re.search(r"^Package: slurmctld$", stanza, re.M):
            found = re.search(r"^Version: (?:\d+:)?([\d.]+)", stanza, re.M)
            if found:
                return found.group(1)
    raise RuntimeError(f"{root} holds no slurmctld package")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dispatch_slurm.debroot", description=__doc__)
    parser.add_argument("action", choices=("make", "path"))
    parser.add_argument("versions", nargs="*", default=list(RELEASES), help="Slurm versions (default: all)")
    args = parser.parse_args(argv)
    status = 0
    for version in args.versions:
        try:
            if args.action == "make":
                started = time.monotonic()
                existed = find_root(version) is not None
                root = make_root(version)
                how = "already made" if existed else f"made in {time.monotonic() - started:.0f} s"
                print(f"Slurm {slurm_version(root)}: {root} ({how})")
            else:
                found = find_root(version)
                if found is None:
                    print(f"debroot: no root for Slurm {version} in {cache_dir()}", file=sys.stderr)
                    status = 1
                else:
                    print(found)
        except (ValueError, RuntimeError, OSError) as exc:
            print(f"debroot: {exc}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    raise SystemExit(main())
