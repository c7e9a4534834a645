"""TrainJob → JobSet → Jobs → pods → kubelet, end to end through the store on a ManualClock."""

from __future__ import annotations

import copy
from typing import Any

from kubesim.controllers.trainer import TrainerController
from kubesim.resources import CLUSTERTRAININGRUNTIMES, EVENTS, JOBSETS, PODS, SERVICES, TRAINJOBS
from kubesim.sim import Simulator

from .helpers import (
    NS,
    condition,
    jobs,
    jobset,
    main_status,
    no_controller_errors,
    pods,
    submit,
    tj,
    trainjob,
)


def new_sim(**kw: object) -> Simulator:
    return Simulator(kueue=False, **kw)  # type: ignore[arg-type]


def test_jobset_built_from_runtime() -> None:
    sim = new_sim()
    submit(sim, trainjob(nodes=2, env={"A": "1"}))
    job = tj(sim)
    js = jobset(sim)
    assert js["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "name": "tj",
            "uid": job["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    (rjob,) = js["spec"]["replicatedJobs"]
    assert rjob["replicas"] == 1
    spec = rjob["template"]["spec"]
    assert spec["parallelism"] == 2 and spec["completions"] == 2
    assert spec["completionMode"] == "Indexed"
    pod_spec = spec["template"]["spec"]
    assert pod_spec["restartPolicy"] == "OnFailure"
    (node,) = pod_spec["containers"]
    assert node["image"] == "registry.example.com/train:1"
    assert node["command"] == ["python", "train.py"]
    assert node["ports"] == [{"containerPort": 29500}]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in node["env"]}
    assert env == {
        "A": "1",
        "PET_NNODES": "2",
        "PET_NPROC_PER_NODE": "1",
        "PET_NODE_RANK": {
            "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
        },
        "PET_MASTER_ADDR": "tj-node-0-0.tj",
        "PET_MASTER_PORT": "29500",
    }
    assert sim.store.get(SERVICES, NS, "tj")["spec"]["clusterIP"] == "None"
    no_controller_errors(sim)


def test_pods_named_and_labelled_like_jobset_pods() -> None:
    sim = new_sim()
    submit(sim, trainjob(nodes=2, script="hang"))
    assert [j["metadata"]["name"] for j in jobs(sim)] == ["tj-node-0"]
    p0, p1 = pods(sim)
    assert (
        p0["metadata"]["name"].startswith("tj-node-0-0-")
        and len(p0["metadata"]["name"]) == len("tj-node-0-0-") + 5
    )
    labels = p1["metadata"]["labels"]
    assert labels["jobset.sigs.k8s.io/jobset-name"] == "tj"
    assert labels["jobset.sigs.k8s.io/replicatedjob-name"] == "node"
    assert labels["jobset.sigs.k8s.io/job-index"] == "0"
    assert labels["batch.kubernetes.io/job-completion-index"] == "1"
    assert p1["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "1"
    assert p1["spec"]["hostname"] == "tj-node-0-1" and p1["spec"]["subdomain"] == "tj"
    assert p1["status"]["phase"] == "Running" and p1["spec"]["nodeName"].startswith("node-")
    assert p0["spec"]["nodeName"] != p1["spec"]["nodeName"]  # least-allocated scoring spreads pods
    assert main_status(p1)["state"]["running"]["startedAt"] == "2026-01-01T00:00:00Z"


def test_a_pod_is_bound_in_one_update() -> None:
    """The scheduler's binding writes the node and the PodScheduled condition together, one watch event
    (the binding registry's setPodNodeAndMetadata), never a bound pod without its condition; the pod's
    generation does not move (the binding bypasses the pod's update strategy)."""
    sim = new_sim()
    events: list[tuple[str, bool, bool]] = []

    def seen(ev: Any) -> None:
        spec, status = ev.obj.get("spec") or {}, ev.obj.get("status") or {}
        scheduled = any(
            c.get("type") == "PodScheduled" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        events.append((ev.type, bool(spec.get("nodeName")), scheduled))

    sim.store.subscribe(seen, rt=PODS)
    submit(sim, trainjob(nodes=1, script="hang"))
    assert ("MODIFIED", True, False) not in events, events
    assert events[:2] == [("ADDED", False, False), ("MODIFIED", True, True)], events
    assert pods(sim)[0]["metadata"]["generation"] == 1


def test_success_with_logs() -> None:
    sim = new_sim()
    submit(
        sim,
        trainjob(nodes=2, script="print hello from {rank} of {env:PET_NNODES}; sleep 10; print bye; exit 0"),
    )
    names = [p["metadata"]["name"] for p in pods(sim)]
    assert sim.logs.lines(NS, names[1], "node") == ["hello from 1 of 2"]
    sim.advance(10)
    for p in pods(sim):
        assert p["status"]["phase"] == "Succeeded"
        assert main_status(p)["state"]["terminated"]["reason"] == "Completed"
    assert sim.logs.lines(NS, names[1], "node") == ["hello from 1 of 2", "bye"]
    assert condition(tj(sim), "Complete") is None  # the Job syncs its ended pods a batch period later
    sim.advance(1)
    done = condition(tj(sim), "Complete")
    assert done is not None
    assert (done["status"], done["reason"], done["message"]) == (
        "True",
        "AllJobsCompleted",
        "jobset completed successfully",
    )
    assert tj(sim)["status"]["jobsStatus"] == [
        {"name": "node", "ready": 0, "succeeded": 1, "failed": 0, "active": 0, "suspended": 0}
    ]
    assert jobset(sim)["status"]["terminalState"] == "Completed"
    no_controller_errors(sim)


def test_default_script_runs_five_seconds() -> None:
    sim = new_sim()
    submit(sim, trainjob())
    sim.advance(4)
    (p,) = pods(sim)
    assert p["status"]["phase"] == "Running"
    sim.advance(1)
    (p,) = pods(sim)
    assert p["status"]["phase"] == "Succeeded"
    assert condition(tj(sim), "Complete") is None  # the Job syncs its ended pods a batch period later
    sim.advance(1)
    assert condition(tj(sim), "Complete") is not None
    assert sim.logs.lines(NS, p["metadata"]["name"], "node") == ["started", "done"]


def test_exit_code_restarts_in_place_then_backoff_limit() -> None:
    sim = new_sim()
    submit(sim, trainjob(script="print boom; exit 3"))
    (p,) = pods(sim)
    st = main_status(p)
    assert st["restartCount"] == 1
    assert st["lastState"]["terminated"]["exitCode"] == 3
    assert st["lastState"]["terminated"]["reason"] == "Error"
    assert st["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert p["status"]["phase"] == "Running"
    sim.advance(2000)  # back-offs 10, 20, 40, 80, 160 s: the sixth failure reaches backoffLimit 6
    failed = condition(tj(sim), "Failed")
    assert failed is not None
    assert failed["reason"] == "FailedJobs"
    assert failed["message"] == "jobset failed due to one or more job failures (first failed job: tj-node-0)"
    job = jobs(sim)[0]
    job_failed = condition(job, "Failed")
    assert job_failed is not None and job_failed["reason"] == "BackoffLimitExceeded"
    assert job_failed["message"] == "Job has reached the specified backoff limit"
    assert pods(sim) == []  # the failed Job's pods were deleted
    no_controller_errors(sim)


def test_exit_code_with_restart_policy_never() -> None:
    sim = new_sim()
    runtime = copy.deepcopy(sim.store.get(CLUSTERTRAININGRUNTIMES, None, "torch-distributed"))
    runtime["metadata"] = {"name": "torch-never"}
    runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["backoffLimit"] = 0
    runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "restartPolicy"
    ] = "Never"
    sim.store.create(CLUSTERTRAININGRUNTIMES, runtime)
    submit(sim, trainjob(runtime="torch-never", script="exit 7"))
    assert [p["status"]["phase"] for p in pods(sim)] == ["Failed"]
    assert condition(tj(sim), "Failed") is None  # the Job syncs its failed pod a batch period later
    sim.advance(1)
    failed = condition(tj(sim), "Failed")
    assert failed is not None and failed["reason"] == "FailedJobs"
    # The Job controller's evidence outlives the pods: a Warning Event on the Job, as on a cluster.
    (ev,) = [e for e in sim.store.list(EVENTS, NS)[0] if e["reason"] == "BackoffLimitExceeded"]
    assert (ev["type"], ev["involvedObject"]["kind"], ev["involvedObject"]["name"]) == (
        "Warning",
        "Job",
        "tj-node-0",
    )
    assert ev["message"] == "Job has reached the specified backoff limit"


def test_restart_rotates_the_log() -> None:
    sim = new_sim()
    submit(sim, trainjob(script="print run at {env:PET_NNODES}; exit 1"))
    (p,) = pods(sim)
    name = p["metadata"]["name"]
    assert [x.text for x in sim.logs.previous(NS, name, "node") or []] == ["run at 1"]
    assert sim.logs.lines(NS, name, "node") == []  # waiting in CrashLoopBackOff
    sim.advance(10)
    assert sim.logs.lines(NS, name, "node") == []  # the second run printed and exited: rotated again
    assert main_status(pods(sim)[0])["restartCount"] == 2


def test_oom_shows_in_last_state() -> None:
    sim = new_sim()
    submit(sim, trainjob(script="print loading; oom"))
    st = main_status(pods(sim)[0])
    assert st["lastState"]["terminated"] == {
        "exitCode": 137,
        "reason": "OOMKilled",
        "startedAt": "2026-01-01T00:00:00Z",
        "finishedAt": "2026-01-01T00:00:00Z",
        "containerID": st["lastState"]["terminated"]["containerID"],
    }
    sim.advance(2000)
    assert condition(tj(sim), "Failed") is not None


def test_action_oom_and_exit() -> None:
    sim = new_sim()
    submit(sim, trainjob(nodes=2, script="hang"))
    p0, p1 = pods(sim)
    sim.actions.oom(NS, p0["metadata"]["name"])
    sim.settle_now()
    assert main_status(pods(sim)[0])["lastState"]["terminated"]["reason"] == "OOMKilled"
    sim.actions.exit(NS, p1["metadata"]["name"], 0)
    sim.settle_now()
    assert pods(sim)[1]["status"]["phase"] == "Succeeded"


def test_bad_script_fails_with_exit_2() -> None:
    sim = new_sim()
    submit(sim, trainjob(script="print a; dance"))
    (p,) = pods(sim)
    assert main_status(p)["lastState"]["terminated"]["exitCode"] == 2
    previous = sim.logs.previous(NS, p["metadata"]["name"], "node") or []
    assert previous[0].text.startswith("kubesim: bad behaviour script: step 2")
    no_controller_errors(sim)


def test_behaviours_api_overrides_env() -> None:
    sim = new_sim()
    sim.behaviours.set("tj-node-0-1", "print special; exit 0")
    submit(sim, trainjob(nodes=2, script="hang"))
    p0, p1 = pods(sim)
    assert p1["status"]["phase"] == "Succeeded"
    assert p0["status"]["phase"] == "Running"
    assert sim.logs.lines(NS, p1["metadata"]["name"], "node") == ["special"]


def test_deadline_fails_and_terminates_pods() -> None:
    sim = new_sim()
    submit(sim, trainjob(script="hang", activeDeadlineSeconds=30))
    sim.advance(30)
    assert condition(tj(sim), "Failed") is None
    sim.advance(1)
    failed = condition(tj(sim), "Failed")
    assert failed is not None
    assert (failed["reason"], failed["message"]) == (
        "DeadlineExceeded",
        "TrainJob exceeded its active deadline",
    )
    (p,) = pods(sim)
    assert p["metadata"].get("deletionTimestamp")  # terminating for its grace period
    sim.advance(30)
    assert pods(sim) == []
    assert condition(tj(sim), "Failed")["reason"] == "DeadlineExceeded"  # type: ignore[index]


def test_suspend_and_resume_resets_deadline() -> None:
    sim = new_sim()
    submit(sim, trainjob(script="hang", activeDeadlineSeconds=100))
    sim.advance(60)
    cur = tj(sim)
    cur["spec"]["suspend"] = True
    sim.store.replace(TRAINJOBS, cur)
    sim.settle_now()
    susp = condition(tj(sim), "Suspended")
    assert susp is not None and (susp["status"], susp["reason"], susp["message"]) == (
        "True",
        "Suspended",
        "TrainJob is suspended",
    )
    assert jobset(sim)["spec"]["suspend"] is True
    assert jobs(sim)[0]["spec"]["suspend"] is True
    assert condition(jobset(sim), "Suspended")["reason"] == "SuspendedJobs"  # type: ignore[index]
    sim.advance(30)
    assert pods(sim) == []
    cur = tj(sim)
    cur["spec"]["suspend"] = False
    sim.store.replace(TRAINJOBS, cur)
    sim.advance(1)
    resumed = condition(tj(sim), "Suspended")
    assert resumed is not None and (resumed["status"], resumed["reason"]) == ("False", "Resumed")
    assert len(pods(sim)) == 1
    sim.advance(98)  # 100 s from the resume, not from creation
    assert condition(tj(sim), "Failed") is None
    sim.advance(3)
    assert condition(tj(sim), "Failed")["reason"] == "DeadlineExceeded"  # type: ignore[index]


def test_no_jobset_update_while_running() -> None:
    sim = new_sim()
    submit(sim, trainjob(script="hang"))
    before = jobset(sim)["metadata"]["resourceVersion"]
    cur = tj(sim)
    cur["metadata"].setdefault("labels", {})["touched"] = "yes"
    sim.store.replace(TRAINJOBS, cur)
    sim.settle_now()
    assert jobset(sim)["spec"] == sim.store.get(JOBSETS, NS, "tj")["spec"]
    assert jobset(sim)["metadata"]["resourceVersion"] != "" and before


def test_deleted_pods_linger_for_grace_period() -> None:
    sim = new_sim()
    submit(sim, trainjob(script="hang"))
    sim.store.delete(TRAINJOBS, NS, "tj")
    sim.settle_now()
    (p,) = sim.store.list(PODS, NS)[0]
    assert p["metadata"]["deletionTimestamp"] == "2026-01-01T00:00:30Z"
    assert p["status"]["phase"] == "Running"
    sim.advance(29)
    assert len(sim.store.list(PODS, NS)[0]) == 1
    sim.advance(1)
    assert sim.store.list(PODS, NS)[0] == []


def test_slow_stop() -> None:
    sim = new_sim()
    submit(sim, trainjob(script="slow-stop 12; hang"))
    sim.store.delete(TRAINJOBS, NS, "tj")
    sim.advance(11)
    assert len(sim.store.list(PODS, NS)[0]) == 1
    sim.advance(1)
    assert sim.store.list(PODS, NS)[0] == []


def test_image_pull_errors() -> None:
    sim = new_sim()
    submit(sim, trainjob(image="registry.invalid/team/train:1"))
    (p,) = pods(sim)
    st = main_status(p)
    assert st["state"]["waiting"]["reason"] == "ErrImagePull"
    assert "lookup registry.invalid: no such host" in st["state"]["waiting"]["message"]
    assert p["status"]["phase"] == "Pending"
    sim.advance(1)
    assert main_status(pods(sim)[0])["state"]["waiting"]["reason"] == "ImagePullBackOff"
    sim.advance(600)
    assert main_status(pods(sim)[0])["state"]["waiting"]["reason"] in ("ErrImagePull", "ImagePullBackOff")
    assert condition(tj(sim), "Failed") is None  # a pull error never fails the job on its own


def test_invalid_image_name() -> None:
    sim = new_sim()
    submit(sim, trainjob(image="Bad Image"))
    st = main_status(pods(sim)[0])
    assert st["state"]["waiting"]["reason"] == "InvalidImageName"


def test_unschedulable_message() -> None:
    sim = new_sim()
    submit(sim, trainjob(resources={"requests": {"cpu": "20"}}))
    (p,) = pods(sim)
    sched = condition(p, "PodScheduled")
    assert sched is not None
    assert (sched["status"], sched["reason"]) == ("False", "Unschedulable")
    assert sched["message"] == (
        "0/4 nodes are available: 4 Insufficient cpu. preemption: 0/4 nodes are available: "
        "4 No preemption victims found for incoming pod."
    )
    assert any(e["reason"] == "FailedScheduling" for e in sim.store.list(EVENTS, NS)[0])


def test_node_selector_mismatch_message() -> None:
    sim = new_sim()
    patch = {
        "manager": "example.com/x",
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {"spec": {"template": {"spec": {"nodeSelector": {"pool": "gpu"}}}}},
                        }
                    ]
                }
            }
        },
    }
    submit(sim, trainjob(runtimePatches=[patch]))
    sched = condition(pods(sim)[0], "PodScheduled")
    assert sched is not None
    assert sched["message"] == (
        "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector. preemption: 0/4 nodes are "
        "available: 4 Preemption is not helpful for scheduling."
    )


