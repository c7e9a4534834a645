"""Trainer's template merging: runtime patches strategic-merged into a runtime's templates, and Upsert.

Trainer applies ``runtimePatches`` with the Kubernetes strategic merge patch on the pod/job template
types; kubesim uses its one strategic-merge implementation (``kubesim.patch``) for that, so a patch
means the same in a runtime patch as in a ``kubectl patch``.
"""

from __future__ import annotations

import copy
from typing import Any

from kubesim.patch import strategic_merge_patch

__all__ = ["merge_template", "upsert_by_key"]


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


def merge_template(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """Strategic-merge ``patch`` into a copy of ``base`` (neither is modified)."""
    out = strategic_merge_patch(base, patch)
    return out if isinstance(out, dict) else {}
