"""The Slurm adapter's settings (SPEC §13): strict decoding, defaults, cross-field rules, the JSON Schema.

:func:`parse_settings` touches no cluster; every refusal is an :class:`~dispatch.errors.InvalidError`
naming the path of the offending value. The settings are declared once, here, with the public
declaration kit (:mod:`dispatch.model.declare`); ``docs/slurm-configuration.md`` explains each.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

import msgspec
from msgspec import Meta

from dispatch.errors import InvalidError
from dispatch.model.declare import Duration, Model, check_declared, json_schema, load_json

__all__ = ["HOLD_BASE", "Resources", "Settings", "Ssh", "parse_settings", "schema", "unfit_path"]

HOLD_BASE = 315_576_000
"""Seconds a hold pushes a job's start time into the future: ten Julian years, as the Go original."""

MAX_OUTPUT_TAIL_LINES = 10_000

_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"
_ABSOLUTE = r"^/"
_MEMORY = r"^[0-9]{1,12}[KMGT]?$"
_HOST = r"^[A-Za-z0-9._:-]{1,253}$"

SlurmName = Annotated[
    str, Meta(pattern=_NAME, extra={"expected": "a Slurm name (A-Z a-z 0-9 _ . -, at most 128 characters)"})
]
AbsolutePath = Annotated[
    str, Meta(pattern=_ABSOLUTE, max_length=4096, extra={"expected": "an absolute path"})
]
DEFAULT_POLL = Duration("5s")  # SPEC §13
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CONTROL_NAMES = {"\x00": "NUL", "\n": "a newline", "\r": "a carriage return", "\t": "a tab"}


def unfit_path(path: str) -> str | None:
    """Why ``path`` cannot be a job's directory, or ``None``: an ``#SBATCH`` line ends at a newline and
    cannot carry NUL, and no control character belongs in a path the script writes (every other
    character is quoted: ``"`` and ``\\`` escaped, ``%`` doubled)."""
    found = _CONTROL.search(path)
    if found is None:
        return None
    name = _CONTROL_NAMES.get(found.group(), f"the control character {found.group()!r}")
    return f"must not contain {name} (at character {found.start()}): an #SBATCH line cannot carry it"


class Ssh(Model, frozen=True):
    """How the ``ssh`` transport reaches the login node (the OpenSSH client, BatchMode, no trust on
    first use: ``knownHosts`` is required)."""

    json_what: ClassVar[str] = "ssh setting"

    host: Annotated[str, Meta(pattern=_HOST, description="The login node's host name or address.")]
    known_hosts: Annotated[
        AbsolutePath, Meta(description="A known_hosts file holding the login node's host key (required).")
    ]
    port: Annotated[int, Meta(ge=1, le=65535, description="The ssh port.")] = 22
    user: SlurmName | None = None
    identity_file: (
        Annotated[AbsolutePath, Meta(description="The private key to log in with (else ssh's default).")]
        | None
    ) = None


class Resources(Model, frozen=True):
    """What each node of a job asks for: ``--cpus-per-task``, ``--mem``, ``--gpus-per-node``."""

    json_what: ClassVar[str] = "resourcesPerNode setting"

    cpus: Annotated[int, Meta(ge=1, le=100_000, description="--cpus-per-task")] | None = None
    memory: (
        Annotated[
            str,
            Meta(
                pattern=_MEMORY,
                extra={"expected": 'a Slurm memory size such as "500M" or "4G"'},
                description='--mem per node, e.g. "500M", "4G"',
            ),
        ]
        | None
    ) = None
    gpus: Annotated[int, Meta(ge=0, le=1024, description="--gpus-per-node")] | None = None


