"""A small strategic-merge for pod/job templates, as Trainer applies runtime patches to a runtime template.

Maps merge recursively; lists of known Kubernetes types merge by their patch-merge key (containers, env,
volumes by ``name``; volumeMounts by ``mountPath``; ports by ``containerPort``); other lists (tolerations,
command, args, ...) are replaced; ``None`` deletes a key.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["merge_template", "upsert_by_key"]

_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "imagePullSecrets": "name",
    "schedulingGates": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "hostAliases": "ip",
}


def upsert_by_key(
    items: list[dict[str, Any]], new: list[dict[str, Any]], key: str = "name"
) -> list[dict[str, Any]]:
    """Update items in place by ``key`` and append the new ones, keeping positions (Trainer's Upsert*)."""
    out = [copy.deepcopy(i) for i in items]
    for n in new:
        for i, cur in enumerate(out):
            if cur.get(key) == n.get(key):
                out[i] = copy.deepcopy(n)
                break
        else:
            out.append(copy.deepcopy(n))
    return out


def _merge_list(base: list[Any], patch: list[Any], key: str) -> list[Any]:
    out = [copy.deepcopy(i) for i in base]
    for p in patch:
        if not isinstance(p, dict):
            out.append(copy.deepcopy(p))
            continue
        for i, cur in enumerate(out):
            if isinstance(cur, dict) and cur.get(key) == p.get(key):
                out[i] = merge_template(cur, p)
                break
        else:
            out.append(merge_template({}, p))
    return out


def merge_template(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """Strategic-merge ``patch`` into a copy of ``base`` (neither is modified)."""
    out = copy.deepcopy(base)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge_template(out[k], v)
        elif isinstance(v, list) and k in _MERGE_KEYS and isinstance(out.get(k), list):
            out[k] = _merge_list(out[k], v, _MERGE_KEYS[k])
        elif isinstance(v, dict):
            out[k] = merge_template({}, v)
        else:
            out[k] = copy.deepcopy(v)
    return out
