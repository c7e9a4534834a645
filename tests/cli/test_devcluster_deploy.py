"""`kubectl apply -f deploy/` (and a PersistentVolumeClaim) works on the dev cluster (issue 24): the one
command an operator types, run by the real kubectl against the dev cluster ``dispatch dev-cluster start``
spawns; the objects are then read back over HTTP and with ``kubectl get``."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from .test_embedded import BIN, ROOT, Session

PVC = """\
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: checkpoints, namespace: default}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 10Gi}}
"""


@pytest.fixture
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    with Session(tmp_path_factory.mktemp("deploy")) as s:
        yield s


def kubectl(session: Session, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The real kubectl on the dev cluster's kubeconfig, from the repository root (``deploy/`` is relative)."""
    return subprocess.run(
        [str(BIN / "kubectl"), "--kubeconfig", str(session.dev / "kubeconfig"), *args],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def get(session: Session, path: str) -> dict[str, Any]:
    """GET ``path`` over HTTPS with the dev cluster's kubeconfig (its CA and token), as any client would."""
    cfg = yaml.safe_load((session.dev / "kubeconfig").read_text())
    cluster = cfg["clusters"][0]["cluster"]
    ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
    request = urllib.request.Request(
        cluster["server"] + path, headers={"Authorization": f"Bearer {cfg['users'][0]['user']['token']}"}
    )
    with urllib.request.urlopen(request, timeout=10, context=ssl.create_default_context(cadata=ca)) as r:
        body: dict[str, Any] = json.loads(r.read())
        return body


@pytest.mark.timeout(180)
def test_kubectl_apply_of_deploy_and_a_claim_on_the_dev_cluster(session: Session) -> None:
    assert session.run("dev-cluster", "start").returncode == 0
    done = kubectl(session, "apply", "-f", "deploy/")
    assert done.returncode == 0, done.stdout + done.stderr
    for line in (
        "namespace/dispatch-system created",
        "clusterrole.rbac.authorization.k8s.io/dispatch-admission created",
        "deployment.apps/dispatch-admission created",
        "admissioncheck.kueue.x-k8s.io/dispatch-hold created",
        "deployment.apps/dispatch-supervisor created",
        "secret/dispatch-store created",
    ):
        assert line in done.stdout, done.stdout
    done = kubectl(session, "apply", "-f", "-", stdin=PVC)
    assert done.returncode == 0 and "persistentvolumeclaim/checkpoints created" in done.stdout, done.stderr

    # Over HTTP, as the API stored them.
    ns = "/api/v1/namespaces/dispatch-system"
    assert get(session, ns)["status"]["phase"] == "Active"
    assert (
        get(session, "/apis/apps/v1/namespaces/dispatch-system/deployments/dispatch-admission")["spec"][
            "replicas"
        ]
        == 2
    )
    assert (
        get(session, "/apis/kueue.x-k8s.io/v1beta2/admissionchecks/dispatch-hold")["spec"]["controllerName"]
        == "dispatch.dev/admission"
    )
    roles = get(session, "/apis/rbac.authorization.k8s.io/v1/clusterroles")["items"]
    assert {"dispatch-admission", "dispatch-supervisor"} <= {r["metadata"]["name"] for r in roles}
    claim = get(session, "/api/v1/namespaces/default/persistentvolumeclaims/checkpoints")
    assert claim["spec"]["storageClassName"] == "standard"  # the default StorageClass's admission

    # With kubectl get, as an operator reads them; the claim binds through the default class.
    done = kubectl(session, "get", "deploy,sa,cm,secret,role", "-n", "dispatch-system", "-o", "name")
    assert done.returncode == 0, done.stderr
    for name in (
        "deployment.apps/dispatch-admission",
        "deployment.apps/dispatch-supervisor",
        "serviceaccount/dispatch-admission",
        "configmap/dispatch-supervisor",
        "role.rbac.authorization.k8s.io/dispatch-admission-leader",
    ):
        assert name in done.stdout, done.stdout
    phase = ""
    for _ in range(100):
        done = kubectl(session, "get", "pvc", "checkpoints", "-o", "jsonpath={.status.phase}")
        phase = done.stdout
        if phase == "Bound":
            break
        time.sleep(0.2)
    assert phase == "Bound", done.stderr
