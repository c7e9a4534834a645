"""Authentication, authorization, SSAR, fault injection and the request log, over real HTTP."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import aiohttp
import pytest
from lightkube import AsyncClient
from lightkube.config.kubeconfig import KubeConfig
from lightkube.core.exceptions import ApiError as LkApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap

from kubesim import Permissions, Rule, Simulator
from kubesim.resources import CONFIGMAPS, NAMESPACES

from .conftest import Raw, TrainJob, configmap, trainjob

CM = "/api/v1/namespaces/default/configmaps"
SSAR = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


def ssar(verb: str, resource: str, group: str = "", namespace: str | None = "default") -> dict[str, object]:
    attrs: dict[str, object] = {"verb": verb, "resource": resource, "group": group}
    if namespace:
        attrs["namespace"] = namespace
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attrs},
    }


async def test_no_credentials_is_system_anonymous_and_forbidden(sim: Simulator) -> None:
    """A real server (anonymous auth on, as by default) authenticates a request without credentials as
    system:anonymous; RBAC then refuses it (403) except the public-info paths."""
    async with aiohttp.ClientSession() as session:
        anon = Raw(sim, session, None)
        code, body, _ = await anon.request("GET", CM)
        assert code == 403 and body["reason"] == "Forbidden"
        assert body["message"] == (
            'configmaps is forbidden: User "system:anonymous" cannot list resource "configmaps" '
            'in API group "" in the namespace "default"'
        )
        code, body, _ = await anon.request("POST", CM, configmap("c"))
        assert code == 403 and not sim.store.exists(CONFIGMAPS, "default", "c")
        code, body, _ = await anon.request("GET", "/apis")
        assert code == 403
        assert body["message"] == 'forbidden: User "system:anonymous" cannot get path "/apis"'
        code, _, _ = await anon.request("POST", SSAR, ssar("list", "pods"))
        assert code == 403
        for path in ("/version", "/healthz", "/readyz", "/livez"):
            assert (await anon.request("GET", path))[0] == 200, path
        assert sim.requests.filter(identity="system:anonymous", status=403)
    async with Simulator(controllers=[], anonymous_auth=False) as strict, aiohttp.ClientSession() as session:
        assert (await Raw(strict, session, None).request("GET", CM))[0] == 401


async def test_wrong_token_is_401(sim: Simulator) -> None:
    async with aiohttp.ClientSession() as session:
        for token in ("not-a-token",):
            code, body, _ = await Raw(sim, session, token).request("GET", CM)
            assert code == 401
            assert body == {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": "Unauthorized",
                "reason": "Unauthorized",
                "code": 401,
            }


async def test_readonly_reads_but_cannot_write(sim: Simulator, raw: Raw) -> None:
    ro = Raw(sim, raw.session, sim.token("readonly"))
    assert (await ro.request("GET", CM))[0] == 200
    code, body, _ = await ro.request("POST", CM, configmap("c"))
    assert code == 403 and body["reason"] == "Forbidden"
    assert body["message"] == (
        'configmaps is forbidden: User "readonly" cannot create resource "configmaps" in API group "" '
        'in the namespace "default"'
    )
    code, body, _ = await ro.request(
        "DELETE", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/x"
    )
    assert code == 403 and 'trainjobs.trainer.kubeflow.org "x" is forbidden' in body["message"]
    assert sim.requests.writes(identity="readonly") and all(
        r.status == 403 for r in sim.requests.writes("readonly")
    )


async def test_custom_identity_rules(tmp_path: Path) -> None:
    viewer = Permissions.custom(
        "team-a-editor",
        [
            Rule.of(["get", "list", "watch", "create"], "trainer.kubeflow.org", "trainjobs", "team-a"),
            Rule.of("get", "", ["pods", "pods/log"], "team-a"),
        ],
    )
    async with Simulator(controllers=[], tokens={"team-a-token": viewer}) as sim:
        sim.store.create(NAMESPACES, {"metadata": {"name": "team-a"}})
        async with aiohttp.ClientSession() as session:
            r = Raw(sim, session, "team-a-token")
            base = "/apis/trainer.kubeflow.org/v1alpha1/namespaces"
            assert (await r.request("POST", f"{base}/team-a/trainjobs", trainjob("t", "team-a")))[0] == 201
            assert (await r.request("POST", f"{base}/default/trainjobs", trainjob("t")))[0] == 403
            assert (await r.request("DELETE", f"{base}/team-a/trainjobs/t"))[0] == 403
            assert (await r.request("GET", "/api/v1/namespaces/team-a/configmaps"))[0] == 403
            code, out, _ = await r.request(
                "POST", SSAR, ssar("create", "trainjobs", "trainer.kubeflow.org", "team-a")
            )
            assert code == 201 and out["status"]["allowed"] is True
            code, out, _ = await r.request(
                "POST", SSAR, ssar("delete", "trainjobs", "trainer.kubeflow.org", "team-a")
            )
            assert out["status"]["allowed"] is False
        assert sim.token("team-a-editor") == "team-a-token"


async def test_ssar_answers_from_the_callers_permissions(sim: Simulator, raw: Raw) -> None:
    code, out, _ = await raw.request("POST", SSAR, ssar("create", "trainjobs", "trainer.kubeflow.org"))
    assert code == 201 and out["status"]["allowed"] is True and out["status"]["reason"]
    ro = Raw(sim, raw.session, sim.token("readonly"))
    _, out, _ = await ro.request("POST", SSAR, ssar("create", "trainjobs", "trainer.kubeflow.org"))
    assert out["status"] == {"allowed": False}
    _, out, _ = await ro.request("POST", SSAR, ssar("watch", "trainjobs", "trainer.kubeflow.org"))
    assert out["status"]["allowed"] is True
    _, out, _ = await ro.request("POST", SSAR, ssar("get", "pods"))
    assert out["status"]["allowed"] is True


async def test_readonly_client_sent_no_writes(sim: Simulator, tmp_path: Path) -> None:
    sim.store.create(CONFIGMAPS, configmap("a"))
    cfg = KubeConfig.from_file(sim.write_kubeconfig(tmp_path / "ro", token="readonly"))
    client = AsyncClient(config=cfg)
    try:
        assert [c.metadata.name async for c in client.list(ConfigMap, namespace="default")] == ["a"]
        await client.get(ConfigMap, "a", namespace="default")
    finally:
        await client.close()
    assert sim.requests.writes() == []
    assert {r.identity for r in sim.requests} == {"readonly"}


async def test_token_never_in_logs_reprs_or_errors(
    sim: Simulator, raw: Raw, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    tokens = [sim.token("admin"), sim.token("readonly")]
    await raw.request("POST", CM, configmap("a"))
    ro = Raw(sim, raw.session, tokens[1])
    _, body, _ = await ro.request("POST", CM, configmap("b"))
    texts = [repr(sim), repr(sim.auth), repr(sim.requests), repr(sim.server), caplog.text, str(body)]
    texts += [repr(r) for r in sim.requests]
    for t in tokens:
        assert all(t not in text for text in texts)


async def test_fault_429_with_retry_after_then_recovers(sim: Simulator, raw: Raw) -> None:
    sim.faults.fail_next(2, 429, verb="create", retry_after=3)
    code, body, headers = await raw.request("POST", CM, configmap("a"))
    assert code == 429 and headers["Retry-After"] == "3" and body["reason"] == "TooManyRequests"
    assert body["details"] == {"retryAfterSeconds": 3}
    assert (await raw.request("GET", CM))[0] == 200  # not a create: unaffected
    assert (await raw.request("POST", CM, configmap("a")))[0] == 429
    assert (await raw.request("POST", CM, configmap("a")))[0] == 201


async def test_fault_500_by_path(sim: Simulator, raw: Raw) -> None:
    sim.faults.fail_next(1, 500, path=r"/trainjobs")
    assert (await raw.request("GET", CM))[0] == 200
    code, body, _ = await raw.request(
        "GET", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs"
    )
    assert code == 500 and body["reason"] == "InternalError"
    assert sim.faults.injected == 1


async def test_fault_latency_delays_requests(sim: Simulator, raw: Raw) -> None:
    sim.faults.set_latency(0.2)
    t0 = time.monotonic()
    assert (await raw.request("GET", CM))[0] == 200
    assert time.monotonic() - t0 >= 0.2  # a lower bound only: sleeping never ends early
    sim.faults.clear()
    assert sim.faults.latency == 0


async def test_lightkube_sees_429_as_api_error(sim: Simulator, client: AsyncClient) -> None:
    sim.faults.fail_next(1, 429)
    with pytest.raises(LkApiError) as ei:
        await client.create(TrainJob(trainjob("a")))
    assert ei.value.status.code == 429


async def test_request_log_records_verbs(sim: Simulator, raw: Raw) -> None:
    await raw.request("POST", CM, configmap("a"))
    await raw.request("GET", CM + "/a")
    await raw.request("GET", CM)
    await raw.request("PATCH", CM + "/a", {"data": {}}, content_type="application/merge-patch+json")
    await raw.request("DELETE", CM + "/a")
    recs = list(sim.requests)
    assert [r.verb for r in recs] == ["create", "get", "list", "patch", "delete"]
    assert [r.status for r in recs] == [201, 200, 200, 200, 200]
    assert all(r.identity == "admin" and r.resource == "configmaps" for r in recs)
    assert recs[1].name == "a" and recs[1].namespace == "default"


async def test_tls_mode_serves_https(tmp_path: Path) -> None:
    async with Simulator(controllers=[], tls=True) as sim:
        assert sim.url.startswith("https://")
        client = AsyncClient(config=KubeConfig.from_file(sim.write_kubeconfig(tmp_path / "kc")))
        try:
            await client.create(ConfigMap(metadata=ObjectMeta(name="x", namespace="default")))
            assert (await client.get(ConfigMap, "x", namespace="default")).metadata.name == "x"
        finally:
            await client.close()


async def test_request_log_is_bounded() -> None:
    async with Simulator(controllers=[], request_log_size=5) as sim, aiohttp.ClientSession() as session:
        r = Raw(sim, session, sim.token("admin"))
        await asyncio.gather(*(r.request("GET", "/version") for _ in range(12)))
        assert len(sim.requests) == 5 and sim.requests.total == 12


async def test_lost_response_commits_the_write(sim: Simulator, raw: Raw) -> None:
    sim.faults.lose_response_next(1, verb="create")
    with pytest.raises(aiohttp.ClientError):
        await raw.request("POST", CM, configmap("a"))
    assert sim.store.exists(CONFIGMAPS, "default", "a")  # the client cannot know it was created
    assert [(r.verb, r.status) for r in sim.requests] == [("create", 0)]
    assert (await raw.request("POST", CM, configmap("b")))[0] == 201


async def test_disabled_api_groups_are_not_served(raw: Raw) -> None:
    async with Simulator(controllers=[], kueue=False, disabled_groups=["jobset.x-k8s.io"]) as sim:
        r = Raw(sim, raw.session, sim.token("admin"))
        _, groups, _ = await r.request("GET", "/apis")
        names = {g["name"] for g in groups["groups"]}
        assert "kueue.x-k8s.io" not in names and "jobset.x-k8s.io" not in names
        assert "trainer.kubeflow.org" in names
        assert (await r.request("GET", "/apis/kueue.x-k8s.io/v1beta2"))[0] == 404
        assert (await r.request("GET", "/apis/kueue.x-k8s.io/v1beta2/clusterqueues"))[0] == 404
        assert (await r.request("GET", "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets"))[0] == 404


async def test_request_log_counts_bytes(sim: Simulator, raw: Raw) -> None:
    await raw.request("POST", CM, configmap("a"))
    rv = str(sim.store.resource_version - 1)
    await raw.stream_lines(CM, {"watch": "1", "resourceVersion": rv, "timeoutSeconds": "1"}, limit=1)
    create, watch = list(sim.requests)
    assert create.request_bytes > 0 and create.response_bytes > 0
    assert (
        watch.verb == "watch" and watch.response_bytes > create.response_bytes
    )  # the event wraps the object
    assert sim.requests.bytes_total()[1] == create.response_bytes + watch.response_bytes


async def test_trainer_public_configmap_readable_by_every_authenticated_user() -> None:
    """What the Kubeflow SDK's TrainerClient() reads at start (a warning when it is missing)."""
    nobody = Permissions.custom("nobody", [])
    async with Simulator(tokens={"nobody-token": nobody}) as sim, aiohttp.ClientSession() as session:
        path = "/api/v1/namespaces/kubeflow-system/configmaps/kubeflow-trainer-public"
        code, body, _ = await Raw(sim, session, "nobody-token").request("GET", path)
        assert code == 200 and body["data"]["kubeflow_trainer_version"] == "v2.3.0"
        # only that one object, only get
        code, _, _ = await Raw(sim, session, "nobody-token").request(
            "GET", "/api/v1/namespaces/kubeflow-system/configmaps"
        )
        assert code == 403
        assert (await Raw(sim, session, None).request("GET", path))[0] == 403  # anonymous: not bound
        assert (await Raw(sim, session, "nobody-token").request("DELETE", path))[0] == 403


