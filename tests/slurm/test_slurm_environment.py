"""The environment a Slurm job starts in (setting ``environment``), on every version.

- ``login`` (the default, ``--export=NONE``): Slurm loads the user's login environment on the node at each
  start (``SLURM_GET_USER_ENV``), whoever submitted — nothing of the submitting process's;
- ``clean``: sbatch runs with nothing but ``SLURM_CONF`` and ``--export=ALL``, so the job has the user's
  identity from the password database, the system's ``PATH`` and what dispatch sets — no profile runs (no
  login at each start), and nothing of the submitter's either.
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from slurm_fixtures import Site

from dispatch.backend import place
from dispatch.model import Identity, JobSpec, Observation, State
from dispatch_slurm import open_backend, parse_settings

pytestmark = pytest.mark.timeout(300)

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What bash, slurmstepd and dispatch set in every job; anything else came from a profile or a submitter.
EXPECTED = {
    "HOME", "USER", "LOGNAME", "SHELL", "PATH", "PWD", "SHLVL", "_", "OLDPWD", "HOSTNAME", "ENVIRONMENT",
    "TMPDIR", "SRUN_DEBUG", "SLURMD_DEBUG", "SLURMD_NODENAME", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
    "NODE_RANK", "RANK", "LOCAL_RANK", "MINE",
}  # fmt: skip
SLURMS = ("SLURM_", "DISPATCH_", "HYDRA_", "I_MPI_", "OMPI_MCA_", "PRTE_MCA_", "PMIX_")
"""Prefixes of what Slurm itself sets (23.11 on: the MPI launchers' bootstrap, so mpirun goes through
srun) and dispatch's own."""


async def job_env(site: Site, environment: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("SUBMITTER_ONLY", "leaked")  # the local transport's sbatch runs with this process's
    raw = {**site.settings(environment=environment)}
    backend = await open_backend(parse_settings(json.dumps(raw)))
    try:
        spec = JobSpec(command=("env",), env={"MINE": "yes"})
        h = await place(backend, spec, Identity(f"env-{environment}-{site.version}-{os.getpid()}"))
        async with asyncio.timeout(120):
            while True:
                obs = await backend.observe(h)
                if isinstance(obs, Observation) and obs.outcome.terminal:
                    break
                await asyncio.sleep(0.3)
        lines = [line async for line in backend.output(h)]
        assert obs.state is State.SUCCEEDED, (obs.outcome, lines)
        return dict(line.split("=", 1) for line in lines if "=" in line)
    finally:
        await backend.close()


async def test_a_clean_environment_is_the_users_identity_and_what_dispatch_sets(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = await job_env(site, "clean", monkeypatch)
    user = env["USER"]
    assert user and env["LOGNAME"] == user and env["HOME"].startswith("/") and env["SHELL"].startswith("/")
    assert env["PATH"] == SYSTEM_PATH  # not bash's default for an unset PATH, which ends in "."
    assert env["MINE"] == "yes" and env["DISPATCH_EPOCH"] == "1.0"
    assert "SUBMITTER_ONLY" not in env and "SLURM_GET_USER_ENV" not in env  # no login was loaded
    extra = {k for k in env if not k.startswith(SLURMS)} - EXPECTED
    assert not extra, extra


async def test_the_login_environment_is_loaded_by_slurm_not_taken_from_the_submitter(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = await job_env(site, "login", monkeypatch)
    assert env.get("SLURM_GET_USER_ENV") == "1", env  # slurmd loaded the user's login environment
    assert env["MINE"] == "yes" and "SUBMITTER_ONLY" not in env
    assert env["USER"] and env["HOME"].startswith("/")
