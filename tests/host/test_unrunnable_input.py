"""What no cluster can run is refused where it enters, with the path: NUL in the command, NUL and line
breaks in the environment, a job id that reads as a command-line option, an opaque extension value
that is not JSON. Values that would otherwise be stored and then fail on the cluster, or on read-back.
A command item may hold line breaks (a multi-line ``sh -c`` script): every adapter passes it quoted."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from dispatch import InvalidError, JobSpec
from dispatch.cli.commands import cli
from dispatch.model import Identity
from dispatch.model.extensions import Extensions, OpaqueExtension


def refused(fn: object) -> InvalidError:
    with pytest.raises(InvalidError) as info:
        fn()  # type: ignore[operator]
    return info.value


def test_a_command_item_with_nul_is_refused_with_its_index() -> None:
    err = refused(lambda: JobSpec(command=("python", "-c\x00print(1)")))
    assert err.path == "command[1]"
    assert "NUL" in err.detail


def test_a_command_item_with_line_breaks_is_accepted_and_survives_its_json_form() -> None:
    spec = JobSpec(command=("sh", "-c", "set -e\necho one\r\necho 'two'\n"))
    assert JobSpec.loads(spec.dumps()) == spec
    assert (
        JobSpec.loads('command: [sh, -c, "echo a\\necho b"]\n', format="yaml").command[2] == "echo a\necho b"
    )


@pytest.mark.parametrize("char", ["\x00", "\n", "\r"])
def test_an_env_value_with_nul_or_a_line_break_is_refused_with_its_name(char: str) -> None:
    err = refused(lambda: JobSpec(command=("x",), env={"OK": "1", "BAD": f"a{char}b"}))
    assert err.path == 'env["BAD"]'


def test_the_same_refusal_comes_from_a_document() -> None:
    err = refused(lambda: JobSpec.loads('{"command": ["x"], "env": {"A": "1\\n2"}}'))
    assert str(err).startswith('env["A"]: must not contain a newline')
    err = refused(lambda: JobSpec.loads('command: [x, "a\\0b"]\n', format="yaml"))
    assert err.path == "command[1]"


def test_tabs_and_other_text_stay_accepted() -> None:
    spec = JobSpec(command=("sh", "-c", "echo\ta ; echo 'ü'"), env={"A": "x\ty", "B": ""})
    assert JobSpec.loads(spec.dumps()) == spec


@pytest.mark.parametrize("job_id", ["-x", "--help", "-"])
def test_a_job_id_that_reads_as_an_option_is_refused(job_id: str) -> None:
    err = refused(lambda: Identity(job_id=job_id))
    assert err.path == "jobId"
    assert "must not start with '-'" in err.detail


def test_job_ids_with_inner_dashes_stay_accepted() -> None:
    assert Identity(job_id="a-b-").job_id == "a-b-"


def test_submit_refuses_such_a_job_id_and_stores_nothing(tmp_path: Path) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text("adapter: memory\nsettings: {startDelay: 0}\nstore: {sqlite: jobs.db}\n")
    jobfile = tmp_path / "job.yaml"
    jobfile.write_text("command: [x]\n")
    runner = CliRunner()
    result = runner.invoke(cli, ["--config", str(config), "submit", str(jobfile), "--job-id", "-x"])
    assert result.exit_code != 0
    assert "must not start with '-'" in result.output
    listed = runner.invoke(cli, ["--config", str(config), "list", "--json"])
    assert listed.exit_code == 0, listed.output
    assert "-x" not in listed.output


def test_an_opaque_extension_value_that_is_not_json_is_refused_when_built() -> None:
    err = refused(lambda: OpaqueExtension("acme/Thing", {"ratio": math.nan}))
    assert err.path == 'extensions["acme/Thing"].ratio'
    err = refused(lambda: OpaqueExtension("acme/Thing", [1, math.inf]))
    assert err.path == 'extensions["acme/Thing"][1]'


def test_an_opaque_extension_that_is_accepted_survives_its_json_form() -> None:
    spec = JobSpec(command=("x",), extensions=Extensions([OpaqueExtension("acme/Thing", {"a": [1.5, "b"]})]))
    assert JobSpec.loads(spec.dumps()) == spec
