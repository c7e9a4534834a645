"""Regenerate ``src/kubesim/protos.json``: the protobuf field tables of the built-in kinds kubesim serves.

Usage: ``python tools/kubesim_protos.py API_REPO APIMACHINERY_REPO [REF]`` (checkouts of k8s.io/api and
k8s.io/apimachinery, or git directories whose ``generated.proto`` files are read at ``REF``, default
``v0.36.2``: the release of Kubernetes v1.36.2, the version kubesim reports). Only what an
encoder needs is kept — per message, each field's JSON name, number, type (a scalar, or the full name of a
message) and whether it is repeated or a map — no comments, options or documentation. kubesim never reads
the upstream files: the generated table is committed.

Format: ``{"messages": {"<package>.<Message>": {"<field>": [number, "<type>", "<label>"]}}}``; label ``o``
(optional), ``r`` (repeated), ``m:<value type>`` (a ``map<string, value>``, whose type is then ``string``)
or ``i`` (an embedded struct the JSON form inlines: ``Volume``'s ``VolumeSource``, ``Probe``'s
``ProbeHandler``, the ``LocalObjectReference`` of the key selectors). go-to-protobuf names each field
after its JSON tag; the few that differ, and which fields are inlined, are read from the Go struct tags of
the same release's ``types.go``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

API = [
    "core/v1",
    "batch/v1",
    "apps/v1",
    "coordination/v1",
    "storage/v1",
    "rbac/v1",
    "events/v1",
    "authorization/v1",
    "authentication/v1",
]
APIMACHINERY = [
    "pkg/apis/meta/v1",
    "pkg/runtime",
    "pkg/runtime/schema",
    "pkg/api/resource",
    "pkg/util/intstr",
]
SCALARS = {
    "string",
    "bytes",
    "bool",
    "int32",
    "int64",
    "uint32",
    "uint64",
    "sint32",
    "sint64",
    "double",
    "float",
}
FIELD = re.compile(
    r"^\s*(optional|repeated)\s+([\w.]+)\s+(\w+)\s*=\s*(\d+)|^\s*map<\s*string\s*,\s*([\w.]+)\s*>\s+(\w+)\s*=\s*(\d+)"
)


def read(repo: Path, path: str, ref: str) -> str:
    if (repo / path).exists():
        return (repo / path).read_text()
    return subprocess.run(
        ["git", "--git-dir", str(repo), "show", f"{ref}:{path}"], capture_output=True, text=True, check=True
    ).stdout


def parse(text: str) -> tuple[str, dict[str, dict[str, list[object]]]]:
    package = re.search(r"^package\s+([\w.]+);", text, re.M)
    assert package is not None
    pkg = package.group(1)
    messages: dict[str, dict[str, list[object]]] = {}
    current: dict[str, list[object]] | None = None
    for line in text.splitlines():
        stripped = line.split("//", 1)[0]
        head = re.match(r"^message\s+(\w+)\s*\{", stripped)
        if head:
            current = messages.setdefault(f"{pkg}.{head.group(1)}", {})
            continue
        if stripped.startswith("}"):
            current = None
            continue
        m = FIELD.match(stripped)
        if m is None or current is None:
            continue
        if m.group(1):
            label, typ, name, num = m.group(1)[0], m.group(2), m.group(3), int(m.group(4))
            current[name] = [num, typ, label]
        else:
            current[m.group(6)] = [int(m.group(7)), "string", f"m:{m.group(5)}"]
    return pkg, messages


TAG = re.compile(r'^\s*(\w+)\s.*`json:"(\w*)[,"].*protobuf:"[^"]*?,(\d+),')
STRUCT = re.compile(r"^type\s+(\w+)\s+struct\s*\{")


def go_tags(text: str, pkg: str) -> dict[str, dict[int, str]]:
    """Per message, field number -> JSON name ("" for an inlined embedded struct), from Go struct tags."""
    out: dict[str, dict[int, str]] = {}
    current: dict[int, str] | None = None
    for line in text.splitlines():
        head = STRUCT.match(line)
        if head:
            current = out.setdefault(f"{pkg}.{head.group(1)}", {})
            continue
        if line.startswith("}"):
            current = None
            continue
        m = TAG.match(line)
        if m is not None and current is not None:
            current[int(m.group(3))] = m.group(2)
    return out


def resolve(typ: str, pkg: str, known: set[str]) -> str:
    if typ in SCALARS:
        return typ
    typ = typ.lstrip(".")
    if typ in known:
        return typ
    if f"{pkg}.{typ}" in known:
        return f"{pkg}.{typ}"
    raise SystemExit(f"cannot resolve message type {typ!r} in package {pkg}")


def main() -> None:
    api, machinery = Path(sys.argv[1]), Path(sys.argv[2])
    ref = sys.argv[3] if len(sys.argv) > 3 else "v0.36.2"
    parsed = [parse(read(api, f"{d}/generated.proto", ref)) for d in API]
    parsed += [parse(read(machinery, f"{d}/generated.proto", ref)) for d in APIMACHINERY]
    tags: dict[str, dict[int, str]] = {}
    for (pkg, _), d in zip(parsed, [*API, *APIMACHINERY], strict=True):
        try:
            tags.update(go_tags(read(api if d in API else machinery, f"{d}/types.go", ref), pkg))
        except subprocess.CalledProcessError:
            pass  # runtime/schema, resource, intstr: no types.go with JSON tags to correct
    known = {name for _, msgs in parsed for name in msgs}
    out: dict[str, dict[str, list[object]]] = {}
    for pkg, msgs in parsed:
        for name, fields in msgs.items():
            table = {}
            for field, (num, typ, label) in fields.items():
                assert isinstance(typ, str) and isinstance(label, str) and isinstance(num, int)
                if label.startswith("m:"):
                    label = "m:" + resolve(label[2:], pkg, known)
                json_name = tags.get(name, {}).get(num, field)
                if json_name == "":
                    label = "i"
                    json_name = field
                table[json_name] = [num, resolve(typ, pkg, known), label]
            out[name] = table
    target = Path(__file__).resolve().parent.parent / "src" / "kubesim" / "protos.json"
    target.write_text(
        json.dumps({"messages": dict(sorted(out.items()))}, separators=(",", ":"), sort_keys=True) + "\n"
    )
    print(f"{target}: {len(out)} messages")


if __name__ == "__main__":
    main()