def test_gated_pods_are_never_scheduled() -> None:
    sim = new_sim()
    patch = {
        "manager": "example.com/probe",
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {
                                "spec": {
                                    "template": {"spec": {"schedulingGates": [{"name": "example.com/gate"}]}}
                                }
                            },
                        }
                    ]
                }
            }
        },
    }
    submit(sim, trainjob(nodes=2, runtimePatches=[patch]))
    sim.advance(3600)
    for p in pods(sim):
        assert "nodeName" not in p["spec"]
        sched = condition(p, "PodScheduled")
        assert sched is not None
        assert (sched["status"], sched["reason"], sched["message"]) == (
            "False",
            "SchedulingGated",
            "Scheduling is blocked due to non-empty scheduling gates",
        )
    # Deleting gated pods is immediate: they never ran.
    sim.store.delete(TRAINJOBS, NS, "tj")
    sim.settle_now()
    assert sim.store.list(PODS, NS)[0] == []


def test_preempt_verb_guarded_by_env() -> None:
    sim = new_sim()
    submit(
        sim, trainjob(script="print up; env:DISPATCH_EPOCH=1.0: preempt; hang", env={"DISPATCH_EPOCH": "1.0"})
    )
    # The Job replaces the preempted (terminating) pod at once; the replacement runs the same script.
    preempted = [p for p in sim.store.list(PODS, NS)[0] if condition(p, "DisruptionTarget")]
    assert len(preempted) >= 1
    dt = condition(preempted[0], "DisruptionTarget")
    assert dt is not None and (dt["status"], dt["reason"]) == ("True", "PreemptionByScheduler")
    assert dt["message"] == "default-scheduler: preempting to accommodate a higher priority pod"
    assert preempted[0]["metadata"].get("deletionTimestamp")
    submit(
        sim,
        trainjob(
            "other", script="print up; env:DISPATCH_EPOCH=1.0: preempt; hang", env={"DISPATCH_EPOCH": "2.0"}
        ),
    )
    (q,) = pods(sim, "other")
    assert condition(q, "DisruptionTarget") is None


