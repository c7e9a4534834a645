"""Label and field selectors: parsing (400 on malformed, like the apiserver) and matching.

Label selectors support equality (``=``, ``==``, ``!=``), set-based (``in``, ``notin``), existence
(``key``, ``!key``) and ``>``/``<`` on integers. Field selectors support ``=``, ``==``, ``!=`` on the
fields each resource type allows (``metadata.name``/``metadata.namespace`` everywhere, plus e.g.
``status.phase`` and ``spec.nodeName`` for pods, ``involvedObject.*`` for events).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from kubesim.errors import ApiError, bad_request
from kubesim.resources import ResourceType
from kubesim.validation import label_value_errors, qualified_name_errors

__all__ = [
    "FieldSelector",
    "LabelSelector",
    "Requirement",
    "field_selector_matches",
    "label_selector_from_dict",
    "parse_field_selector",
    "parse_label_selector",
]

_OPS = ("in", "notin", "=", "==", "!=", "exists", "!", ">", "<")


@dataclass(frozen=True)
class Requirement:
    """One label requirement: ``key op values``."""

    key: str
    op: str  # "in" | "notin" | "=" | "!=" | "exists" | "!" | ">" | "<"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.op in ("=", "in"):
            return present and labels[self.key] in self.values
        if self.op in ("!=", "notin"):
            return not present or labels[self.key] not in self.values
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if not present:
            return False
        try:
            have = int(labels[self.key])
        except ValueError:
            return False
        want = int(self.values[0])
        return have > want if self.op == ">" else have < want

    def __str__(self) -> str:
        if self.op == "exists":
            return self.key
        if self.op == "!":
            return f"!{self.key}"
        if self.op in ("in", "notin"):
            return f"{self.key} {self.op} ({','.join(self.values)})"
        return f"{self.key}{self.op}{self.values[0]}"


@dataclass(frozen=True)
class LabelSelector:
    """A conjunction of requirements; the empty selector matches everything."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        lab = labels or {}
        return all(r.matches(lab) for r in self.requirements)

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)


class _Lexer:
    """Tokenizer following apimachinery's label lexer: identifiers, operators, ( ) , and whitespace."""

    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0

    def _skip_ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i] in " \t\r\n":
            self.i += 1

    def peek(self) -> tuple[str, str]:
        save = self.i
        tok = self.next()
        self.i = save
        return tok

    def next(self) -> tuple[str, str]:
        """Returns (kind, text): kind in {"id", "op", "(", ")", ",", "end"}."""
        self._skip_ws()
        if self.i >= len(self.s):
            return ("end", "")
        c = self.s[self.i]
        if c in "(),":
            self.i += 1
            return (c, c)
        for op in ("==", "!=", "=", "!", ">", "<"):
            if self.s.startswith(op, self.i):
                self.i += len(op)
                return ("op", op)
        j = self.i
        while j < len(self.s) and self.s[j] not in " \t\r\n(),=!<>":
            j += 1
        word = self.s[self.i : j]
        self.i = j
        if word in ("in", "notin"):
            return ("op", word)
        return ("id", word)


def _err(selector: str, detail: str) -> ApiError:
    return bad_request(f"unable to parse requirement: {detail}")


def _check_key(selector: str, key: str) -> None:
    errs = qualified_name_errors(key)
    if errs:
        raise _err(selector, f'key: Invalid value: "{key}": {"; ".join(errs)}')


def _check_value(selector: str, value: str) -> None:
    errs = label_value_errors(value)
    if errs:
        raise _err(selector, f'values[0][{value}]: Invalid value: "{value}": {"; ".join(errs)}')


@lru_cache(maxsize=512)
def parse_label_selector(text: str | None) -> LabelSelector:
    """Parse a label selector string; raises ApiError 400 when malformed."""
    if text is None or not text.strip():
        return LabelSelector()
    lx = _Lexer(text)
    reqs: list[Requirement] = []
    while True:
        kind, tok = lx.next()
        if kind == "op" and tok == "!":
            kind, key = lx.next()
            if kind != "id":
                raise bad_request(f"found '{key}', expected: identifier after '!'")
            _check_key(text, key)
            reqs.append(Requirement(key, "!"))
        elif kind == "id":
            key = tok
            _check_key(text, key)
            pk, ptok = lx.peek()
            if pk in ("end", ","):
                reqs.append(Requirement(key, "exists"))
            elif pk == "op":
                lx.next()
                op = ptok
                if op in ("in", "notin"):
                    k2, t2 = lx.next()
                    if k2 != "(":
                        raise bad_request(f"found '{t2}', expected: '('")
                    values: list[str] = []
                    while True:
                        k3, t3 = lx.next()
                        if k3 == ")":
                            break
                        if k3 == "id":
                            values.append(t3)
                            k4, t4 = lx.next()
                            if k4 == ")":
                                break
                            if k4 != ",":
                                raise bad_request(f"found '{t4}', expected: ',' or ')'")
                        elif k3 == ",":
                            values.append("")  # an empty value between commas is allowed
                        else:
                            raise bad_request(f"found '{t3}', expected: ',', ')' or identifier")
                    for v in values:
                        _check_value(text, v)
                    if not values:
                        raise _err(
                            text,
                            "values: Invalid value: []: for 'in', 'notin' operators, values set can't be empty",
                        )
                    reqs.append(Requirement(key, op, tuple(sorted(set(values)))))
                elif op in ("=", "==", "!="):
                    k3, t3 = lx.peek()
                    if k3 == "id":
                        lx.next()
                        value = t3
                    elif k3 in ("end", ","):
                        value = ""
                    else:
                        raise bad_request(f"found '{t3}', expected: identifier")
                    _check_value(text, value)
                    reqs.append(Requirement(key, "!=" if op == "!=" else "=", (value,)))
                elif op in (">", "<"):
                    k3, t3 = lx.next()
                    if k3 != "id":
                        raise bad_request(f"found '{t3}', expected: identifier")
                    try:
                        int(t3)
                    except ValueError as exc:
                        raise _err(
                            text,
                            f"values[0]: Invalid value: \"{t3}\": for 'Gt', 'Lt' operators, the value must be an integer",
                        ) from exc
                    reqs.append(Requirement(key, op, (t3,)))
                else:
                    raise bad_request(f"found '{op}', expected: in, notin, =, ==, !=, gt, lt")
            else:
                raise bad_request(f"found '{ptok}', expected: in, notin, =, ==, !=, gt, lt")
        else:
            raise bad_request(f"found '{tok}', expected: !, identifier, or 'end of string'")
        kind, tok = lx.next()
        if kind == "end":
            break
        if kind != ",":
            raise bad_request(f"found '{tok}', expected: ',' or 'end of string'")
    return LabelSelector(tuple(reqs))


