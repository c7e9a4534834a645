"""The slurm adapter's settings, opening checks and the pure script builder."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from dispatch import InvalidError, JobSpec, UnsupportedError
from dispatch.cli.config import load_config
from dispatch.model import Cause, Extensions, Identity, Image, State
from dispatch_slurm import open_backend, parse_settings, schema
from dispatch_slurm.behaviour import to_shell
from dispatch_slurm.localslurm import LocalSlurm
from dispatch_slurm.script import build_request, refusals

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        ({"transport": "rsh"}, "transport"),
        ({"pollInterval": "5 seconds"}, "pollInterval"),
        ({"pollInterval": "1ms"}, "pollInterval"),
        ({"transport": "ssh"}, "ssh"),
        ({"transport": "ssh", "ssh": {"host": "login"}}, "ssh.knownHosts"),
        ({"ssh": {"host": "login", "knownHosts": "/k"}}, "ssh"),
        ({"workdir": "relative/dir"}, "workdir"),
        ({"workdir": "/shared/x\n#SBATCH --uid=0"}, "workdir"),  # an #SBATCH line cannot carry it
        ({"workdir": "/shared/x\n"}, "workdir"),
        ({"workdir": "/shared/\x00x"}, "workdir"),
        ({"slurmConf": "/etc/slurm\r/slurm.conf"}, "slurmConf"),
        ({"resourcesPerNode": {"memory": "lots"}}, "resourcesPerNode.memory"),
        ({"partition": None}, "partition"),
        ({"parition": "gpu"}, "parition"),
    ],
)
def test_bad_settings_are_refused_naming_the_path(raw: dict[str, object], path: str) -> None:
    with pytest.raises(InvalidError) as caught:
        parse_settings(json.dumps(raw))
    assert caught.value.path == path, caught.value


def test_defaults_and_the_schema_agree() -> None:
    settings = parse_settings(b"{}")
    assert (settings.transport, settings.requeue, settings.container) == ("local", "dispatch", "none")
    assert float(settings.poll_interval) == 5.0  # SPEC §13
    jsonschema.Draft202012Validator.check_schema(schema())
    # The example's relative paths resolve from its directory, as the command line reads it.
    example = load_config(str(ROOT / "examples" / "slurm-cluster.yaml"))
    assert example.settings["slurmConf"] == str(ROOT / ".slurm" / "slurm.conf")
    jsonschema.validate(dict(example.settings), schema())
    assert schema()["additionalProperties"] is False


def test_the_configuration_page_names_every_setting() -> None:
    page = (ROOT / "docs" / "slurm-configuration.md").read_text()
    for name in schema()["properties"]:
        assert re.search(rf"`{name}`", page), f"docs/slurm-configuration.md does not describe {name}"


def test_an_image_is_refused_saying_why_without_a_container_plugin() -> None:
    spec = JobSpec(command=("train",), extensions=Extensions([Image("pytorch/pytorch:2")]))
    (reason,) = refusals(spec, parse_settings(b"{}"), container_plugin=False, shared_workdir=True)
    assert "dispatch/Image" in reason and "without containers" in reason
    (reason,) = refusals(
        spec, parse_settings(b'{"container": "pyxis"}'), container_plugin=False, shared_workdir=True
    )
    assert "no pyxis plugin" in reason
    assert (
        refusals(spec, parse_settings(b'{"container": "pyxis"}'), container_plugin=True, shared_workdir=True)
        == []
    )


def test_the_script_carries_the_identity_and_the_rendezvous() -> None:
    spec = JobSpec(
        command=("python3", "train.py", "--lr", "0.1 0.2"), nodes=2, procs_per_node=4, time_limit=61
    )
    request = build_request(
        spec, Identity("train-7"), parse_settings(b"{}"), workdir="/w", store_id="s1", held=False
    )
    script = request["script"]
    assert request["metadata"]["comment"] == "dispatch/v1 job=train-7 epoch=1.0 store=s1"
    for line in ("--nodes=2", "--ntasks-per-node=4", "--time=2", "--no-requeue", "--export=NONE"):
        assert line in script
    assert "WORLD_SIZE=8" in script and "MASTER_ADDR=" in script and "NODE_RANK=$SLURM_NODEID" in script
    assert 'MASTER_PORT="${MASTER_PORT:-$(( 29500 + SLURM_JOB_ID % 20000 ))}"' in script
    assert "'0.1 0.2'" in script  # each argument quoted once
    held = build_request(
        spec, Identity("train-7"), parse_settings(b"{}"), workdir="/w", store_id="s1", held=True
    )
    assert "--begin=now+315576000" in held["script"]


def test_settings_go_into_the_script_quoted() -> None:
    """A workdir holding `$(touch${IFS}/tmp/x)` was pasted unquoted into srun --output (the shell ran
    it) and into #SBATCH lines (spaces split them). Now an #SBATCH value is one double-quoted word of
    sbatch's parser ("" and \\ escaped), % is doubled where Slurm expands patterns, and the shell's
    part is shlex-quoted; a multi-line command item is one quoted argument."""
    odd = "/w/a b'c\"d%e#f$(touch${IFS}/tmp/x)\\g"
    spec = JobSpec(command=("sh", "-c", "echo one\necho two"))
    script = build_request(spec, Identity("q"), parse_settings(b"{}"), workdir=odd, store_id="s", held=False)[
        "script"
    ]
    name = "d-q-1-" + script.split('--job-name="d-q-1-')[1][:10]
    assert f'#SBATCH --chdir="/w/a b\'c\\"d%e#f$(touch${{IFS}}/tmp/x)\\\\g/{name}"' in script
    assert f'#SBATCH --output="/w/a b\'c\\"d%%e#f$(touch${{IFS}}/tmp/x)\\\\g/{name}/batch.out"' in script
    assert "--output='/w/a b'\"'\"'c\"d%%e#f$(touch${IFS}/tmp/x)\\g/" + name + "/node-%n.out'" in script
    assert "dispatch-task sh -c 'echo one\necho two'" in script
    with pytest.raises(InvalidError) as caught:
        build_request(spec, Identity("q"), parse_settings(b"{}"), workdir="/w/\nx", store_id="s", held=False)
    assert caught.value.path == "workdir"


def test_behaviour_scripts_become_shell() -> None:
    shell = to_shell("rank=0: print hi {rank} {env:X}; sleep 2; exit 3", preempt_partition=None)
    assert "if [ \"$NODE_RANK\" = 0 ]; then printf '%s\\n' 'hi '\"$NODE_RANK\"' '\"${X-}\"; fi" in shell
    assert "sleep 2" in shell and "exit 3" in shell
    with pytest.raises(UnsupportedError, match="lose-node"):
        to_shell("lose-node", preempt_partition="urgent")
    with pytest.raises(UnsupportedError, match="PriorityTier"):
        to_shell("preempt", preempt_partition=None)
    with pytest.raises(InvalidError):
        to_shell("fly away", preempt_partition=None)


async def test_opening_refuses_an_unknown_partition_naming_those_that_exist(slurm: LocalSlurm) -> None:
    raw = {"slurmConf": str(slurm.conf), "partition": "gpu"}
    with pytest.raises(InvalidError) as caught:
        await open_backend(parse_settings(json.dumps(raw)))
    assert caught.value.path == "partition"
    assert "batch" in str(caught.value) and "urgent" in str(caught.value)


async def test_the_cluster_identity_is_read_from_the_cluster(slurm: LocalSlurm) -> None:
    backend = await open_backend(parse_settings(json.dumps({"slurmConf": str(slurm.conf)})), read_only=True)
    conf = slurm.conf.read_text()
    name = re.search(r"^ClusterName=(\S+)", conf, re.M)
    port = re.search(r"^SlurmctldPort=(\d+)", conf, re.M)
    assert name and port
    assert backend.cluster_id.startswith(f"slurm:{name.group(1)}@") and backend.cluster_id.endswith(
        port.group(1)
    )
    caps = await backend.capabilities()
    assert caps.read_only and caps.holds and caps.watch and caps.cessation and caps.output
    assert "dispatch/Image" not in caps.extensions
    await backend.close()


async def test_a_spec_the_cluster_cannot_run_is_refused_by_slurm_itself(slurm: LocalSlurm) -> None:
    """capabilities(spec) and a read-only prepare (a dry run, validate) ask ``sbatch --test-only`` about
    the exact script: more memory per node than any node has is refused with Slurm's reason, and nothing
    is created. A writable prepare (a submit) does not: the submit's own sbatch refuses it."""
    raw = {
        "slurmConf": str(slurm.conf),
        "workdir": str(slurm.workdir),
        "resourcesPerNode": {"memory": "100G"},
    }
    backend = await open_backend(parse_settings(json.dumps(raw)))
    before = [o.handle for o in await backend.list()]
    with pytest.raises(UnsupportedError) as caught:
        await backend.capabilities(JobSpec(command=("true",)))
    assert "Slurm would not run it" in str(caught.value) and "not available" in str(caught.value)
    assert [o.handle for o in await backend.list()] == before
    with pytest.raises(UnsupportedError, match="partition 'batch' has at most 3"):
        await backend.capabilities(JobSpec(command=("true",), nodes=4))
    asked = backend.transport.counts.get("sbatch", 0)
    prepared = await backend.prepare(JobSpec(command=("true",)), Identity("too-big"))
    assert backend.transport.counts.get("sbatch", 0) == asked  # no --test-only for a submit
    with pytest.raises(UnsupportedError, match="Slurm refused the job"):
        await backend.start(prepared)
    # 22.05 keeps a record of the refused job (FAILED/BadConstraints): it reads as refused, never ran.
    left = [o for o in await backend.list() if o.handle not in before]
    assert all((o.state, o.cause) == (State.FAILED, Cause.INVALID_SPEC) for o in left), left
    await backend.close()
    reader = await open_backend(parse_settings(json.dumps(raw)), read_only=True)
    try:
        with pytest.raises(UnsupportedError, match="Slurm would not run it"):
            await reader.prepare(JobSpec(command=("true",)), Identity("too-big-dry"))
    finally:
        await reader.close()