def test_evict_and_node_pressure() -> None:
    sim = new_sim()
    submit(sim, trainjob(nodes=2, script="hang"))
    p0, p1 = pods(sim)
    sim.actions.evict(NS, p0["metadata"]["name"])
    got = sim.store.get(PODS, NS, p0["metadata"]["name"])
    assert condition(got, "DisruptionTarget")["reason"] == "EvictionByEvictionAPI"  # type: ignore[index]
    sim.actions.node_pressure_evict(NS, p1["metadata"]["name"])
    got = sim.store.get(PODS, NS, p1["metadata"]["name"])
    assert got["status"]["phase"] == "Failed" and got["status"]["reason"] == "Evicted"
    assert got["status"]["message"].startswith("The node was low on resource: memory.")
    assert condition(got, "DisruptionTarget")["reason"] == "TerminationByKubelet"  # type: ignore[index]


def test_node_loss() -> None:
    sim = new_sim()
    submit(sim, trainjob(script="hang"))
    (p,) = pods(sim)
    node = p["spec"]["nodeName"]
    sim.actions.lose_node(node)
    sim.settle_now()
    from kubesim.resources import NODES

    ready = condition(sim.store.get(NODES, None, node), "Ready")
    assert ready is not None and ready["status"] == "Unknown"
    sim.advance(299)
    assert condition(sim.store.get(PODS, NS, p["metadata"]["name"]), "DisruptionTarget") is None
    sim.advance(1)
    got = sim.store.get(PODS, NS, p["metadata"]["name"])
    dt = condition(got, "DisruptionTarget")
    assert dt is not None and dt["reason"] == "DeletionByTaintManager"
    sim.advance(30)
    names = [x["metadata"]["name"] for x in sim.store.list(PODS, NS)[0]]
    assert p["metadata"]["name"] not in names
    (replacement,) = sim.store.list(PODS, NS)[0]
    assert replacement["spec"]["nodeName"] != node


