"""A job spec → the ``sbatch`` script of one incarnation (SPEC §13). Pure.

The script is the whole request: ``#SBATCH`` lines for what Slurm allocates, then the job's environment,
the rendezvous variables, and the command under ``srun`` on every node, each node writing its own
output file under the incarnation's directory. Whatever cannot be expressed is refused, naming it.

Nothing a user or a setting writes reaches the script unquoted: an ``#SBATCH`` value is one double-quoted
word of sbatch's own option parser (``"`` and ``\\`` escaped; it expands nothing), a path Slurm expands
patterns in has its ``%`` doubled, and the shell's part is :func:`shlex.quote`'d (a command item may hold
newlines: a multi-line ``sh -c`` script is common).
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping
from typing import Any

from dispatch.errors import InvalidError
from dispatch.execlimits import check_exec
from dispatch.model import Identity, Image, JobSpec, SharedCheckpoint
from dispatch.model.declare import key_path
from dispatch_slurm.behaviour import SCRIPT_ENV, to_shell
from dispatch_slurm.naming import comment_for, native_name
from dispatch_slurm.settings import HOLD_BASE, Settings, unfit_path

__all__ = [
    "ACCEPTED_EXTENSIONS",
    "END_FILE",
    "Request",
    "build_request",
    "end_marker",
    "job_dir",
    "node_output",
    "refusals",
    "sbatch_word",
]

ACCEPTED_EXTENSIONS = frozenset({Image.NAME, SharedCheckpoint.NAME})
MASTER_PORT_BASE = 29500
END_FILE = "ended"
"""The end marker: removed by the batch script as it starts, written as it exits (see :func:`end_marker`)."""
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

Request = dict[str, Any]


def job_dir(workdir: str, identity: Identity) -> str:
    """The directory of one incarnation's script and output (under the shared workdir)."""
    return f"{workdir.rstrip('/')}/{native_name(identity)}"


def end_marker(workdir: str, identity: Identity) -> str:
    """The file the batch script writes as it exits (whatever ends it but a SIGKILL of the script), and
    removes as it starts (a requeued job's earlier run left one): it tells the watch to ask Slurm now
    rather than at the end of the poll interval. It is never a reading — the state is Slurm's word."""
    return f"{job_dir(workdir, identity)}/{END_FILE}"


def node_output(workdir: str, identity: Identity, node: int) -> str:
    """The output file of node ``node`` (srun's ``%n``: the node's index in the job)."""
    return f"{job_dir(workdir, identity)}/node-{node}.out"


STAND_IN_NAMESPACE = "kubeflow/"


def scripted(spec: JobSpec, settings: Settings) -> bool:
    """Whether ``spec`` runs its behaviour script instead of its command (``behaviourScripts``)."""
    return settings.behaviour_scripts and SCRIPT_ENV in spec.env


def refusals(spec: JobSpec, settings: Settings, *, container_plugin: bool, shared_workdir: bool) -> list[str]:
    """Every reason this cluster cannot run ``spec`` (empty: it can)."""
    reasons = []
    for name in spec.extensions:
        if scripted(spec, settings) and (name == Image.NAME or name.startswith(STAND_IN_NAMESPACE)):
            continue  # a stand-in of a scripted job (behaviourScripts): not used
        path = key_path("extensions", name)
        if name == Image.NAME:
            if settings.container == "none":
                reasons.append(
                    f"{path}: this cluster runs jobs without containers (settings container: none); "
                    "remove the image or use a cluster with pyxis (container: pyxis)"
                )
            elif not container_plugin:
                reasons.append(f"{path}: container: pyxis is set but the cluster has no pyxis plugin")
        elif name == SharedCheckpoint.NAME:
            if not shared_workdir:
                reasons.append(f"{path}: the workdir is not shared by every node")
        else:
            # Refused, never ignored (SPEC §13): a job that asked for something it would not get.
            what = (
                "a Kubernetes-only extension (Kubeflow Trainer's), which a Slurm job file leaves out; "
                if name.startswith(STAND_IN_NAMESPACE)
                else ""
            )
            reasons.append(
                f"{path}: {what}the slurm adapter accepts {SharedCheckpoint.NAME} and, on a cluster with "
                f"pyxis (container: pyxis), {Image.NAME}"
            )
    return reasons


def sbatch_word(value: str) -> str:
    """``value`` as one argument of an ``#SBATCH`` line: sbatch's parser groups a double-quoted word
    and takes the character after a backslash as it is, and expands nothing (no shell reads the line).
    A line cannot carry a line break or NUL: those are refused where the value enters (the settings)."""
    if "\n" in value or "\r" in value or "\x00" in value:
        raise InvalidError(
            f"{value[:60]!r}: an #SBATCH line cannot carry a line break or NUL", path="workdir"
        )
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _pattern(path: str) -> str:
    """``path`` as an output file name Slurm expands ``%`` patterns in (``%%`` is a ``%``)."""
    return path.replace("%", "%%")


def _time(seconds: int) -> str:
    # Slurm keeps time limits in minutes: a limit is rounded up to the next whole minute.
    return str(max(1, math.ceil(seconds / 60)))


_TASK = 'export NODE_RANK=$SLURM_NODEID RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID; exec "$@"'
"""What each task runs before the command: its ranks from srun's variables."""


