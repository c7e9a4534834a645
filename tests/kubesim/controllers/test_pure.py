"""The pure deciding functions of the controllers, tested alone."""

from __future__ import annotations

import hashlib

import pytest

from kubesim import fixtures
from kubesim.controllers.job import format_indexes, pod_failure_action
from kubesim.controllers.kubelet import image_problem
from kubesim.controllers.kueue import format_amount, workload_name
from kubesim.controllers.quantity import parse_quantity, pod_requests
from kubesim.controllers.scheduler import fit_reasons, tolerates, unschedulable_message
from kubesim.controllers.smp import merge_template, upsert_by_key
from kubesim.controllers.trainjob_build import build_jobset, runtime_pod_sets

TORCH, DEEPSPEED, JAX, DISPATCH_TORCH = fixtures.runtimes()


def tj(**trainer: object) -> dict:
    return {
        "metadata": {"name": "t", "namespace": "ns", "uid": "u-1"},
        "spec": {
            "runtimeRef": {"name": "x", "kind": "ClusterTrainingRuntime", "apiGroup": "trainer.kubeflow.org"},
            "trainer": trainer,
        },
    }


@pytest.mark.parametrize(
    ("text", "value"),
    [("500m", 0.5), ("2", 2.0), ("64Gi", 64 * 2**30), ("1e3", 1000.0), ("1.5", 1.5), (3, 3.0), ("10M", 1e7)],
)
def test_parse_quantity(text: object, value: float) -> None:
    assert parse_quantity(text) == pytest.approx(value)


def test_parse_quantity_refuses_garbage() -> None:
    with pytest.raises(ValueError, match="not a resource quantity"):
        parse_quantity("lots")


def test_pod_requests_limits_count_and_init_max() -> None:
    spec = {
        "containers": [{"resources": {"limits": {"cpu": "2"}}}, {"resources": {"requests": {"cpu": "500m"}}}],
        "initContainers": [{"resources": {"requests": {"cpu": "4"}}}],
    }
    assert pod_requests(spec) == {"cpu": 4.0, "pods": 1.0}