def test_jobset_failure_policy_restarts() -> None:
    sim = new_sim()
    runtime = copy.deepcopy(sim.store.get(CLUSTERTRAININGRUNTIMES, None, "torch-distributed"))
    runtime["metadata"] = {"name": "torch-restarts"}
    runtime["spec"]["template"]["spec"]["failurePolicy"] = {"maxRestarts": 1}
    rjob = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    rjob["backoffLimit"] = 0
    sim.store.create(CLUSTERTRAININGRUNTIMES, runtime)
    submit(sim, trainjob(runtime="torch-restarts", script="exit 1"))
    sim.advance(100)
    js = jobset(sim)
    assert js["status"]["restarts"] == 1
    failed = condition(js, "Failed")
    assert failed is not None and failed["reason"] == "ReachedMaxRestarts"
    assert condition(tj(sim), "Failed")["message"] == "jobset failed due to reaching max number of restarts"  # type: ignore[index]


def test_unsupported_runtime_without_webhook() -> None:
    from kubesim.controllers import default_controllers

    ctrls = [TrainerController(webhooks=False) if c.name == "trainer" else c for c in default_controllers()]
    sim = Simulator(kueue=False, controllers=ctrls)
    from kubesim import fixtures

    fixtures.install(sim)
    body = trainjob()
    body["spec"]["runtimeRef"]["kind"] = "FancyRuntime"
    submit(sim, body)
    failed = condition(tj(sim), "Failed")
    assert failed is not None
    assert (failed["reason"], failed["message"]) == (
        "TrainingRuntimeNotSupported",
        "unsupported runtime: FancyRuntime.trainer.kubeflow.org",
    )


