"""The configuration of the Slurm clusters the tests, the tutorial and the benchmark start, declared once.

Both the cluster on this host (:mod:`dispatch_slurm.localslurm`, Debian 12's Slurm 22.05) and the
clusters inside a Debian root (:mod:`dispatch_slurm.rootslurm`, 24.11 and 26.05) write their files from
here, so every version runs the same settings; only the places (:class:`Layout`) differ. Pure: text in,
text out. Why each setting is there: ``docs/slurm-configuration.md`` ("A local Slurm").
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CGROUP_CONF",
    "CLUSTER_NAME",
    "NODE_CPUS",
    "NODE_MEMORY_MB",
    "PARTITION_HIGH",
    "PARTITION_LOW",
    "Layout",
    "Ports",
    "slurm_conf",
    "slurmdbd_conf",
]

CLUSTER_NAME = "dispatch-local"
PARTITION_LOW = "batch"
PARTITION_HIGH = "urgent"
NODE_CPUS = 4
NODE_MEMORY_MB = 2000

# Slurm 23.02 and later stop slurmd where no cgroup filesystem is mounted ("No filesystem mounted on
# /sys/fs/cgroup") unless the cgroup plugin is off; 22.05 does not know the value.
CGROUP_CONF = "CgroupPlugin=disabled\n"


@dataclass(frozen=True, slots=True)
class Layout:
    """Where one cluster keeps its files, as its daemons see the paths.

    ``spool`` and ``munge_socket`` hold Unix sockets (slurmd makes one per job step in its spool
    directory), whose paths may be at most 107 bytes long: the caller picks short ones."""

    state: str
    spool: str
    run: str
    log: str
    munge_socket: str


@dataclass(frozen=True, slots=True)
class Ports:
    controller: int
    first_node: int
    """The nodes listen on consecutive ports from this one (``Port=[a-b]``)."""
    dbd: int | None = None
    """slurmdbd's port when the cluster keeps accounting in a database, else ``None``."""


def slurm_conf(layout: Layout, ports: Ports, *, host: str, nodes: int) -> str:
    """``slurm.conf`` of a cluster of ``nodes`` nodes ``n1..nN`` on 127.0.0.1 of ``host`` (its short
    name: every slurmd runs on it)."""
    lo = layout
    last = ports.first_node + nodes - 1
    if ports.dbd is not None:
        accounting = [
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=127.0.0.1",
            f"AccountingStoragePort={ports.dbd}",
            # Else the slurmctld→slurmdbd link uses munge's default socket.
            f"AccountingStoragePass={lo.munge_socket}",
        ]
    else:
        accounting = ["AccountingStorageType=accounting_storage/none"]
    lines = [
        f"ClusterName={CLUSTER_NAME}",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ports.controller}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"AuthInfo=socket={lo.munge_socket},cred_expire=10",
        "CommunicationParameters=NoInAddrAny",
        f"StateSaveLocation={lo.state}",
        f"SlurmdSpoolDir={lo.spool}/%n",
        f"SlurmctldPidFile={lo.run}/slurmctld.pid",
        f"SlurmdPidFile={lo.run}/slurmd-%n.pid",
        f"SlurmctldLogFile={lo.log}/slurmctld.log",
        f"SlurmdLogFile={lo.log}/slurmd-%n.log",
        "SlurmdParameters=config_overrides",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "JobAcctGatherType=jobacct_gather/linux",
        "JobAcctGatherParams=OverMemoryKill",
        "JobAcctGatherFrequency=task=1",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "DefMemPerCPU=100",
        "SchedulerType=sched/backfill",
        "SlurmdTimeout=10",
        "SlurmctldTimeout=30",
        "ReturnToService=2",
        "KillWait=5",
        "MinJobAge=600",
        "InactiveLimit=0",
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        *accounting,
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={lo.log}/jobcomp.txt",
        f"NodeName=n[1-{nodes}] NodeHostname={host} NodeAddr=127.0.0.1 "
        f"Port=[{ports.first_node}-{last}] CPUs={NODE_CPUS} RealMemory={NODE_MEMORY_MB} State=UNKNOWN",
        f"PartitionName={PARTITION_LOW} Nodes=n[1-{nodes}] Default=YES PriorityTier=1 MaxTime=INFINITE State=UP",
        f"PartitionName={PARTITION_HIGH} Nodes=n[1-{nodes}] PriorityTier=2 MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


def slurmdbd_conf(layout: Layout, *, dbd_port: int, db_port: int) -> str:
    """``slurmdbd.conf`` (mode 600, beside ``slurm.conf``: slurmdbd has no ``-f``) for a slurmdbd on
    ``dbd_port`` that keeps its database in the MariaDB listening on 127.0.0.1:``db_port`` (TCP, so
    a slurmdbd in a root reaches the host's MariaDB the same way)."""
    lo = layout
    lines = [
        "AuthType=auth/munge",
        f"AuthInfo=socket={lo.munge_socket}",
        "DbdHost=localhost",
        "DbdAddr=127.0.0.1",
        f"DbdPort={dbd_port}",
        "SlurmUser=root",
        f"PidFile={lo.run}/slurmdbd.pid",
        f"LogFile={lo.log}/slurmdbd.log",
        "StorageType=accounting_storage/mysql",
        "StorageHost=127.0.0.1",
        f"StoragePort={db_port}",
        "StorageUser=root",
        "StorageLoc=slurm_acct_db",
    ]
    return "\n".join(lines) + "\n"
