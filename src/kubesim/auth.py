"""Authentication (bearer tokens) and authorization (simple RBAC-like rules) for the API server.

Identities have a ``name`` (what the request log and Forbidden messages show) and rules of
verbs x API groups x resources x namespaces. Tokens are random, kept only by the ``Authenticator``, and
never appear in a repr, log line or error.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ADMIN", "ANONYMOUS", "READONLY", "Authenticator", "Permissions", "Rule"]

ADMIN = "admin"
READONLY = "readonly"
#: The user a request without credentials is authenticated as (``--anonymous-auth``, on by default).
ANONYMOUS = "system:anonymous"
READ_VERBS = frozenset({"get", "list", "watch"})


def _fs(values: Iterable[str] | str) -> frozenset[str]:
    return frozenset([values] if isinstance(values, str) else values)


@dataclass(frozen=True)
class Rule:
    """Allow ``verbs`` on ``resources`` (``plural`` or ``plural/subresource``, ``*`` for all) of ``groups``
    (``""`` for core, ``*`` for all) in ``namespaces`` (None: everywhere, including cluster-scoped)."""

    verbs: frozenset[str]
    groups: frozenset[str] = frozenset({"*"})
    resources: frozenset[str] = frozenset({"*"})
    namespaces: frozenset[str] | None = None

    @staticmethod
    def of(
        verbs: Iterable[str] | str,
        groups: Iterable[str] | str = "*",
        resources: Iterable[str] | str = "*",
        namespaces: Iterable[str] | str | None = None,
    ) -> Rule:
        """Build a rule from strings or iterables: ``Rule.of(["get","list"], "", ["pods","pods/log"], "team")``."""
        return Rule(_fs(verbs), _fs(groups), _fs(resources), None if namespaces is None else _fs(namespaces))

    def allows(self, verb: str, group: str, resource: str, subresource: str, namespace: str | None) -> bool:
        if "*" not in self.verbs and verb not in self.verbs:
            return False
        if "*" not in self.groups and group not in self.groups:
            return False
        full = f"{resource}/{subresource}" if subresource else resource
        if "*" not in self.resources and full not in self.resources and f"{resource}/*" not in self.resources:
            return False
        if self.namespaces is not None:
            return namespace is not None and (namespace in self.namespaces or "*" in self.namespaces)
        return True

    def describe(self) -> str:
        ns = (
            "all namespaces" if self.namespaces is None else "namespaces " + ",".join(sorted(self.namespaces))
        )
        return f"verbs={sorted(self.verbs)} groups={sorted(self.groups)} resources={sorted(self.resources)} in {ns}"


@dataclass(frozen=True)
class Permissions:
    """An identity: its user ``name`` and the rules that allow its requests (deny by default)."""

    name: str
    rules: tuple[Rule, ...] = ()

    @staticmethod
    def admin(name: str = ADMIN) -> Permissions:
        """Everything, everywhere."""
        return Permissions(name, (Rule.of("*"),))

    @staticmethod
    def readonly(name: str = READONLY) -> Permissions:
        """get/list/watch on every resource (and pod logs), no writes."""
        return Permissions(name, (Rule.of(sorted(READ_VERBS)),))

    @staticmethod
    def custom(name: str, rules: Iterable[Rule]) -> Permissions:
        return Permissions(name, tuple(rules))

    @staticmethod
    def anonymous() -> Permissions:
        """``system:anonymous``: no rules (RBAC's default bindings give it only the public-info paths)."""
        return Permissions(ANONYMOUS)

    @property
    def is_anonymous(self) -> bool:
        return self.name == ANONYMOUS

    @property
    def groups(self) -> list[str]:
        """The groups the authenticator reports for this user (SelfSubjectReview)."""
        return ["system:unauthenticated"] if self.is_anonymous else ["system:authenticated"]

    def describe_rules(self, namespace: str | None) -> list[dict[str, list[str]]]:
        """The resource rules that apply in ``namespace`` (None: cluster scope), as RBAC's
        SelfSubjectRulesReview lists them."""
        out = []
        for rule in self.rules:
            if rule.namespaces is not None and (
                namespace is None or (namespace not in rule.namespaces and "*" not in rule.namespaces)
            ):
                continue
            out.append(
                {
                    "verbs": sorted(rule.verbs),
                    "apiGroups": sorted(rule.groups),
                    "resources": sorted(rule.resources),
                }
            )
        return out

    def decide(
        self, verb: str, group: str, resource: str, subresource: str = "", namespace: str | None = None
    ) -> tuple[bool, str]:
        """(allowed, reason) for one request's attributes."""
        for i, rule in enumerate(self.rules):
            if rule.allows(verb, group, resource, subresource, namespace):
                return True, f'kubesim: allowed by rule {i} of identity "{self.name}": {rule.describe()}'
        return False, ""

    def allows(
        self, verb: str, group: str, resource: str, subresource: str = "", namespace: str | None = None
    ) -> bool:
        return self.decide(verb, group, resource, subresource, namespace)[0]


class Authenticator:
    """Maps bearer tokens to identities. The tokens are generated here and never shown in reprs."""

    def __init__(self, identities: Iterable[Permissions]) -> None:
        self._by_token: dict[str, Permissions] = {}
        self._token_of: dict[str, str] = {}
        for perms in identities:
            self.add(perms)

    def __repr__(self) -> str:
        return f"Authenticator(identities={sorted(self._token_of)})"

    def add(self, perms: Permissions, token: str | None = None) -> str:
        """Register an identity (a fresh random token unless one is given); returns the token."""
        tok = token or "kubesim-" + secrets.token_urlsafe(24)
        old = self._token_of.get(perms.name)
        if old is not None:
            self._by_token.pop(old, None)
        self._by_token[tok] = perms
        self._token_of[perms.name] = tok
        return tok

    def token(self, name: str) -> str:
        """The bearer token of identity ``name``; LookupError naming the known identities otherwise."""
        tok = self._token_of.get(name)
        if tok is None:
            raise LookupError(f"no identity {name!r}; known identities: {sorted(self._token_of)}")
        return tok

    def by_name(self, name: str) -> Permissions | None:
        """The identity called ``name`` (for impersonation), or None."""
        tok = self._token_of.get(name)
        return self._by_token.get(tok) if tok is not None else None

    def identities(self) -> list[str]:
        return sorted(self._token_of)

    def authenticate(self, authorization_header: str | None) -> Permissions | None:
        """The identity for an ``Authorization: Bearer <token>`` header, or None."""
        if not authorization_header:
            return None
        scheme, _, tok = authorization_header.partition(" ")
        if scheme.lower() != "bearer" or not tok:
            return None
        tok = tok.strip()
        perms = self._by_token.get(tok)
        if perms is None:
            return None
        # constant-time confirmation (the dict lookup already matched)
        return perms if hmac.compare_digest(self._token_of[perms.name], tok) else None