def test_build_failure_is_only_an_event() -> None:
    sim = new_sim()
    submit(sim, trainjob(suspend=True))
    sim.store.delete(CLUSTERTRAININGRUNTIMES, None, "torch-distributed")
    sim.store.delete(JOBSETS, NS, "tj")
    cur = tj(sim)
    cur.setdefault("metadata", {}).setdefault("annotations", {})["poke"] = "1"
    sim.store.replace(TRAINJOBS, cur)
    sim.settle_now()
    events = [e for e in sim.store.list(EVENTS, NS)[0] if e["reason"] == "TrainJobResourcesCreationFailed"]
    assert events, "expected an Event"
    assert events[-1]["type"] == "Warning"
    assert events[-1]["message"] == (
        "TrainJob resources reconciliation failed: not found ClusterTrainingRuntime specified in TrainJob: "
        'ClusterTrainingRuntime.trainer.kubeflow.org "torch-distributed" not found'
    )
    assert condition(tj(sim), "Failed") is None


def _never_runtime(sim: Simulator, name: str, **job_spec: object) -> None:
    runtime = copy.deepcopy(sim.store.get(CLUSTERTRAININGRUNTIMES, None, "torch-distributed"))
    runtime["metadata"] = {"name": name}
    tmpl = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    tmpl.update(job_spec)
    tmpl["template"]["spec"]["restartPolicy"] = "Never"
    sim.store.create(CLUSTERTRAININGRUNTIMES, runtime)