def build_request(
    spec: JobSpec,
    identity: Identity,
    settings: Settings,
    *,
    workdir: str,
    store_id: str,
    held: bool,
    preempt_partition: str | None = None,
) -> Request:
    """The native request of one incarnation: its name and comment (``metadata``), where it lives, and
    the script ``sbatch`` reads on stdin."""
    name = native_name(identity)
    comment = comment_for(identity, store_id)
    if (why := unfit_path(workdir)) is not None:
        raise InvalidError(why, path="workdir")
    directory = job_dir(workdir, identity)
    procs = spec.procs_per_node or 1
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={sbatch_word(name)}",
        f"#SBATCH --comment={sbatch_word(comment)}",
        f"#SBATCH --nodes={spec.nodes}",
        f"#SBATCH --ntasks-per-node={procs}",
        f"#SBATCH --output={sbatch_word(_pattern(directory + '/batch.out'))}",
        f"#SBATCH --chdir={sbatch_word(directory)}",
        "#SBATCH --export=NONE" if settings.environment == "login" else "#SBATCH --export=ALL",
        "#SBATCH --no-requeue" if settings.requeue == "dispatch" else "#SBATCH --requeue",
    ]
    if spec.time_limit is not None:
        lines.append(f"#SBATCH --time={_time(spec.time_limit)}")
    for flag, value in (
        ("partition", settings.partition),
        ("account", settings.account),
        ("qos", settings.qos),
    ):
        if value:
            lines.append(f"#SBATCH --{flag}={sbatch_word(value)}")
    res = settings.resources_per_node
    if res.cpus:
        lines.append(f"#SBATCH --cpus-per-task={res.cpus}")
    if res.memory:
        lines.append(f"#SBATCH --mem={res.memory}")
    if res.gpus:
        lines.append(f"#SBATCH --gpus-per-node={res.gpus}")
    if held:
        lines.append(f"#SBATCH --begin=now+{HOLD_BASE}")
    command = list(spec.command)
    if scripted(spec, settings):
        command = ["bash", "-c", to_shell(spec.env[SCRIPT_ENV], preempt_partition=preempt_partition)]
    image = spec.extensions.get(Image.NAME)
    srun_extra = ""
    if isinstance(image, Image) and not scripted(spec, settings):
        srun_extra = f" --container-image={shlex.quote(image.ref)}"
    env: dict[str, str] = {**spec.env, **identity.env()}
    checkpoint = spec.extensions.get(SharedCheckpoint.NAME)
    if isinstance(checkpoint, SharedCheckpoint):
        env["DISPATCH_CHECKPOINT_DIR"] = checkpoint.dir
    # Each task is `bash -c WRAP dispatch-task COMMAND...` with this environment: what Linux can exec.
    check_exec(["bash", "-c", _TASK, "dispatch-task", *command], env, where="a Slurm node")
    if settings.environment == "login":
        lines += ["", "# --export=NONE: the job sees its own login environment, not the submitter's."]
        lines.append(f'export PATH="${{PATH:-{_DEFAULT_PATH}}}"')
    else:
        # sbatch ran with no environment but SLURM_CONF (--export=ALL passes nothing else): the user's
        # identity from the password database, nothing of a profile's.
        lines += ["", "# environment: clean — the user's identity and the system's PATH, no login profile."]
        lines += [
            f"export PATH={_DEFAULT_PATH}",  # bash's own when none is set ends in "." (the job's directory)
            'dispatch_user="$(id -un)"',
            'IFS=: read -r _ _ _ _ _ HOME SHELL <<EOF\n$(getent passwd "$dispatch_user")\nEOF',
            'export USER="$dispatch_user" LOGNAME="$dispatch_user" HOME="${HOME:-/}" SHELL="${SHELL:-/bin/sh}"',
            "unset dispatch_user",
        ]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    node_out = shlex.quote(_pattern(directory) + "/node-%n.out")
    if spec.nodes == 1:
        # One node: every rank runs on it, and reaches it at the loopback address (no question to
        # slurmctld at each start).
        rendezvous = ["# Rendezvous: the master is this node, the only one.", "MASTER_ADDR=127.0.0.1"]
    else:
        rendezvous = [
            "# Rendezvous: the master is node 0 (the batch host, the allocation's first node), at its",
            "# NodeAddr — the address the other nodes reach it at; a NodeName (n1) need not resolve anywhere.",
            'first="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
            "MASTER_ADDR=\"$(scontrol -o show node \"$first\" 2>/dev/null | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p')\"",
            'MASTER_ADDR="${MASTER_ADDR:-$first}"',
        ]
    lines += [
        *rendezvous,
        "# The job's own MASTER_PORT (its env) if it has one, else one per job id.",
        f'MASTER_PORT="${{MASTER_PORT:-$(( {MASTER_PORT_BASE} + SLURM_JOB_ID % 20000 ))}}"',
        f"WORLD_SIZE={spec.nodes * procs}",
        f"LOCAL_WORLD_SIZE={procs}",
        "export MASTER_ADDR MASTER_PORT WORLD_SIZE LOCAL_WORLD_SIZE",
        "# The end marker: written as this script exits (its status is srun's), so the watch asks Slurm",
        "# early; Slurm's answer stays the job's state.",
        f"dispatch_end={shlex.quote(end_marker(workdir, identity))}",
        'rm -f -- "$dispatch_end"',
        """trap ': 2>/dev/null >"$dispatch_end"' EXIT""",
        f"srun --export=ALL --kill-on-bad-exit=1 --output={node_out}{srun_extra} \\",
        f"  bash -c {shlex.quote(_TASK)} dispatch-task {shlex.join(command)}",
    ]
    return {
        "metadata": {"name": name, "comment": comment},
        "directory": directory,
        "script": "\n".join(lines) + "\n",
    }


def request_of(value: Mapping[str, Any]) -> tuple[str, str, str]:
    """``(name, directory, script)`` of a prepared request, checked."""
    meta = value.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    directory, script = value.get("directory"), value.get("script")
    if not (isinstance(name, str) and isinstance(directory, str) and isinstance(script, str)):
        raise InvalidError(
            "not a Slurm request: expected metadata.name, directory and script", path="request"
        )
    return name, directory, script
