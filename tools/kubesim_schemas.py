"""Regenerate ``src/kubesim/schemas.json``: the field skeletons of the upstream CRDs kubesim serves.

Usage: ``python tools/kubesim_schemas.py /work/shared/reference/crds`` (a folder holding the published
CRD YAML files). Only field names, JSON types and the structural-schema markers the apiserver's pruning
and ``kubectl explain`` need are kept — no descriptions, validation rules or defaults (kubesim's admission
implements those). kubesim itself never reads the CRD folder: the generated file is committed.

Node format: ``t`` type (``object``/``array``/``string``/``integer``/``number``/``boolean``/
``int-or-string``), ``p`` properties, ``a`` additionalProperties (a node, or ``true``), ``i`` items,
``x`` x-kubernetes-preserve-unknown-fields, ``e`` x-kubernetes-embedded-resource, ``r`` required.
Sub-trees that repeat (a PodSpec inside every template) are stored once under ``defs`` and referenced as
``{"$": "<id>"}``.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import yaml

# (CRD file, served version) -> kubesim plural key "group/plural"
FILES = {
    "kubeflow-trainer/trainer.kubeflow.org_trainjobs.yaml": "v1alpha1",
    "kubeflow-trainer/trainer.kubeflow.org_trainingruntimes.yaml": "v1alpha1",
    "kubeflow-trainer/trainer.kubeflow.org_clustertrainingruntimes.yaml": "v1alpha1",
    "jobset/jobset.x-k8s.io_jobsets.yaml": "v1alpha2",
    "kueue/kueue.x-k8s.io_workloads.yaml": "v1beta2",
    "kueue/kueue.x-k8s.io_admissionchecks.yaml": "v1beta2",
    "kueue/kueue.x-k8s.io_localqueues.yaml": "v1beta2",
    "kueue/kueue.x-k8s.io_clusterqueues.yaml": "v1beta2",
    "kueue/kueue.x-k8s.io_resourceflavors.yaml": "v1beta2",
    "kueue/kueue.x-k8s.io_workloadpriorityclasses.yaml": "v1beta2",
}


def skeleton(s: dict[str, Any]) -> dict[str, Any]:
    node: dict[str, Any] = {}
    t = s.get("type")
    if s.get("x-kubernetes-int-or-string") or (
        t is None and {a.get("type") for a in s.get("anyOf", [])} == {"integer", "string"}
    ):
        t = "int-or-string"
    if t:
        node["t"] = t
    if "properties" in s:
        node["p"] = {k: skeleton(v) for k, v in sorted(s["properties"].items())}
    ap = s.get("additionalProperties")
    if isinstance(ap, dict):
        node["a"] = skeleton(ap)
    elif ap is True:
        node["a"] = True
    if "items" in s:
        node["i"] = skeleton(s["items"])
    if s.get("x-kubernetes-preserve-unknown-fields"):
        node["x"] = 1
    if s.get("x-kubernetes-embedded-resource"):
        node["e"] = 1
    if s.get("required"):
        node["r"] = sorted(s["required"])
    return node


def main(crds: Path, out: Path) -> None:
    kinds: dict[str, Any] = {}
    for rel, version in FILES.items():
        doc = yaml.safe_load((crds / rel).read_text())
        spec = doc["spec"]
        v = next(v for v in spec["versions"] if v["name"] == version)
        root = skeleton(v["schema"]["openAPIV3Schema"])
        root["p"].pop("metadata", None)  # the root ObjectMeta is kubesim's own (the apiserver's) skeleton
        kinds[f"{spec['group']}/{spec['names']['plural']}"] = root
    # batch/v1 JobSpec and core/v1 PodSpec, as embedded (generated from the Go types) in JobSet's CRD
    rj = kinds["jobset.x-k8s.io/jobsets"]["p"]["spec"]["p"]["replicatedJobs"]["i"]["p"]["template"]
    job_spec = rj["p"]["spec"]
    kinds["batch/JobSpec"] = job_spec
    kinds["/PodSpec"] = job_spec["p"]["template"]["p"]["spec"]
    kinds["/EmbeddedObjectMeta"] = rj["p"]["metadata"]

    counts: dict[str, int] = {}
    canon: dict[str, str] = {}

    def key(n: Any) -> str:
        return hashlib.sha1(json.dumps(n, sort_keys=True).encode()).hexdigest()[:10]

    def count(n: Any) -> None:
        if isinstance(n, dict):
            k = key(n)
            counts[k] = counts.get(k, 0) + 1
            for v in n.values():
                count(v)
        elif isinstance(n, list):
            for v in n:
                count(v)

    for n in kinds.values():
        count(n)
    defs: dict[str, Any] = {}

    def share(n: Any, hint: str) -> Any:
        """``n`` with repeated sub-trees moved to ``defs``, named after the field they first appear in
        (``kubectl explain`` shows the name as the field's type)."""
        if isinstance(n, dict):
            if "t" not in n and "p" not in n and "i" not in n:  # a properties map: recurse by field name
                return {k: share(v, k) for k, v in n.items()}
            inner: dict[str, Any] = {}
            for k, v in n.items():
                if k == "p":
                    inner[k] = {f: share(sub, f) for f, sub in v.items()}
                elif k in ("i", "a"):
                    inner[k] = share(v, hint[:-1] if k == "i" and hint.endswith("s") else hint)
                else:
                    inner[k] = v
            k = key(n)
            if counts.get(k, 0) > 1 and len(json.dumps(inner)) > 200:
                if k not in canon:
                    base = hint[:1].upper() + hint[1:] or "Object"
                    name, i = base, 2
                    while name in defs:
                        name, i = f"{base}{i}", i + 1
                    canon[k] = name
                    defs[name] = inner
                return {"$": canon[k]}
            return inner
        return n

    shared = {name: share(n, name.rsplit("/", 1)[-1]) for name, n in kinds.items()}
    out.write_text(json.dumps({"defs": defs, "kinds": shared}, sort_keys=True, separators=(",", ":")) + "\n")
    print(f"wrote {out} ({out.stat().st_size} bytes, {len(defs)} shared sub-trees)")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(__file__).resolve().parents[1] / "src" / "kubesim" / "schemas.json")
