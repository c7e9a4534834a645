"""Kubernetes resource quantities (``500m``, ``2``, ``64Gi``, ``1e3``) as numbers, for fitting and quota."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["add_into", "parse_quantity", "pod_requests"]

_SUFFIX = {
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "": 1.0,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")


def parse_quantity(value: Any) -> float:
    """A quantity as a float (cpu in cores, memory in bytes); raises ValueError naming a bad one."""
    if isinstance(value, bool):
        raise ValueError(f"not a resource quantity: {value!r}")
    if isinstance(value, int | float):
        return float(value)
    m = _QUANTITY.match(str(value).strip())
    if not m:
        raise ValueError(f"not a resource quantity: {value!r}")
    return float(m.group(1)) * _SUFFIX[m.group(2) or ""]


def add_into(total: dict[str, float], extra: Mapping[str, float], times: float = 1.0) -> None:
    """``total += extra * times`` per resource name."""
    for k, v in extra.items():
        total[k] = total.get(k, 0.0) + v * times


def _container_requests(c: Mapping[str, Any]) -> dict[str, float]:
    res = c.get("resources") or {}
    requests = dict(res.get("requests") or {})
    # As the API server defaults it: a limit without a request is also the request.
    for k, v in (res.get("limits") or {}).items():
        requests.setdefault(k, v)
    out: dict[str, float] = {}
    for k, v in requests.items():
        try:
            out[str(k)] = parse_quantity(v)
        except ValueError:
            continue
    return out


def pod_requests(pod_spec: Mapping[str, Any]) -> dict[str, float]:
    """Effective requests of a pod spec: sum of containers, max with each init container, plus 1 pod."""
    total: dict[str, float] = {}
    for c in pod_spec.get("containers") or []:
        add_into(total, _container_requests(c))
    for c in pod_spec.get("initContainers") or []:
        for k, v in _container_requests(c).items():
            total[k] = max(total.get(k, 0.0), v)
    total["pods"] = 1.0
    return total
