"""Opening a Slurm cluster: read it with read-only commands and check the settings against it.

Reads the version (refusing below 22.05; it chooses the :class:`~dispatch_slurm.reader.Dialect` every
later answer is read in), ``ClusterName``, the controller, whether accounting or a completion log is
configured, whether preemption is, ``MinJobAge``, and the partitions; with ``container: pyxis``, whether
srun knows ``--container-image``. Submits nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dispatch.errors import InvalidError, UnavailableError, UnsupportedError
from dispatch_slurm.answers import answer
from dispatch_slurm.reader import Dialect, dialect_of
from dispatch_slurm.settings import Settings, unfit_path
from dispatch_slurm.transport import LocalTransport, SshTransport

__all__ = [
    "MIN_VERSION",
    "ClusterInfo",
    "Partition",
    "accounting_of",
    "check_settings",
    "parse_config",
    "parse_partitions",
    "read_cluster",
]

MIN_VERSION = (22, 5)
_LINE = re.compile(r"^(\S+)\s*=\s*(.*)$")
_UNSET = frozenset({"", "(null)", "none"})


@dataclass(frozen=True, slots=True)
class Partition:
    name: str
    nodes: int
    default: bool
    max_nodes: int | None
    priority_tier: int = 1


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    """What opening read from the cluster."""

    version: str
    cluster_name: str
    controller: str
    accounting: bool
    jobcomp: bool
    preemption: bool
    partitions: tuple[Partition, ...]
    container_plugin: bool
    workdir: str
    min_job_age: int = 300
    """Seconds an ended job stays in ``squeue`` (``MinJobAge``); after that only accounting or the
    completion log knows it."""
    kept_since: float | None = None
    """When these facts were read, if they come from the host's cache (:mod:`~dispatch_slurm.clusterfacts`;
    ``None``: read by this open)."""

    @property
    def dialect(self) -> Dialect:
        return dialect_of(self.version)

    @property
    def cluster_id(self) -> str:
        return f"slurm:{self.cluster_name}@{self.controller}"

    def preemptor(self, name: str | None) -> str | None:
        """The partition of the highest PriorityTier above partition ``name``'s, if any (a job there
        preempts one in ``name`` under preempt/partition_prio)."""
        mine = self.partition(name)
        above = [p for p in self.partitions if mine is not None and p.priority_tier > mine.priority_tier]
        return max(above, key=lambda p: p.priority_tier).name if above and self.preemption else None

    def partition(self, name: str | None) -> Partition | None:
        for p in self.partitions:
            if (name is None and p.default) or p.name == name:
                return p
        return None


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config`` as a mapping (``SlurmctldHost[0]`` kept as written)."""
    out = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def parse_partitions(text: str) -> tuple[Partition, ...]:
    """``scontrol show partition -o`` (one partition per line of ``Key=Value`` words)."""
    parts = []
    for line in text.splitlines():
        fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
        if "PartitionName" not in fields:
            continue
        max_nodes = fields.get("MaxNodes", "UNLIMITED")
        parts.append(
            Partition(
                name=fields["PartitionName"],
                nodes=int(fields.get("TotalNodes", "0") or 0),
                default=fields.get("Default") == "YES",
                max_nodes=int(max_nodes) if max_nodes.isdigit() else None,
                priority_tier=int(fields.get("PriorityTier", "1") or 1),
            )
        )
    return tuple(parts)


def accounting_of(config: dict[str, str]) -> bool:
    """Whether accounting (a database ``sacct`` reads) is configured: ``AccountingStorageType`` names a
    plugin other than ``none`` (22.05 prints ``accounting_storage/none`` when it is off, 24.11 ``(null)``)."""
    value = config.get("AccountingStorageType", "").strip()
    return value.lower() not in _UNSET and value.rsplit("/", 1)[-1].lower() != "none"


def _seconds(text: str, default: int) -> int:
    m = re.match(r"\s*(\d+)", text)
    return int(m.group(1)) if m else default


def _version(text: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", text)
    if not m:
        raise UnavailableError(f"cannot read Slurm's version from {text[:40]!r}")
    return int(m.group(1)), int(m.group(2))


def check_settings(settings: Settings, partitions: tuple[Partition, ...]) -> None:
    """Refuse settings a cluster of ``partitions`` cannot serve (``InvalidError`` naming the path)."""
    names = [p.name for p in partitions]
    if settings.partition is not None and settings.partition not in names:
        raise InvalidError(
            f"no partition {settings.partition!r} on this cluster; it has: {', '.join(names) or 'none'}",
            path="partition",
        )


async def read_cluster(settings: Settings, transport: LocalTransport | SshTransport) -> ClusterInfo:
    """Read the cluster and check ``settings`` against it (``UnsupportedError``/``InvalidError``)."""
    shown = await transport.run(["scontrol", "show", "config"])
    config = parse_config(answer(shown, "read the Slurm cluster's configuration"))
    version = config.get("SLURM_VERSION", "")
    if _version(version) < MIN_VERSION:
        raise UnsupportedError(f"Slurm {version} is older than 22.05, the oldest the slurm adapter supports")
    listed = await transport.run(["scontrol", "show", "partition", "-o"])
    partitions = parse_partitions(answer(listed, "list the Slurm partitions"))
    check_settings(settings, partitions)
    container = False
    if settings.container == "pyxis":
        helped = await transport.run(["srun", "--help"])
        container = "--container-image" in helped.stdout
    workdir = settings.workdir
    if workdir is None:
        home = await transport.run(["printenv", "HOME"])
        if not home.ok or not home.stdout.strip().startswith("/"):
            raise InvalidError("no workdir set and $HOME is unknown on the login node", path="workdir")
        workdir = home.stdout.strip().rstrip("/") + "/.dispatch/slurm"
        if (why := unfit_path(workdir)) is not None:
            raise InvalidError(f"$HOME on the login node {why}; set workdir", path="workdir")
    controller = config.get("SlurmctldHost[0]", "")
    controller = controller.split("(")[0] or "unknown"
    port = config.get("SlurmctldPort", "")
    return ClusterInfo(
        version=version,
        cluster_name=config.get("ClusterName", "") or "unnamed",
        controller=f"{controller}:{port}" if port else controller,
        accounting=accounting_of(config),
        jobcomp=config.get("JobCompType", "").strip() == "jobcomp/filetxt",
        preemption=config.get("PreemptType", "preempt/none") != "preempt/none",
        partitions=partitions,
        container_plugin=container,
        workdir=workdir,
        min_job_age=_seconds(config.get("MinJobAge", ""), 300),
    )
