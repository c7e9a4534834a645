"""TrainJob admission: CRD defaults/schema/CEL (422) and the Trainer and Kueue webhooks (403 denials)."""

from __future__ import annotations

import copy

import pytest

from kubesim.errors import ApiError
from kubesim.resources import CLUSTERTRAININGRUNTIMES, JOBSETS, TRAINJOBS
from kubesim.sim import Simulator

from .helpers import NS, submit, trainjob


@pytest.fixture
def sim() -> Simulator:
    return Simulator(kueue=False)


def refused(sim: Simulator, body: dict, *, dry_run: bool = False) -> ApiError:
    with pytest.raises(ApiError) as info:
        sim.store.create(TRAINJOBS, body, dry_run=dry_run)
    return info.value


def test_defaults_applied(sim: Simulator) -> None:
    body = trainjob()
    created = sim.store.create(TRAINJOBS, body)
    spec = created["spec"]
    assert spec["managedBy"] == "trainer.kubeflow.org/trainjob-controller"
    assert spec["suspend"] is False
    assert spec["runtimeRef"] == {
        "name": "torch-distributed",
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
    }
    assert "runtimePatches" not in spec  # Kueue is not installed here


def test_name_too_long_is_a_root_cel_error(sim: Simulator) -> None:
    name = "a" * 64
    err = refused(sim, trainjob(name))
    assert err.code == 422 and err.reason == "Invalid"
    assert err.message == (
        f'TrainJob.trainer.kubeflow.org "{name}" is invalid: <nil>: Invalid value: '
        "metadata.name must be no more than 63 characters"
    )
    assert err.details is not None
    assert err.details["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": "Invalid value: metadata.name must be no more than 63 characters",
            "field": "<nil>",
        }
    ]


def test_name_must_be_rfc1035(sim: Simulator) -> None:
    err = refused(sim, trainjob("1abc"))
    assert err.code == 422
    assert "<nil>: Invalid value: metadata.name must match RFC 1035 DNS label format" in err.message


def test_managed_by_values(sim: Simulator) -> None:
    err = refused(sim, trainjob(managedBy="example.com/other"))
    assert err.message.endswith(
        'spec.managedBy: Invalid value: "example.com/other": ManagedBy must be '
        "trainer.kubeflow.org/trainjob-controller or kueue.x-k8s.io/multikueue if set"
    )


def test_runtime_ref_required_skips_cel(sim: Simulator) -> None:
    body = trainjob()
    del body["spec"]["runtimeRef"]
    err = refused(sim, body)
    assert err.details is not None
    assert [c["field"] for c in err.details["causes"]] == ["spec.runtimeRef", "<nil>"]
    assert err.details["causes"][0]["message"] == "Required value"
    assert err.details["causes"][1]["message"] == (
        "Invalid value: null: some validation rules were not checked because the object was invalid; "
        "correct the existing errors to complete validation"
    )


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("trainer", "image"), "x" * 501, "spec.trainer.image: Too long: may not be more than 500 bytes"),
        (
            ("trainer", "command"),
            ["x"] * 129,
            "spec.trainer.command: Too many: 129: must have at most 128 items",
        ),
        (("trainer", "args"), ["x"] * 129, "spec.trainer.args: Too many: 129: must have at most 128 items"),
        (
            ("trainer", "env"),
            [{"name": f"E{i}", "value": "v"} for i in range(129)],
            "spec.trainer.env: Too many: 129: must have at most 128 items",
        ),
        (
            ("activeDeadlineSeconds",),
            0,
            "spec.activeDeadlineSeconds: Invalid value: 0: spec.activeDeadlineSeconds in body should be greater "
            "than or equal to 1",
        ),
        (
            ("runtimePatches",),
            [{"manager": f"example.com/m{i}"} for i in range(17)],
            "spec.runtimePatches: Too many: 17: must have at most 16 items",
        ),
    ],
)
def test_schema_limits(sim: Simulator, path: tuple[str, ...], value: object, message: str) -> None:
    body = trainjob()
    target = body["spec"]
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = value
    err = refused(sim, body)
    assert err.code == 422
    assert message in err.message


def test_duplicate_env_names(sim: Simulator) -> None:
    body = trainjob()
    body["spec"]["trainer"]["env"] = [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]
    err = refused(sim, body)
    assert 'spec.trainer.env[1]: Duplicate value: {"name":"A"}' in err.message


def test_missing_runtime_is_a_webhook_denial(sim: Simulator) -> None:
    err = refused(sim, trainjob(runtime="nope"))
    assert err.code == 403 and err.reason == "Forbidden"
    assert err.message.startswith(
        'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: spec.RuntimeRef: Invalid value:'
    )
    assert err.message.endswith(
        'ClusterTrainingRuntime.trainer.kubeflow.org "nope" not found: specified clusterTrainingRuntime must be '
        "created before the TrainJob is created"
    )


