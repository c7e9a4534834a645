"""Session fixtures, one per test process: the local Slurm 22.05 (munge, slurmctld, three slurmd), an
sshd, and ``site``, every Slurm version the suites run on (22.05 here, 24.11 and 26.05 in Debian roots),
so a test taking ``site`` runs once per version and its id names the version (``test_x[24.11]``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from slurm_fixtures import ACCOUNTING, VERSIONS, Site, Sshd, start_root_slurm, start_slurm, start_sshd

from dispatch_slurm.localslurm import LocalSlurm


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    cluster = start_slurm(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session", params=VERSIONS)
def site(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """One cluster per version and test process (pytest keeps one version's at a time, grouping the
    tests by version); 22.05's is the ``slurm`` fixture's."""
    version: str = request.param
    if version == "22.05":
        yield Site(version, request.getfixturevalue("slurm"))
        return
    cluster = start_root_slurm(
        tmp_path_factory.mktemp(f"slurm-{version}"), version, accounting=version in ACCOUNTING
    )
    try:
        yield Site(version, cluster)
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    try:
        yield server
    finally:
        server.stop()
