"""What a real v1.36 control plane writes that kubesim used to leave out (issue 24): Job defaults and
status, the pod admission plugins' fields, JobSet's group labels, the error bodies — over HTTP and kubectl."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kubesim import Simulator
from kubesim.resources import DEPLOYMENTS, JOBS, PODS

from .conftest import Raw
from .test_kubectl import KUBECTL, kubectl

JOBS_PATH = "/apis/batch/v1/namespaces/default/jobs"
PODS_PATH = "/api/v1/namespaces/default/pods"
TRAINJOBS_PATH = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs"
TOKEN_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def job(name: str, script: str, **spec: Any) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": "busybox:1.36",
        "env": [{"name": "KUBESIM_SCRIPT", "value": script}],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [container]}}, **spec},
    }


async def test_job_defaults_as_set_defaults_job(raw: Raw) -> None:
    code, created, _ = await raw.request("POST", JOBS_PATH, job("plain", "exit 0"))
    assert code == 201, created
    spec = created["spec"]
    assert (spec["completions"], spec["parallelism"], spec["backoffLimit"]) == (1, 1, 6)
    assert spec["completionMode"] == "NonIndexed" and spec["suspend"] is False
    assert spec["manualSelector"] is False and spec["podReplacementPolicy"] == "TerminatingOrFailed"
    template = spec["template"]["spec"]  # the pod template gets the core/v1 defaults too
    assert template["dnsPolicy"] == "ClusterFirst" and template["schedulerName"] == "default-scheduler"
    assert template["terminationGracePeriodSeconds"] == 30 and template["securityContext"] == {}
    c = template["containers"][0]
    assert (c["imagePullPolicy"], c["terminationMessagePath"], c["terminationMessagePolicy"]) == (
        "IfNotPresent",
        "/dev/termination-log",
        "File",
    )
    assert "priority" not in template and "volumes" not in template  # admission plugins act on pods only

    policy = {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}
    code, created, _ = await raw.request("POST", JOBS_PATH, job("pfp", "exit 0", podFailurePolicy=policy))
    assert code == 201, created
    assert created["spec"]["podReplacementPolicy"] == "Failed"
    assert created["spec"]["podFailurePolicy"]["rules"][0]["onPodConditions"][0]["status"] == "True"


async def test_a_job_whose_pods_would_restart_always_is_invalid(raw: Raw) -> None:
    body = job("always", "exit 0")
    del body["spec"]["template"]["spec"]["restartPolicy"]  # defaulted to Always, which a Job refuses
    code, answer, _ = await raw.request("POST", JOBS_PATH, body)
    assert code == 422, answer
    assert answer["message"] == (
        'Job.batch "always" is invalid: spec.template.spec.restartPolicy: Unsupported value: "Always": '
        'supported values: "OnFailure", "Never"'
    )


async def test_pods_get_the_admission_plugins_fields(raw: Raw) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {
            "containers": [{"name": "c", "image": "busybox:1.36"}],
            "initContainers": [{"name": "i", "image": "x:1"}],
        },
    }
    code, created, _ = await raw.request("POST", PODS_PATH, pod)
    assert code == 201, created
    spec = created["spec"]
    assert (spec["priority"], spec["preemptionPolicy"]) == (0, "PreemptLowerPriority")
    assert spec["serviceAccountName"] == spec["serviceAccount"] == "default"
    (volume,) = spec["volumes"]
    assert (
        volume["name"].startswith("kube-api-access-") and len(volume["name"]) == len("kube-api-access-") + 5
    )
    sources = volume["projected"]["sources"]
    assert volume["projected"]["defaultMode"] == 420
    assert sources[0] == {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}
    assert sources[1]["configMap"]["name"] == "kube-root-ca.crt"
    assert sources[2]["downwardAPI"]["items"][0]["fieldRef"] == {
        "apiVersion": "v1",
        "fieldPath": "metadata.namespace",
    }
    for c in spec["containers"] + spec["initContainers"]:
        assert c["volumeMounts"] == [{"name": volume["name"], "readOnly": True, "mountPath": TOKEN_MOUNT}]
    assert created["status"]["qosClass"] == "BestEffort"

    pod["metadata"]["name"] = "quiet"
    pod["spec"]["automountServiceAccountToken"] = False
    pod["spec"]["priorityClassName"] = "high"
    code, created, _ = await raw.request("POST", PODS_PATH, pod)
    assert code == 201, created
    assert "volumes" not in created["spec"] and "volumeMounts" not in created["spec"]["containers"][0]
    assert "priority" not in created["spec"]  # a named class decides (kubesim serves no PriorityClasses)


async def test_deployment_defaults(raw: Raw) -> None:
    body = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {
            "selector": {"matchLabels": {"app": "d"}},
            "template": {
                "metadata": {"labels": {"app": "d"}},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            },
        },
    }
    code, created, _ = await raw.request("POST", "/apis/apps/v1/namespaces/default/deployments", body)
    assert code == 201, created
    spec = created["spec"]
    assert (spec["replicas"], spec["revisionHistoryLimit"], spec["progressDeadlineSeconds"]) == (1, 10, 600)
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"},
    }
    assert spec["template"]["spec"]["containers"][0]["imagePullPolicy"] == "Always"
    assert created["metadata"]["generation"] == 1
    assert raw.sim.store.get(DEPLOYMENTS, "default", "d")["spec"]["replicas"] == 1


async def test_job_status_omits_zero_counts_and_formats_indexes_as_upstream() -> None:
    async with Simulator() as sim:
        indexed = job("ix", "exit 0", completionMode="Indexed", completions=2, parallelism=2)
        sim.store.create(JOBS, {**indexed, "metadata": {"name": "ix", "namespace": "default"}})
        await sim.settle()
        pods, _ = sim.store.list(PODS, namespace="default", label_selector="job-name=ix")
        assert len(pods) == 2
        for p in pods:
            env = p["spec"]["containers"][0]["env"]
            index_env = {
                "name": "JOB_COMPLETION_INDEX",
                "valueFrom": {
                    "fieldRef": {
                        "apiVersion": "v1",
                        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']",
                    }
                },
            }
            assert index_env in env
            assert p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] in ("0", "1")
        sim.advance(30)
        status = sim.store.get(JOBS, "default", "ix")["status"]
        assert status["succeeded"] == 2 and status["completedIndexes"] == "0,1"  # a pair is not a range
        assert "active" not in status and "failed" not in status  # omitempty int32s
        assert status["ready"] == 0 and status["terminating"] == 0  # pointers: written as 0

        plain = job("plain", "exit 0")
        sim.store.create(JOBS, {**plain, "metadata": {"name": "plain", "namespace": "default"}})
        await sim.settle()
        (pod,) = sim.store.list(PODS, namespace="default", label_selector="job-name=plain")[0]
        assert all(e["name"] != "JOB_COMPLETION_INDEX" for e in pod["spec"]["containers"][0]["env"])


async def test_jobset_group_labels_and_pod_priority_label() -> None:
    from kubesim.resources import JOBSETS

    pod = {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x:1"}]}}
    rjob = {"spec": {"completions": 1, "parallelism": 1, "template": pod}}
    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "js", "namespace": "default"},
        "spec": {
            "replicatedJobs": [
                {"name": "a", "replicas": 2, "groupName": "g", "template": rjob},
                {"name": "b", "replicas": 1, "template": rjob},
                {"name": "c", "replicas": 3, "groupName": "g", "template": rjob},
            ]
        },
    }
    async with Simulator(kueue=False) as sim:
        sim.store.create(JOBSETS, jobset)
        await sim.settle()
        jobs, _ = sim.store.list(
            JOBS, namespace="default", label_selector="jobset.sigs.k8s.io/jobset-name=js"
        )
        seen = {
            j["metadata"]["name"]: (
                j["metadata"]["labels"]["jobset.sigs.k8s.io/group-replicas"],
                j["metadata"]["annotations"]["jobset.sigs.k8s.io/job-group-index"],
                j["spec"]["template"]["metadata"]["labels"]["jobset.sigs.k8s.io/job-group-index"],
            )
            for j in jobs
        }
        assert seen == {
            "js-a-0": ("5", "0", "0"),
            "js-a-1": ("5", "1", "1"),
            "js-b-0": ("1", "0", "0"),
            "js-c-0": ("5", "2", "2"),
            "js-c-1": ("5", "3", "3"),
            "js-c-2": ("5", "4", "4"),
        }
        pods, _ = sim.store.list(
            PODS, namespace="default", label_selector="jobset.sigs.k8s.io/jobset-name=js"
        )
        assert pods and all(p["metadata"]["labels"]["jobset.sigs.k8s.io/priority"] == "0" for p in pods)


async def test_error_bodies_as_a_real_control_plane_words_them(tmp_path: Path) -> None:
    tj: dict[str, Any] = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "t"},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {"numNodes": 1, "numProcPerNode": "auto"},
        },
    }
    async with Simulator(tls=True) as sim:
        kc = sim.write_kubeconfig(tmp_path / "kc")
        headers = {"Authorization": f"Bearer {sim.token('admin')}", "Content-Type": "application/json"}
        import aiohttp

        async with aiohttp.ClientSession() as session:

            async def post(body: dict[str, Any], query: str = "") -> tuple[int, Any]:
                url = sim.url + TRAINJOBS_PATH + query
                async with session.post(url, data=json.dumps(body), headers=headers, ssl=False) as resp:
                    return resp.status, await resp.json()

            code, answer = await post(tj)
            assert (
                code == 400
                and answer["reason"] == ""
                and answer["message"].endswith(
                    "json: cannot unmarshal string into Go struct field TrainJob.spec.trainer.numProcPerNode of type int32"
                )
            )
            tj["spec"]["trainer"] = {"numNodes": 1, "bogus": 1}
            code, answer = await post(tj, "?fieldValidation=Strict")
            assert code == 400 and answer["message"] == (
                'TrainJob in version "v1alpha1" cannot be handled as a TrainJob: strict decoding error: '
                'unknown field "spec.trainer.bogus"'
            )
            tj["spec"] = {"runtimeRef": {"name": "x"}, "trainer": {"numNodes": 1}}
            code, answer = await post(tj)
            assert code == 403
            assert (
                'spec.RuntimeRef: Invalid value: {"name":"x","apiGroup":"trainer.kubeflow.org",'
                '"kind":"ClusterTrainingRuntime"}: ClusterTrainingRuntime.trainer.kubeflow.org "x" not found: '
                "specified clusterTrainingRuntime must be created before the TrainJob is created"
            ) in answer["message"]
        if KUBECTL.exists():  # what a person sees: kubectl sends fieldValidation=Strict
            manifest = tmp_path / "tj.yaml"
            tj["spec"] = {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 1, "nodes": 2}}
            manifest.write_text(json.dumps(tj))
            code, _, err = await kubectl(kc, "create", "-f", str(manifest))
            assert code != 0
            assert (
                'TrainJob in version "v1alpha1" cannot be handled as a TrainJob: strict decoding error' in err
            )


@pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl is not installed")
async def test_kubectl_shows_the_pod_defaults(tmp_path: Path) -> None:
    async with Simulator(controllers=[], tls=True) as sim:
        kc = sim.write_kubeconfig(tmp_path / "kc")
        code, _, err = await kubectl(kc, "run", "r", "--image=busybox:1.36", "--restart=Never")
        assert code == 0, err
        code, out, err = await kubectl(
            kc,
            "get",
            "pod",
            "r",
            "-o",
            "jsonpath={.spec.serviceAccountName} {.spec.priority} {.status.qosClass}",
        )
        assert code == 0, err
        assert out == "default 0 BestEffort"


async def test_every_namespace_has_the_default_serviceaccount_and_the_root_ca() -> None:
    from kubesim.resources import CONFIGMAPS, NAMESPACES, SERVICEACCOUNTS

    async with Simulator() as sim:
        await sim.settle()
        assert sim.store.exists(SERVICEACCOUNTS, "default", "default")
        sim.store.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}})
        await sim.settle()
        assert sim.store.exists(SERVICEACCOUNTS, "team", "default")
        ca = sim.store.get(CONFIGMAPS, "team", "kube-root-ca.crt")
        assert "kubernetes.io/description" in ca["metadata"]["annotations"] and "ca.crt" in ca["data"]
        sim.store.delete(CONFIGMAPS, "team", "kube-root-ca.crt")
        await sim.settle()
        assert sim.store.exists(CONFIGMAPS, "team", "kube-root-ca.crt")  # the publisher puts it back
