"""What kubectl needs from the API beyond CRUD: job selectors, pod defaults, gated pods (issue 13)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kubesim import Simulator
from kubesim.errors import ApiError
from kubesim.resources import JOBS, PODS

from .test_kubectl import KUBECTL, kubectl

pytestmark = pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl is not installed")


def job(name: str, script: str, *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    template_meta: dict[str, Any] = {}
    if labels is not None:
        template_meta["labels"] = labels
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": template_meta,
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox:1.36",
                            "env": [{"name": "KUBESIM_SCRIPT", "value": script}],
                        }
                    ],
                },
            },
        },
    }


async def test_logs_of_a_job_are_its_own_pods(tmp_path: Path) -> None:
    async with Simulator(tls=True, kueue=False) as sim:
        kc = sim.write_kubeconfig(tmp_path / "kc")
        a = sim.store.create(JOBS, job("job-a", "print from-a; hang"))
        sim.store.create(JOBS, job("job-b", "print from-b; hang", labels={"team": "x"}))
        await sim.settle()
        sim.advance(30)
        uid = a["metadata"]["uid"]
        assert a["spec"]["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
        assert a["spec"]["template"]["metadata"]["labels"] == {
            "batch.kubernetes.io/controller-uid": uid,
            "batch.kubernetes.io/job-name": "job-a",
            "controller-uid": uid,
            "job-name": "job-a",
        }
        assert "labels" not in a["metadata"]  # its template had none when the job was defaulted
        b = sim.store.get(JOBS, "default", "job-b")
        assert b["metadata"]["labels"]["team"] == "x"
        assert b["metadata"]["labels"]["batch.kubernetes.io/job-name"] == "job-b"
        for name, other in (("job-a", "from-b"), ("job-b", "from-a")):
            code, out, err = await kubectl(kc, "logs", f"job/{name}")
            assert code == 0, err
            assert out.strip() == f"from-{name[-1]}" and other not in out
        code, out, err = await kubectl(kc, "describe", "job", "job-a")
        assert code == 0, err
        assert f"batch.kubernetes.io/controller-uid={uid}" in out


async def test_pod_defaults_and_scheduling_gated(tmp_path: Path) -> None:
    async with Simulator(controllers=[], tls=True) as sim:
        kc = sim.write_kubeconfig(tmp_path / "kc")
        manifest = tmp_path / "pods.yaml"
        manifest.write_text(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n"
            "  containers: [{name: c, image: nginx, ports: [{containerPort: 80}]}]\n"
            "---\napiVersion: v1\nkind: Pod\nmetadata: {name: gated}\nspec:\n"
            "  schedulingGates: [{name: example.com/wait}]\n"
            "  containers: [{name: c, image: 'busybox:1.36'}]\n"
        )
        code, _, err = await kubectl(kc, "create", "-f", str(manifest))
        assert code == 0, err
        web = sim.store.get(PODS, "default", "web")
        spec = web["spec"]
        assert spec["securityContext"] == {}
        assert spec["restartPolicy"] == "Always" and spec["dnsPolicy"] == "ClusterFirst"
        assert spec["terminationGracePeriodSeconds"] == 30
        assert spec["schedulerName"] == "default-scheduler" and spec["enableServiceLinks"] is True
        c = spec["containers"][0]
        assert c["ports"] == [{"containerPort": 80, "protocol": "TCP"}]
        assert c["imagePullPolicy"] == "Always"  # untagged: latest
        assert c["terminationMessagePath"] == "/dev/termination-log"
        assert c["terminationMessagePolicy"] == "File" and c["resources"] == {}
        gated = sim.store.get(PODS, "default", "gated")
        assert gated["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent"
        (cond,) = gated["status"]["conditions"]
        assert (cond["type"], cond["status"], cond["reason"]) == ("PodScheduled", "False", "SchedulingGated")
        code, out, err = await kubectl(kc, "get", "pod", "gated", "--no-headers")
        assert code == 0, err
        assert out.split()[2] == "SchedulingGated"
        code, out, err = await kubectl(kc, "get", "pod", "web", "-o", "json")
        assert code == 0, err
        assert json.loads(out)["spec"]["securityContext"] == {}


async def test_impersonation_whoami_and_rules(tmp_path: Path) -> None:
    async with Simulator(controllers=[], tls=True) as sim:
        kc = sim.write_kubeconfig(tmp_path / "kc")
        ro = sim.write_kubeconfig(tmp_path / "ro", token="readonly")
        code, out, err = await kubectl(kc, "auth", "whoami", "-o", "json")
        assert code == 0, err
        assert json.loads(out)["status"]["userInfo"] == {
            "username": "admin",
            "groups": ["system:authenticated"],
        }
        # --as: the admin may impersonate; the impersonated identity's rules decide
        code, out, _ = await kubectl(kc, "auth", "can-i", "delete", "trainjobs", "--as=readonly")
        assert out.strip() == "no" and code != 0
        code, out, _ = await kubectl(kc, "auth", "can-i", "delete", "trainjobs")
        assert out.strip() == "yes" and code == 0
        code, out, err = await kubectl(kc, "auth", "whoami", "--as=readonly")
        assert code == 0 and "readonly" in out, err
        code, _, err = await kubectl(kc, "create", "configmap", "x", "--as=readonly")
        assert code != 0 and 'User "readonly" cannot create resource "configmaps"' in err
        # a user kubesim does not know is authenticated but has no rules
        code, out, _ = await kubectl(kc, "auth", "can-i", "get", "pods", "--as=stranger")
        assert out.strip() == "no"
        # the read-only identity may not impersonate anybody
        code, _, err = await kubectl(ro, "get", "pods", "--as=admin")
        assert code != 0
        assert (
            'users "admin" is forbidden: User "readonly" cannot impersonate resource "users" '
            'in API group "" at the cluster scope' in err
        )
        # can-i --list: SelfSubjectRulesReview
        code, out, err = await kubectl(ro, "auth", "can-i", "--list")
        assert code == 0, err
        lines = [ln.split() for ln in out.splitlines()]
        assert ["*.*", "[]", "[]", "[get", "list", "watch]"] in lines
        assert any(ln[:1] == ["selfsubjectreviews.authentication.k8s.io"] for ln in lines)
        assert ["[/version]", "[]", "[get]"] in lines
        code, out, err = await kubectl(kc, "auth", "can-i", "--list", "--as=stranger")
        assert code == 0, err
        assert "*.*" not in out


async def test_explain_reads_the_served_schemas(tmp_path: Path) -> None:
    async with Simulator(controllers=[], tls=True) as sim:
        kc = sim.write_kubeconfig(tmp_path / "kc")
        code, out, err = await kubectl(kc, "explain", "trainjob.spec.trainer")
        assert code == 0, err
        assert "KIND:       TrainJob" in out
        for field in ("numNodes\t<integer>", "image\t<string>", "env\t<[]Object>", "resourcesPerNode"):
            assert field in out, field
        code, out, err = await kubectl(kc, "explain", "pod.spec.containers.ports")
        assert code == 0, err
        assert "containerPort\t<integer> -required-" in out and "protocol\t<string>" in out
        code, out, err = await kubectl(kc, "explain", "workloads.spec.podSets")
        assert code == 0 and "count\t<integer>" in out, err
        # the schemas do not turn kubectl's client-side apply of a custom resource into a strategic patch
        manifest = tmp_path / "tj.yaml"
        manifest.write_text(
            "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: t}\n"
            "spec:\n  runtimeRef: {name: torch-distributed}\n  trainer: {numNodes: 1}\n"
        )
        assert (await kubectl(kc, "apply", "-f", str(manifest)))[0] == 0
        manifest.write_text(
            manifest.read_text().replace("metadata: {name: t}", "metadata: {name: t, labels: {a: b}}")
        )
        code, _, err = await kubectl(kc, "apply", "-f", str(manifest))
        assert code == 0, err  # a strategic merge patch would be a 415 for a custom resource
        assert sim.requests.filter(verb="patch", status=200)


async def test_kubectl_debug_adds_an_ephemeral_container(tmp_path: Path) -> None:
    async with Simulator(controllers=[], tls=True) as sim:
        kc = sim.write_kubeconfig(tmp_path / "kc")
        code, _, err = await kubectl(kc, "run", "web", "--image=nginx")
        assert code == 0, err
        code, _, err = await kubectl(kc, "debug", "web", "--image=busybox:1.36", "-c", "dbg")
        assert code == 0, err
        code, _, err = await kubectl(
            kc, "debug", "web", "--image=busybox:1.36", "-c", "dbg2", "--profile=restricted"
        )
        assert code == 0, err
        eph = sim.store.get(PODS, "default", "web")["spec"]["ephemeralContainers"]
        assert [c["name"] for c in eph] == ["dbg", "dbg2"]
        assert eph[0]["terminationMessagePolicy"] == "File"  # container defaults apply
        assert eph[1]["securityContext"]["runAsNonRoot"] is True
        # an existing ephemeral container may not be changed or removed
        pod = sim.store.get(PODS, "default", "web")
        pod["spec"]["ephemeralContainers"] = eph[1:]
        with pytest.raises(ApiError, match="may not be changed"):
            sim.store.replace(PODS, pod, subresource="ephemeralcontainers")