async def test_impersonation_headers_and_rules_review(tmp_path: Path) -> None:
    team = Permissions.custom(
        "team-a",
        [Rule.of(["get", "list"], "", "pods", "team-a"), Rule.of("impersonate", "", "users")],
    )
    async with Simulator(controllers=[], tokens={"team-token": team}) as sim, aiohttp.ClientSession() as s:
        url = sim.url

        async def call(
            method: str, path: str, headers: dict[str, str], body: object = None
        ) -> tuple[int, dict]:
            h = {"Authorization": "Bearer team-token", "Content-Type": "application/json", **headers}
            async with s.request(method, url + path, headers=h, json=body) as resp:
                return resp.status, await resp.json()

        # team-a may impersonate users but not groups
        code, body = await call("GET", CM, {"Impersonate-User": "admin", "Impersonate-Group": "ops"})
        assert code == 403
        assert body["message"] == (
            'groups "ops" is forbidden: User "team-a" cannot impersonate resource "groups" '
            'in API group "" at the cluster scope'
        )
        code, body = await call("GET", CM, {"Impersonate-Group": "ops"})
        assert code == 500  # groups without a user, as the impersonation filter answers
        code, _ = await call("GET", CM, {"Impersonate-User": "admin"})
        assert code == 200
        assert sim.requests.filter(identity="admin", status=200)  # the log shows who acted
        code, body = await call(
            "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", {"Impersonate-User": "admin"}, {}
        )
        assert code == 201 and body["status"]["userInfo"]["username"] == "admin"
        # the rules review lists only the rules that apply in the namespace asked about
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview"}
        path = "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews"
        code, body = await call("POST", path, {}, {**review, "spec": {"namespace": "team-a"}})
        assert code == 201 and body["status"]["incomplete"] is False
        rules = body["status"]["resourceRules"]
        assert {"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"]} in rules
        code, body = await call("POST", path, {}, {**review, "spec": {"namespace": "default"}})
        assert {"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"]} not in body["status"][
            "resourceRules"
        ]
        async with s.post(url + "/apis/authentication.k8s.io/v1/selfsubjectreviews", json={}) as resp:
            assert resp.status == 403  # system:anonymous has no self reviews