class Settings(Model, frozen=True):
    """The decoded settings of the Slurm adapter, with defaults applied."""

    json_what: ClassVar[str] = "setting"

    transport: Annotated[
        Literal["local", "ssh"],
        Meta(description="local: run Slurm's commands here; ssh: run them on a login node (see ssh)."),
    ] = "local"
    ssh: Annotated[Ssh, Meta(description="The login node, for transport: ssh.")] | None = None
    slurm_conf: (
        Annotated[AbsolutePath, Meta(description="SLURM_CONF for Slurm's commands (else the environment's).")]
        | None
    ) = None
    partition: Annotated[SlurmName, Meta(description="--partition (else the cluster's default).")] | None = (
        None
    )
    account: Annotated[SlurmName, Meta(description="--account")] | None = None
    qos: Annotated[SlurmName, Meta(description="--qos")] | None = None
    workdir: (
        Annotated[
            AbsolutePath,
            Meta(
                description="A directory the login and compute nodes share: job scripts and per-node output "
                "go under it (else $HOME/.dispatch/slurm on the login node)."
            ),
        ]
        | None
    ) = None
    shared_workdir: Annotated[
        bool,
        Meta(
            description="Whether workdir is shared by every node, so dispatch/SharedCheckpoint can be offered."
        ),
    ] = True
    resources_per_node: Annotated[Resources, Meta(description="What each node asks for.")] = Resources()
    poll_interval: Annotated[
        Duration,
        Meta(
            description='How often one squeue serves every watcher of the process (e.g. "30s"); 100ms to 1h.',
            extra_json_schema={"default": DEFAULT_POLL.text},
        ),
    ] = msgspec.field(default_factory=lambda: DEFAULT_POLL)
    requeue: Annotated[
        Literal["dispatch", "slurm"],
        Meta(
            description="dispatch: jobs are submitted --no-requeue and dispatch's policy decides; slurm: "
            "Slurm may requeue a job itself (a restart in place)."
        ),
    ] = "dispatch"
    container: Annotated[
        Literal["none", "pyxis"],
        Meta(description="none: dispatch/Image is refused; pyxis: it becomes --container-image."),
    ] = "none"
    environment: Annotated[
        Literal["login", "clean"],
        Meta(
            description="The environment a job starts in. login: the user's login environment, which Slurm "
            "loads on the node at each start (--export=NONE); clean: only the user's identity (HOME, USER, "
            "LOGNAME, SHELL), the system's PATH and what dispatch sets, no profile run (faster starts)."
        ),
    ] = "login"
    behaviour_scripts: Annotated[
        bool,
        Meta(
            description="For tutorials and tests: a job whose env carries KUBESIM_SCRIPT runs that script for "
            "real instead of its command (its dispatch/Image and kubeflow/RuntimeRef are stand-ins, not used)."
        ),
    ] = False
    output_tail_lines: Annotated[
        int,
        Meta(ge=0, le=MAX_OUTPUT_TAIL_LINES, description="Output lines of a failed node kept as evidence."),
    ] = 20

    def __post_init__(self) -> None:
        check_declared(self)
        if self.transport == "ssh" and self.ssh is None:
            raise InvalidError("transport: ssh needs ssh: {host, knownHosts, ...}", path="ssh")
        if self.transport == "local" and self.ssh is not None:
            raise InvalidError("ssh is only used with transport: ssh", path="ssh")
        for path, value in (("workdir", self.workdir), ("slurmConf", self.slurm_conf)):
            if value is not None and (why := unfit_path(value)) is not None:
                raise InvalidError(why, path=path)
        if not 0.1 <= self.poll_interval <= 3600:
            raise InvalidError(
                f"{self.poll_interval.text!r} is out of range: from 100ms to 1h", path="pollInterval"
            )


def parse_settings(raw: bytes | str) -> Settings:
    """Decode the settings bytes strictly (unknown keys, nulls, duplicates and bad values refused)."""
    return Settings.from_json(load_json(raw or b"{}", what="settings"))


def schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the Slurm adapter's settings."""
    return json_schema(
        Settings,
        title="dispatch slurm adapter settings",
        description="How dispatch reaches a Slurm cluster and what its jobs ask for (docs/slurm-configuration.md).",
    )