def test_dry_run_runs_the_webhooks(sim: Simulator) -> None:
    err = refused(sim, trainjob(runtime="nope"), dry_run=True)
    assert err.code == 403
    out = sim.store.create(TRAINJOBS, trainjob(), dry_run=True)
    assert out["spec"]["suspend"] is False
    with pytest.raises(ApiError):
        sim.store.get(TRAINJOBS, NS, "tj")


def test_unsupported_runtime_kind(sim: Simulator) -> None:
    body = trainjob()
    body["spec"]["runtimeRef"]["kind"] = "FancyRuntime"
    err = refused(sim, body)
    assert err.message.endswith("denied the request: unsupported runtime: FancyRuntime.trainer.kubeflow.org")


def test_reserved_torch_env(sim: Simulator) -> None:
    err = refused(sim, trainjob(env={"PET_NNODES": "2", "OK": "1", "PET_MASTER_ADDR": "x"}))
    assert err.code == 403
    assert "spec.trainer.env: Invalid value:" in err.message
    assert err.message.endswith(
        "must not have reserved envs, invalid envs configured: [PET_MASTER_ADDR PET_NNODES]"
    )


def test_reserved_mpi_env_on_deepspeed(sim: Simulator) -> None:
    err = refused(sim, trainjob(runtime="deepspeed-distributed", env={"OMPI_MCA_plm_rsh_args": "x"}))
    assert err.message.endswith("invalid envs configured: [OMPI_MCA_plm_rsh_args]")
    # The torch names mean nothing to an MPI runtime.
    sim.store.create(TRAINJOBS, trainjob("ok", runtime="deepspeed-distributed", env={"PET_NNODES": "1"}))


def test_reserved_xgboost_env(sim: Simulator) -> None:
    runtime = copy.deepcopy(sim.store.get(CLUSTERTRAININGRUNTIMES, None, "torch-distributed"))
    runtime["metadata"] = {"name": "xgboost-distributed"}
    runtime["spec"]["mlPolicy"] = {"numNodes": 1, "xgboost": {}}
    sim.store.create(CLUSTERTRAININGRUNTIMES, runtime)
    err = refused(sim, trainjob(runtime="xgboost-distributed", env={"A": "1", "DMLC_TASK_ID": "3"}))
    assert err.message.endswith(
        "spec.trainer.env[1]: Forbidden: DMLC_TASK_ID is reserved for the XGBoost runtime"
    )


def test_immutable_fields_and_mutable_suspend(sim: Simulator) -> None:
    submit(sim, trainjob(activeDeadlineSeconds=60))
    cur = sim.store.get(TRAINJOBS, NS, "tj")
    moved = copy.deepcopy(cur)
    moved["spec"]["trainer"]["numNodes"] = 3
    with pytest.raises(ApiError) as info:
        sim.store.replace(TRAINJOBS, moved)
    assert info.value.code == 422
    assert info.value.message.endswith("spec.trainer: Invalid value: field is immutable")
    moved = copy.deepcopy(cur)
    moved["spec"]["runtimeRef"]["name"] = "jax-distributed"
    with pytest.raises(ApiError) as info:
        sim.store.replace(TRAINJOBS, moved)
    assert info.value.message.endswith("spec.runtimeRef: Invalid value: field is immutable")
    moved = copy.deepcopy(cur)
    moved["spec"]["activeDeadlineSeconds"] = 90
    with pytest.raises(ApiError) as info:
        sim.store.replace(TRAINJOBS, moved)
    assert info.value.message.endswith("spec.activeDeadlineSeconds: Invalid value: 90: field is immutable")
    moved = copy.deepcopy(cur)
    moved["spec"]["suspend"] = True
    assert sim.store.replace(TRAINJOBS, moved)["spec"]["suspend"] is True


def _patch(manager: str = "example.com/dispatch", **pod_spec: object) -> dict:
    return {
        "manager": manager,
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {"name": "node", "template": {"spec": {"template": {"spec": pod_spec}}}}
                    ]
                }
            }
        },
    }


def test_runtime_patches_only_change_while_suspended(sim: Simulator) -> None:
    submit(sim, trainjob(runtimePatches=[_patch(serviceAccountName="a")]))
    cur = sim.store.get(TRAINJOBS, NS, "tj")
    assert cur["spec"]["runtimePatches"][0]["time"] == "2026-01-01T00:00:00Z"  # stamped by the defaulter
    changed = copy.deepcopy(cur)
    changed["spec"]["runtimePatches"][0] = _patch(serviceAccountName="b")
    with pytest.raises(ApiError) as info:
        sim.store.replace(TRAINJOBS, changed)
    assert info.value.code == 403
    assert info.value.message.endswith(
        "spec.runtimePatches: Forbidden: RuntimePatches can only be modified when the TrainJob is suspended "
        "before or after the update"
    )


