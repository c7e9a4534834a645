"""The self-subject reviews a client asks before acting (``pkg/registry/authorization/selfsubject*``,
``pkg/registry/authentication/selfsubjectreview``): answered from the caller's kubesim identity, created
and never stored."""

from __future__ import annotations

from typing import Any

from kubesim.auth import Permissions
from kubesim.errors import ApiError, bad_request

__all__ = [
    "DISCOVERY_URLS",
    "self_subject_access_review",
    "self_subject_review",
    "self_subject_rules_review",
]

# system:discovery's non-resource URLs, readable by every authenticated user
DISCOVERY_URLS = (
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/healthz",
    "/livez",
    "/openapi",
    "/openapi/*",
    "/readyz",
    "/version",
    "/version/",
)


def self_subject_review(perms: Permissions) -> dict[str, Any]:
    """SelfSubjectReview: who the caller is (kubectl auth whoami)."""
    return {
        "kind": "SelfSubjectReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "status": {"userInfo": {"username": perms.name, "groups": perms.groups}},
    }


def self_subject_rules_review(body: Any, perms: Permissions) -> dict[str, Any]:
    """SelfSubjectRulesReview: what ``perms`` may do in ``spec.namespace`` (the rules kubesim describes)."""
    spec = body.get("spec") if isinstance(body, dict) else None
    if not isinstance(spec, dict):
        spec = {}
    ns = spec.get("namespace") or None
    if ns is not None and not isinstance(ns, str):
        raise bad_request("the SelfSubjectRulesReview body is not valid: spec.namespace must be a string")
    rules = perms.describe_rules(ns)
    # system:basic-user and system:discovery, bound to every authenticated user
    rules += [
        {
            "verbs": ["create"],
            "apiGroups": ["authorization.k8s.io"],
            "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
        },
        {
            "verbs": ["create"],
            "apiGroups": ["authentication.k8s.io"],
            "resources": ["selfsubjectreviews"],
        },
    ]
    non_resource = [
        {"verbs": ["get"], "nonResourceURLs": sorted(DISCOVERY_URLS)},
    ]
    return {
        "kind": "SelfSubjectRulesReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "spec": spec,
        "status": {"resourceRules": rules, "nonResourceRules": non_resource, "incomplete": False},
    }


def self_subject_access_review(body: Any, perms: Permissions) -> dict[str, Any]:
    """SelfSubjectAccessReview: whether ``perms`` may do what ``spec`` names (kubectl auth can-i)."""
    if not isinstance(body, dict) or not isinstance(body.get("spec"), dict):
        raise ApiError(
            422,
            "Invalid",
            'SelfSubjectAccessReview.authorization.k8s.io "" is invalid: spec: Required value',
        )
    spec = body["spec"]
    ra = spec.get("resourceAttributes")
    nra = spec.get("nonResourceAttributes")
    for field, value in (("resourceAttributes", ra), ("nonResourceAttributes", nra)):
        if value is not None and not isinstance(value, dict):
            raise bad_request(
                f"the SelfSubjectAccessReview body is not valid: spec.{field} must be an object"
            )
    if ra is None and nra is None:
        raise ApiError(
            422,
            "Invalid",
            'SelfSubjectAccessReview.authorization.k8s.io "" is invalid: spec.resourceAttributes: '
            'Invalid value: "null": exactly one of nonResourceAttributes or resourceAttributes must be specified',
        )
    if ra is not None:
        group = str(ra.get("group") or "")
        resource = str(ra.get("resource") or "")
        sub = str(ra.get("subresource") or "")
        verb = str(ra.get("verb") or "")
        ns = ra.get("namespace") or None
        if group == "authorization.k8s.io" and resource == "selfsubjectaccessreviews" and verb == "create":
            allowed, reason = (
                True,
                "kubesim: every authenticated user may create selfsubjectaccessreviews",
            )
        else:
            allowed, reason = perms.decide(verb, group, resource, sub, ns)
    else:
        allowed, reason = True, "kubesim: non-resource URLs are readable by every authenticated user"
        if str((nra or {}).get("verb", "get")) not in ("get", "head"):
            allowed, reason = False, ""
    status: dict[str, Any] = {"allowed": allowed}
    if reason:
        status["reason"] = reason
    return {
        "kind": "SelfSubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "spec": spec,
        "status": status,
    }