def test_strategic_merge_by_keys() -> None:
    base = {
        "spec": {
            "containers": [{"name": "node", "image": "a", "env": [{"name": "A", "value": "1"}]}],
            "tolerations": [{"key": "x"}],
            "nodeSelector": {"a": "1"},
        }
    }
    patch = {
        "spec": {
            "containers": [
                {
                    "name": "node",
                    "env": [{"name": "B", "value": "2"}],
                    "volumeMounts": [{"name": "v", "mountPath": "/m"}],
                }
            ],
            "tolerations": [{"key": "y"}],
            "nodeSelector": {"b": "2"},
            "volumes": [{"name": "v", "emptyDir": {}}],
        }
    }
    out = merge_template(base, patch)
    (node,) = out["spec"]["containers"]
    assert node["image"] == "a"
    assert node["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    assert out["spec"]["tolerations"] == [{"key": "y"}]  # no merge key: replaced
    assert out["spec"]["nodeSelector"] == {"a": "1", "b": "2"}
    assert base["spec"]["nodeSelector"] == {"a": "1"}  # inputs untouched
    assert upsert_by_key([{"name": "A", "value": "1"}, {"name": "B"}], [{"name": "A", "value": "9"}]) == [
        {"name": "A", "value": "9"},
        {"name": "B"},
    ]


def test_build_torch_nproc_rules() -> None:
    def nproc(**trainer: object) -> str:
        js = build_jobset(tj(**trainer), TORCH)
        env = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["env"]
        return next(e["value"] for e in env if e["name"] == "PET_NPROC_PER_NODE")

    assert nproc() == "1"
    assert nproc(numProcPerNode=3) == "3"
    assert nproc(resourcesPerNode={"limits": {"nvidia.com/gpu": "2"}}) == "auto"
    assert nproc(resourcesPerNode={"requests": {"cpu": "6"}}) == "6"


def test_build_deepspeed_counts_and_mpi_env() -> None:
    sets = {ps.name: ps.count for ps in runtime_pod_sets(tj(numNodes=4), DEEPSPEED)}
    assert sets == {"node": 3, "launcher": 1}  # runLauncherAsNode: the launcher is one of the nodes
    js = build_jobset(tj(numNodes=4), DEEPSPEED)
    launcher = js["spec"]["replicatedJobs"][1]
    names = [e["name"] for e in launcher["template"]["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert "OMPI_MCA_orte_default_hostfile" in names
    vols = [v["name"] for v in launcher["template"]["spec"]["template"]["spec"]["volumes"]]
    assert vols == ["mpi-ssh-auth", "mpi-hostfile"]


def test_build_jax_env() -> None:
    js = build_jobset(tj(numNodes=3), JAX)
    env = {
        e["name"]: e.get("value")
        for e in js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0][
            "env"
        ]
    }
    assert env == {
        "JAX_NUM_PROCESSES": "3",
        "JAX_PROCESS_ID": None,
        "JAX_COORDINATOR_ADDRESS": "t-node-0-0.t:29500",
    }


def test_build_merges_runtime_patch_labels_into_jobset_metadata() -> None:
    job = tj()
    job["spec"]["runtimePatches"] = [
        {"manager": "a.io/m", "trainingRuntimeSpec": {"template": {"metadata": {"labels": {"x": "1"}}}}}
    ]
    js = build_jobset(job, TORCH)
    assert js["metadata"]["labels"] == {"x": "1"}


def test_unschedulable_message_counts_and_sorts() -> None:
    msg = unschedulable_message(
        3,
        [
            (["Insufficient cpu", "Insufficient memory"], True),
            (["node(s) had untolerated taint {a: b}"], False),
            (["Insufficient cpu"], True),
        ],
    )
    assert msg == (
        "0/3 nodes are available: 1 Insufficient memory, 1 node(s) had untolerated taint {a: b}, 2 Insufficient cpu. "
        "preemption: 0/3 nodes are available: 1 Preemption is not helpful for scheduling., "
        "2 No preemption victims found for incoming pod."
    )


def test_taints_and_fit() -> None:
    taint = {"key": "gpu", "value": "yes", "effect": "NoSchedule"}
    assert tolerates([{"key": "gpu", "operator": "Exists"}], taint)
    assert tolerates([{"operator": "Exists"}], taint)
    assert not tolerates([{"key": "gpu", "value": "no"}], taint)
    node = fixtures.make_node("n", {"cpu": "4", "memory": "8Gi", "pods": "2"})
    spec = {"containers": [{"resources": {"requests": {"cpu": "3"}}}]}
    assert fit_reasons(spec, node, {"cpu": 2.0}) == (["Insufficient cpu"], True)
    assert fit_reasons(spec, node, {"pods": 2.0}) == (["Too many pods"], True)
    assert fit_reasons({"nodeSelector": {"zone": "a"}}, node, {}) == (
        ["node(s) didn't match Pod's node affinity/selector"],
        False,
    )


def test_format_indexes() -> None:
    # orderedIntervals.String: three or more in a row as a range, a pair as two numbers
    assert format_indexes([0, 1, 2, 5, 7, 8]) == "0-2,5,7,8"
    assert format_indexes([1, 0]) == "0,1"
    assert format_indexes([]) == ""


def test_pod_failure_action_matching() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ns"},
        "status": {
            "containerStatuses": [{"name": "node", "state": {"terminated": {"exitCode": 3}}}],
            "conditions": [],
        },
    }
    policy = {
        "rules": [
            {"action": "Ignore", "onExitCodes": {"operator": "NotIn", "values": [3]}},
            {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}},
        ]
    }
    action, message = pod_failure_action(policy, pod)
    assert action == "FailJob"
    assert message == "Container node for pod ns/p failed with exit code 3 matching FailJob rule at index 1"
    assert pod_failure_action(None, pod) == ("Count", "")


def test_image_problems() -> None:
    assert image_problem("pytorch/pytorch:2.13.0") is None
    assert image_problem("registry.example.com:5000/team/train@sha256:" + "a" * 64) is None
    reason, message = image_problem("registry.invalid/team/train:1") or ("", "")
    assert reason == "ErrImagePull" and "lookup registry.invalid: no such host" in message
    assert (image_problem("Team/Train") or ("",))[0] == "InvalidImageName"
    assert (image_problem("") or ("",))[0] == "InvalidImageName"


def test_workload_name_matches_kueue_hash() -> None:
    expected = hashlib.sha1(b"TrainJob\ntrainer.kubeflow.org\nmy-job\nuid-1").hexdigest()[:5]
    assert workload_name("my-job", "uid-1") == f"trainjob-my-job-{expected}"


def test_format_amount() -> None:
    assert format_amount("cpu", 8) == "8"
    assert format_amount("cpu", 0.5) == "500m"
    assert format_amount("memory", 64 * 2**30) == "64Gi"
    assert format_amount("memory", 1000) == "1000"
