"""The dev cluster heals (issue 24): a node lost by a job comes back as a new one (an autoscaler), so
``node-lost`` runs in a row never use the cluster up, and ``dev-cluster status`` names nodes that are not
Ready. Real processes: the ``dispatch`` console script and the dev cluster it starts."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from .test_embedded import Session

OUTCOME = re.compile(r"outcome: (\S+) / (\S+)\s+\((job-[0-9a-f]+)@(\d+)\.\d+\)")


@pytest.fixture
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    with Session(tmp_path_factory.mktemp("heals")) as s:
        yield s


@pytest.mark.timeout(400)
def test_four_node_lost_runs_in_a_row_then_a_fifth_job_runs(session: Session) -> None:
    # Sped up: each loss waits for the taint manager (300 simulated seconds) before the job is requeued.
    assert session.run("dev-cluster", "start", "--speed", "25").returncode == 0
    for i in range(4):
        done = session.run("run", "examples/node-lost.yaml", timeout=120)
        assert done.returncode == 0, f"run {i + 1}: {done.stdout}{done.stderr}"
        m = OUTCOME.search(done.stdout)
        assert m is not None, done.stdout
        # Incarnation 1 lost its node; incarnation 2 ran on a healthy cluster and succeeded.
        assert (m.group(1), m.group(2), m.group(4)) == ("succeeded", "none", "2"), done.stdout
        assert "failed  (node_lost)" in done.stdout
    fifth = session.run("run", "examples/hello.yaml", timeout=120)
    assert fifth.returncode == 0, fifth.stdout + fifth.stderr
    m = OUTCOME.search(fifth.stdout)
    assert m is not None and (m.group(1), m.group(4)) == ("succeeded", "1"), fifth.stdout
    nodes = session.kubectl("get", "nodes", "-o", "json")
    ready = [
        n["metadata"]["name"]
        for n in json.loads(nodes)["items"]
        if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
    ]
    assert len(ready) >= 3  # the lost nodes were replaced (at most the last one is still on its way)


@pytest.mark.timeout(120)
def test_status_names_the_nodes_that_are_not_ready(session: Session) -> None:
    assert session.run("dev-cluster", "start").returncode == 0
    done = session.run("dev-cluster", "status")
    assert done.returncode == 0, done.stderr
    assert "nodes: all Ready" in done.stdout
    # A node whose kubelet reports NotReady (written by hand, as a kubelet would).
    session.kubectl(
        "patch",
        "node",
        "node-0",
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status":{"conditions":[{"type":"Ready","status":"False","reason":"KubeletNotReady",'
        '"message":"container runtime is down"}]}}',
    )
    done = session.run("dev-cluster", "status")
    assert done.returncode == 0, done.stderr
    assert "nodes not Ready: node-0 (False: container runtime is down)" in done.stdout
    as_json = json.loads(session.run("dev-cluster", "status", "--json").stdout)
    assert as_json["unreadyNodes"] == ["node-0 (False: container runtime is down)"]
