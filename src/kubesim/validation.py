"""Object-metadata validation as the apiserver does it (names, label and annotation syntax).

Pure functions returning ``Cause`` lists, so the store and selector parser share the same rules and
messages (worded like apimachinery's validation package).
"""

from __future__ import annotations

import re
from typing import Any

from kubesim.errors import Cause

__all__ = [
    "DNS1035_LABEL_MSG",
    "DNS1123_LABEL_MSG",
    "DNS1123_SUBDOMAIN_MSG",
    "is_dns1035_label",
    "is_dns1123_label",
    "is_dns1123_subdomain",
    "label_value_errors",
    "qualified_name_errors",
    "validate_metadata",
]

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

DNS1123_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start "
    "and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
DNS1123_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and "
    "must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
DNS1035_LABEL_MSG = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic "
    "character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for "
    "validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)
_QUALIFIED_NAME_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
    "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and "
    "must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', "
    "regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
TOTAL_ANNOTATION_SIZE_LIMIT = 256 * 1024


def is_dns1123_label(s: str) -> bool:
    return len(s) <= 63 and bool(_DNS1123_LABEL.match(s))


def is_dns1123_subdomain(s: str) -> bool:
    return len(s) <= 253 and bool(_DNS1123_SUBDOMAIN.match(s))


def is_dns1035_label(s: str) -> bool:
    return len(s) <= 63 and bool(_DNS1035_LABEL.match(s))


def qualified_name_errors(key: str) -> list[str]:
    """Why ``key`` is not a valid label/annotation key (``[prefix/]name``); empty list if it is."""
    errs: list[str] = []
    parts = key.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errs.append("prefix part must be non-empty")
        elif len(prefix) > 253:
            errs.append("prefix part must be no more than 253 characters")
        elif not _DNS1123_SUBDOMAIN.match(prefix):
            errs.append("prefix part " + DNS1123_SUBDOMAIN_MSG)
    else:
        return [
            "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and "
            "end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
            "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix "
            "and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part must be no more than 63 characters")
    elif not _QUALIFIED_NAME.match(name):
        errs.append(_QUALIFIED_NAME_MSG)
    return errs


def label_value_errors(value: str) -> list[str]:
    """Why ``value`` is not a valid label value; empty list if it is."""
    errs: list[str] = []
    if len(value) > 63:
        errs.append("must be no more than 63 characters")
    if not _LABEL_VALUE.match(value):
        errs.append(_LABEL_VALUE_MSG)
    return errs


def name_errors(kind_rule: str, name: str) -> list[str]:
    """Validate an object name against ``kind_rule``: "subdomain", "label" or "dns1035"."""
    if kind_rule == "label":
        errs = []
        if len(name) > 63:
            errs.append("must be no more than 63 characters")
        if not _DNS1123_LABEL.match(name):
            errs.append(DNS1123_LABEL_MSG)
        return errs
    if kind_rule == "dns1035":
        errs = []
        if len(name) > 63:
            errs.append("must be no more than 63 characters")
        if not _DNS1035_LABEL.match(name):
            errs.append(DNS1035_LABEL_MSG)
        return errs
    errs = []
    if len(name) > 253:
        errs.append("must be no more than 253 characters")
    if not _DNS1123_SUBDOMAIN.match(name):
        errs.append(DNS1123_SUBDOMAIN_MSG)
    return errs


def validate_metadata(meta: dict[str, Any], *, name_rule: str = "subdomain") -> list[Cause]:
    """Validate name, labels, annotations, finalizers and ownerReferences of ``meta``."""
    causes: list[Cause] = []
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        causes.append(Cause.required("metadata.name", "name or generateName is required"))
    else:
        for msg in name_errors(name_rule, name):
            causes.append(Cause.invalid_value("metadata.name", name, msg))
    labels = meta.get("labels")
    if labels is not None:
        if not isinstance(labels, dict):
            causes.append(Cause.invalid_value("metadata.labels", labels, "must be a map of string to string"))
        else:
            for k, v in labels.items():
                for msg in qualified_name_errors(str(k)):
                    causes.append(Cause.invalid_value("metadata.labels", k, msg))
                if not isinstance(v, str):
                    causes.append(Cause.invalid_value(f"metadata.labels[{k}]", v, "must be a string"))
                    continue
                for msg in label_value_errors(v):
                    causes.append(Cause.invalid_value("metadata.labels", v, msg))
    annotations = meta.get("annotations")
    if annotations is not None:
        if not isinstance(annotations, dict):
            causes.append(
                Cause.invalid_value("metadata.annotations", annotations, "must be a map of string to string")
            )
        else:
            total = 0
            for k, v in annotations.items():
                for msg in qualified_name_errors(str(k)):
                    causes.append(Cause.invalid_value("metadata.annotations", str(k).lower(), msg))
                if not isinstance(v, str):
                    causes.append(Cause.invalid_value(f"metadata.annotations[{k}]", v, "must be a string"))
                    continue
                total += len(str(k).encode()) + len(v.encode())  # the API server counts bytes
            if total > TOTAL_ANNOTATION_SIZE_LIMIT:
                causes.append(Cause.too_long("metadata.annotations", TOTAL_ANNOTATION_SIZE_LIMIT))
    finalizers = meta.get("finalizers")
    if finalizers is not None:
        if not isinstance(finalizers, list) or not all(isinstance(f, str) for f in finalizers):
            causes.append(Cause.invalid_value("metadata.finalizers", finalizers, "must be a list of strings"))
        else:
            for i, f in enumerate(finalizers):
                for msg in qualified_name_errors(f):
                    causes.append(Cause.invalid_value(f"metadata.finalizers[{i}]", f, msg))
    owners = meta.get("ownerReferences")
    if owners is not None:
        if not isinstance(owners, list):
            causes.append(Cause.invalid_value("metadata.ownerReferences", owners, "must be a list"))
        else:
            controllers = 0
            for i, ref in enumerate(owners):
                path = f"metadata.ownerReferences[{i}]"
                if not isinstance(ref, dict):
                    causes.append(Cause.invalid_value(path, ref, "must be an object"))
                    continue
                for fld in ("apiVersion", "kind", "name", "uid"):
                    if not ref.get(fld):
                        causes.append(Cause.required(f"{path}.{fld}"))
                if ref.get("controller"):
                    controllers += 1
            if controllers > 1:
                causes.append(
                    Cause.invalid_value(
                        "metadata.ownerReferences",
                        owners,
                        "Only one reference can have Controller set to true",
                    )
                )
    return causes