def test_replacement_pods_back_off() -> None:
    sim = new_sim()
    _never_runtime(sim, "torch-never6")
    submit(sim, trainjob(runtime="torch-never6", script="exit 1"))
    assert [p["status"]["phase"] for p in pods(sim)] == ["Failed"]
    sim.advance(9)
    assert len(pods(sim)) == 1
    sim.advance(1)
    assert len(pods(sim)) == 2  # 10 s after the first failure
    sim.advance(19)
    assert len(pods(sim)) == 2
    sim.advance(1)
    assert len(pods(sim)) == 3  # then 20 s


def test_replacement_back_off_is_capped_at_ten_minutes() -> None:
    """Back-offs 10, 20, 40, 80, 160, 320 s, then 640 s capped at upstream's MaxJobPodFailureBackOff."""
    sim = new_sim()
    _never_runtime(sim, "torch-never10", backoffLimit=10)
    submit(sim, trainjob(runtime="torch-never10", script="exit 1"))
    sim.advance(630)  # the seventh pod, created and failed at 630 s
    assert len(pods(sim)) == 7
    sim.advance(599)
    assert len(pods(sim)) == 7
    sim.advance(1)
    assert len(pods(sim)) == 8


def test_pod_failure_policy_fail_job_and_ignore() -> None:
    sim = new_sim()
    policy = {
        "rules": [
            {"action": "FailJob", "onExitCodes": {"containerName": "node", "operator": "In", "values": [42]}},
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        ]
    }
    _never_runtime(sim, "torch-pfp", podFailurePolicy=policy, backoffLimit=3)
    submit(sim, trainjob("fail", runtime="torch-pfp", script="exit 42"))
    sim.advance(1)  # the Job syncs its failed pod a batch period later
    job = jobs(sim, "fail")[0]
    failed = condition(job, "Failed")
    assert failed is not None and failed["reason"] == "PodFailurePolicy"
    assert failed["message"].startswith("Container node for pod default/fail-node-0-0-")
    assert failed["message"].endswith("failed with exit code 42 matching FailJob rule at index 0")
    assert condition(tj(sim, "fail"), "Failed")["reason"] == "FailedJobs"  # type: ignore[index]

    submit(sim, trainjob("pre", runtime="torch-pfp", script="hang"))
    (p,) = pods(sim, "pre")
    sim.actions.preempt(NS, p["metadata"]["name"])
    sim.settle_now()
    assert [x for x in pods(sim, "pre") if not x["metadata"].get("deletionTimestamp")] == []
    sim.advance(1)  # the Job syncs the pod's deletion a batch period later
    # Ignored: not counted, replaced at that sync.
    assert "failed" not in jobs(sim, "pre")[0]["status"]  # omitempty: 0 is not written
    assert len([x for x in pods(sim, "pre") if not x["metadata"].get("deletionTimestamp")]) == 1