def test_runtime_patches_allowed_while_suspended(sim: Simulator) -> None:
    submit(sim, trainjob(suspend=True, runtimePatches=[_patch(serviceAccountName="a")]))
    cur = sim.store.get(TRAINJOBS, NS, "tj")
    changed = copy.deepcopy(cur)
    changed["spec"]["runtimePatches"][0] = _patch(serviceAccountName="b")
    sim.advance(5)
    out = sim.store.replace(TRAINJOBS, changed)
    assert out["spec"]["runtimePatches"][0]["time"] == "2026-01-01T00:00:05Z"  # changed patch re-stamped


def test_runtime_patch_rules(sim: Simulator) -> None:
    err = refused(
        sim,
        trainjob(
            runtimePatches=[_patch(containers=[{"name": "node", "env": [{"name": "A", "value": "1"}]}])]
        ),
    )
    assert "must not have envs for the dataset-initializer, model-initializer, node containers" in err.message
    bad = _patch()
    bad["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["name"] = "ghost"
    err = refused(sim, trainjob(runtimePatches=[bad]))
    assert "must not have replicated job that doesn't exist in the runtime job template" in err.message
    err = refused(sim, trainjob(runtimePatches=[_patch(manager="nodomain")]))
    assert "spec.runtimePatches.manager" in err.message


def test_kueue_webhook_suspends_queued_trainjobs() -> None:
    sim = Simulator(kueue=True)
    queued = sim.store.create(TRAINJOBS, trainjob("q", labels={"kueue.x-k8s.io/queue-name": "user-queue"}))
    assert queued["spec"]["suspend"] is True
    assert queued["spec"]["runtimePatches"] == [
        {
            "manager": "kueue.x-k8s.io/manager",
            "trainingRuntimeSpec": {"template": {"spec": {}}},
            "time": "2026-01-01T00:00:00Z",
        }
    ]
    plain = sim.store.create(TRAINJOBS, trainjob("p"))
    assert plain["spec"]["suspend"] is False
    assert [p["manager"] for p in plain["spec"]["runtimePatches"]] == ["kueue.x-k8s.io/manager"]


def test_jobset_defaults() -> None:
    sim = Simulator(kueue=False, controllers=[])
    from kubesim.admission import install_webhooks

    install_webhooks(sim.store, sim.clock, kueue=False)  # JobSet's defaulter is a webhook
    js = sim.store.create(
        JOBSETS,
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": "js", "namespace": NS},
            "spec": {
                "replicatedJobs": [
                    {"name": "w", "template": {"spec": {"template": {"spec": {"containers": []}}}}}
                ]
            },
        },
    )
    rj = js["spec"]["replicatedJobs"][0]
    assert rj["groupName"] == "default" and rj["replicas"] == 1
    assert rj["template"]["spec"]["completionMode"] == "Indexed"
    assert rj["template"]["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure"
    assert js["spec"]["network"] == {"enableDNSHostnames": True, "publishNotReadyAddresses": True}
    assert js["spec"]["successPolicy"] == {"operator": "All"}


def test_runtime_defaults(sim: Simulator) -> None:
    rjob = sim.store.get(CLUSTERTRAININGRUNTIMES, None, "torch-distributed")["spec"]["template"]["spec"][
        "replicatedJobs"
    ][0]
    assert (rjob["groupName"], rjob["replicas"]) == ("default", 1)


def test_wrong_types_are_webhook_decoding_errors(sim: Simulator) -> None:
    # the mutating webhook decodes the TrainJob before the schema is checked: 400, not the schema's 422
    body = trainjob()
    body["spec"]["trainer"]["numProcPerNode"] = "auto"
    err = refused(sim, body)
    assert (err.code, err.reason) == (400, "")
    assert err.message == (
        'admission webhook "defaulter.trainjob.trainer.kubeflow.org" denied the request: json: cannot '
        "unmarshal string into Go struct field TrainJob.spec.trainer.numProcPerNode of type int32"
    )
    body = trainjob()
    body["spec"]["suspend"] = "yes"
    assert (
        "cannot unmarshal string into Go struct field TrainJob.spec.suspend of type bool"
        in refused(sim, body).message
    )


def test_wrong_types_are_schema_errors_without_the_webhooks() -> None:
    sim = Simulator(controllers=[])
    body = trainjob()
    body["spec"]["trainer"]["numNodes"] = "two"
    err = refused(sim, body)
    assert err.code == 422
    assert err.details is not None
    assert err.details["causes"][0] == {
        "reason": "FieldValueTypeInvalid",
        "message": 'Invalid value: "string": spec.trainer.numNodes in body must be of type integer: "string"',
        "field": "spec.trainer.numNodes",
    }
