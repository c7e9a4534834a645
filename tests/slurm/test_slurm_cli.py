"""The command line on every Slurm version (``site``) with a config file naming the adapter ``slurm``: the
tutorial's Slurm section as written, a refused image, the dry run's script, and a supervised requeue
after a preemption that succeeds at incarnation 2."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from slurm_fixtures import Site

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
EXAMPLE = ROOT / "examples" / "slurm-cluster.yaml"


def config(tmp_path: Path, site: Site, *, scripts: bool = True) -> Path:
    """The example's cluster config (examples/slurm-cluster.yaml) with the site's settings in place of
    its local cluster's: the same policy, ``behaviourScripts`` as asked."""
    example = yaml.safe_load(EXAMPLE.read_text())
    settings = {**example["settings"], **site.settings(), "behaviourScripts": scripts}
    path = tmp_path / "slurm-cluster.yaml"
    path.write_text(json.dumps({**example, "settings": settings}, indent=1))  # JSON is YAML
    return path


def dispatch(tmp_path: Path, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
    env.update(DISPATCH_STATE_DIR=str(tmp_path / "state"), PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    return subprocess.run(
        ["dispatch", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240, check=False
    )


def tutorial_slurm_lines() -> list[tuple[str, int]]:
    """The ``$`` lines of docs/tutorial.md's Slurm section and the exit code each expects, but those
    starting and stopping its local cluster (the site is the cluster here)."""
    page = (ROOT / "docs" / "tutorial.md").read_text()
    section = re.split(r"^## \d+\. The same jobs on Slurm\n", page, maxsplit=1, flags=re.M)[1]
    section = section.split("\n## ", 1)[0]
    out = []
    for block in re.findall(r"```console\n(.*?)```", section, re.S):
        for line in block.splitlines():
            if line.startswith("$ ") and "dispatch_slurm.localslurm" not in line:
                expected = re.search(r"#\s*exit (\d+)\s*$", line)
                out.append((line[2:].split("  #")[0].strip(), int(expected.group(1)) if expected else 0))
    return out


def test_the_tutorials_slurm_section_runs_as_written(tmp_path: Path, site: Site) -> None:
    lines = tutorial_slurm_lines()
    assert len(lines) >= 4 and all("examples/slurm-cluster.yaml" in line for line, _ in lines), lines
    cfg = str(config(tmp_path, site))
    outputs = []
    for line, want in lines:
        args = line.replace("examples/slurm-cluster.yaml", cfg).split()
        assert args[0] == "dispatch", line
        done = dispatch(tmp_path, *args[1:])
        assert done.returncode == want, f"$ {line}\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stderr, done.stderr
        outputs.append(done.stdout)
    joined = "\n".join(outputs)
    assert "outcome: succeeded / none" in joined and "outcome: failed / exit_code" in joined, joined


def test_hello_runs_on_slurm(tmp_path: Path, site: Site) -> None:
    done = dispatch(tmp_path, "run", "examples/hello.yaml", "--config", str(config(tmp_path, site)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "outcome: succeeded / none" in done.stdout
    assert "SlurmJob/" in done.stdout and "COMPLETED exit code 0" in done.stdout


def test_an_image_without_a_container_plugin_is_refused_with_the_reason(tmp_path: Path, site: Site) -> None:
    cfg = str(config(tmp_path, site, scripts=False))
    done = dispatch(tmp_path, "submit", "--dry-run", "examples/hello.yaml", "--config", cfg)
    assert done.returncode != 0
    assert "dispatch/Image" in done.stderr and "without containers" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_dry_run_shows_the_sbatch_script(tmp_path: Path, site: Site) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("command: [python3, train.py]\nnodes: 2\ntimeLimit: 90\n")
    cfg = str(config(tmp_path, site))
    done = dispatch(tmp_path, "submit", "--dry-run", str(job), "--config", cfg)
    assert done.returncode == 0, done.stderr
    # The script itself, as sbatch reads it: bash parses it.
    assert done.stdout.startswith("#!/bin/bash\n#SBATCH --job-name="), done.stdout
    for line in ("#SBATCH --nodes=2", "#SBATCH --time=2", "#SBATCH --no-requeue", "srun "):
        assert f"\n{line}" in done.stdout, done.stdout
    assert "dispatch-task python3 train.py\n" in done.stdout
    parsed = subprocess.run(["bash", "-n"], input=done.stdout, capture_output=True, text=True, timeout=30)
    assert parsed.returncode == 0, parsed.stderr
    # -o yaml: the whole request, its script a literal block, line for line.
    as_yaml = dispatch(tmp_path, "submit", "--dry-run", str(job), "--config", cfg, "-o", "yaml")
    assert as_yaml.returncode == 0 and "script: |\n  #!/bin/bash\n" in as_yaml.stdout, as_yaml.stdout


def test_an_environment_a_slurm_task_cannot_be_given_is_refused_naming_the_limit(
    tmp_path: Path, site: Site
) -> None:
    job = tmp_path / "job.json"
    job.write_text('{"command": ["python3", "train.py"], "env": {"BIG": "%s"}}' % ("y" * 200_000))
    done = dispatch(tmp_path, "submit", str(job), "--config", str(config(tmp_path, site)))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f'error: {job}: env["BIG"]: BIG=VALUE is 200,004 bytes' in done.stderr, done.stderr
    assert "on a Slurm node may hold at most 131,071 (Linux's MAX_ARG_STRLEN)" in done.stderr


def test_a_preempted_job_is_requeued_and_succeeds_at_incarnation_2(tmp_path: Path, site: Site) -> None:
    done = dispatch(
        tmp_path,
        "run",
        "examples/preempted.yaml",
        "--job-id",
        "pre-1",
        "--config",
        str(config(tmp_path, site)),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "pre-1@1.0" in out and "PREEMPTED" in out and "failed  (preempted)" in out, out
    assert "outcome: succeeded / none  (pre-1@2.1)" in out, out


def test_logs_of_a_finished_two_node_job_print_each_node(tmp_path: Path, site: Site) -> None:
    """`dispatch logs` printed node 0, then "there is no node 1" (exit 1) once the job had ended: the
    node count came from a reading the ended job no longer had (24.11)."""
    job = tmp_path / "two.yaml"
    job.write_text("command: [sh, -c, 'echo hello from $NODE_RANK']\nnodes: 2\n")
    cfg = str(config(tmp_path, site, scripts=False))
    done = dispatch(tmp_path, "run", str(job), "--job-id", "two-nodes", "--config", cfg)
    assert done.returncode == 0, done.stdout + done.stderr
    logs = dispatch(tmp_path, "logs", "two-nodes", "--config", cfg)
    assert logs.returncode == 0, logs.stdout + logs.stderr
    assert logs.stdout.splitlines() == ["[node 0] hello from 0", "[node 1] hello from 1"], logs.stdout


def test_one_job_id_in_two_stores_is_two_jobs_each_with_its_own_output(tmp_path: Path, site: Site) -> None:
    """The record's nonce is in the Slurm job's comment and name: without it in the comment, every reading
    of a job dispatch had just started missed it (``run`` ended ``lost`` at once); without it in the name,
    a second store's job of the same id found the first's directory and was refused as its incarnation."""
    job = tmp_path / "twin.yaml"
    job.write_text("command: [sh, -c, 'echo I am $SLURM_JOB_ID']\n")
    cfg = str(config(tmp_path, site, scripts=False))
    said = []
    for store in ("one", "two"):
        home = tmp_path / store
        done = dispatch(home, "run", str(job), "--job-id", "twin", "--config", cfg)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "outcome: succeeded / none  (twin@1.0)" in done.stdout, done.stdout
        logs = dispatch(home, "logs", "twin", "--config", cfg)
        assert logs.returncode == 0, logs.stdout + logs.stderr
        said.append(logs.stdout)
    assert said[0] != said[1] and all(s.startswith("I am ") for s in said), said