def label_selector_from_dict(sel: Mapping[str, Any] | None) -> LabelSelector:
    """Build a selector from a ``metav1.LabelSelector`` object (matchLabels + matchExpressions)."""
    if not sel:
        return LabelSelector()
    reqs: list[Requirement] = []
    for k, v in sorted((sel.get("matchLabels") or {}).items()):
        reqs.append(Requirement(str(k), "=", (str(v),)))
    for expr in sel.get("matchExpressions") or []:
        op = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}.get(
            expr.get("operator", "")
        )
        if op is None:
            raise bad_request(f"{expr.get('operator')!r} is not a valid label selector operator")
        reqs.append(Requirement(str(expr.get("key", "")), op, tuple(sorted(expr.get("values") or ()))))
    return LabelSelector(tuple(reqs))


# ------------------------------------------------------------------------------------------- fields

_COMMON_FIELDS = ("metadata.name", "metadata.namespace")
_EXTRA_FIELDS: dict[tuple[str, str], tuple[str, ...]] = {
    ("", "pods"): (
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    ),
    ("", "events"): (
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    ),
    ("", "namespaces"): ("status.phase",),
    ("", "nodes"): ("spec.unschedulable",),
    ("", "secrets"): ("type",),
    ("batch", "jobs"): ("status.successful",),
}


@dataclass(frozen=True)
class FieldSelector:
    """A conjunction of ``(field, op, value)`` terms, op ``=`` or ``!=``."""

    terms: tuple[tuple[str, str, str], ...] = ()

    def matches(self, obj: Mapping[str, Any]) -> bool:
        for fld, op, value in self.terms:
            have = _field_value(obj, fld)
            if (have == value) != (op == "="):
                return False
        return True

    def exact_name(self) -> str | None:
        """The name this selector pins (``metadata.name=x``), which lets a list skip a scan."""
        for fld, op, value in self.terms:
            if fld == "metadata.name" and op == "=":
                return value
        return None


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    if path == "source":
        src = obj.get("source") or {}
        return str(src.get("component", "")) if isinstance(src, dict) else ""
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, Mapping):
            return ""
        cur = cur.get(part)
        if cur is None:
            return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def parse_field_selector(rt: ResourceType, text: str | None) -> FieldSelector:
    """Parse a field selector for ``rt``; 400 on malformed or unsupported fields."""
    if text is None or not text.strip():
        return FieldSelector()
    allowed = _COMMON_FIELDS + _EXTRA_FIELDS.get((rt.group, rt.plural), ())
    terms: list[tuple[str, str, str]] = []
    for raw in _split_unescaped(text):
        part = raw.strip()
        if not part:
            continue
        for op_text, op_name in (("!=", "!="), ("==", "="), ("=", "=")):
            idx = part.find(op_text)
            if idx > 0:
                fld, value = part[:idx].strip(), part[idx + len(op_text) :].strip()
                op = op_name
                break
        else:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        if fld not in allowed:
            raise bad_request(f"field label not supported: {fld}")
        terms.append((fld, op, _unescape(value)))
    return FieldSelector(tuple(terms))


def _split_unescaped(text: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    esc = False
    for ch in text:
        if esc:
            cur.append("\\" + ch)
            esc = False
        elif ch == "\\":
            esc = True
        elif ch == ",":
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def _unescape(value: str) -> str:
    return value.replace("\\,", ",").replace("\\=", "=").replace("\\\\", "\\")


def field_selector_matches(rt: ResourceType, obj: Mapping[str, Any], text: str | None) -> bool:
    """Convenience: parse ``text`` for ``rt`` and match ``obj``."""
    return parse_field_selector(rt, text).matches(obj)