def test_custom_nodes_and_restore() -> None:
    from kubesim import fixtures
    from kubesim.resources import NODES

    gpu = fixtures.make_node(
        "gpu-a", {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "8", "pods": "10"}, labels={"pool": "gpu"}
    )
    sim = Simulator(kueue=False, nodes=[gpu])
    assert [n["metadata"]["name"] for n in sim.store.list(NODES)[0]] == ["gpu-a"]
    submit(
        sim,
        trainjob(script="print a; sleep 10; print b; exit 0", resources={"limits": {"nvidia.com/gpu": "8"}}),
    )
    (p,) = pods(sim)
    assert p["spec"]["nodeName"] == "gpu-a"
    sim.actions.lose_node("gpu-a")
    sim.advance(20)  # the kubelet is gone: the script does not advance
    assert sim.logs.lines(NS, p["metadata"]["name"], "node") == ["a"]
    sim.actions.restore_node("gpu-a")
    sim.settle_now()
    assert condition(sim.store.get(NODES, None, "gpu-a"), "Ready")["status"] == "True"  # type: ignore[index]
    assert "taints" not in sim.store.get(NODES, None, "gpu-a")["spec"]
    assert sim.logs.lines(NS, p["metadata"]["name"], "node") == ["a", "b"]
    sim.advance(1)  # the Job syncs its ended pod a batch period later
    assert condition(tj(sim), "Complete") is not None
