"""Decoding JSON and YAML request bodies into plain JSON values, within the API server's limits.

A real API server converts YAML to JSON (timestamps stay strings), refuses documents whose aliases
expand far beyond their size ("excessive aliasing", the YAML "billion laughs"), and refuses JSON nested
deeper than its decoder allows. Without these limits a few hundred bytes of YAML expand to gigabytes in
memory, and a deeply nested body exhausts the interpreter's recursion.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

__all__ = ["MAX_DEPTH", "MAX_YAML_NODES", "BodyError", "decode_json", "decode_yaml"]

# The expanded size (scalars, lists and maps) a YAML document may reach through aliases. A document
# without aliases is bounded by the request size limit instead.
MAX_YAML_NODES = 1_000_000
# Nesting depth. encoding/json allows 10,000; kubesim stays well inside Python's recursion limit (the
# store deep-copies objects recursively), far deeper than any Kubernetes object.
MAX_DEPTH = 200


class BodyError(ValueError):
    """The body cannot be decoded; the message says why."""


class _JsonYamlLoader(yaml.SafeLoader):
    """A SafeLoader that keeps timestamps as the strings they are in JSON."""


_JsonYamlLoader.add_constructor(
    "tag:yaml.org,2002:timestamp",
    lambda loader, node: loader.construct_scalar(node),  # type: ignore[arg-type]
)


def _expanded_size(value: Any, memo: dict[int, int], depth: int = 0, *, limit: int = MAX_YAML_NODES) -> int:
    """Nodes ``value`` has once every shared (aliased) part is counted at each place it appears."""
    if depth > MAX_DEPTH:
        raise BodyError(f"the body is nested more than {MAX_DEPTH} levels deep")
    if not isinstance(value, dict | list):
        return 1
    key = id(value)
    if key in memo:
        return memo[key]
    children = value.values() if isinstance(value, dict) else value
    size = 1
    for child in children:
        size += _expanded_size(child, memo, depth + 1, limit=limit)
        if size > limit:
            raise BodyError("yaml: document contains excessive aliasing")
    memo[key] = size
    return size


def decode_yaml(raw: bytes) -> Any:
    """One YAML document as plain JSON values; BodyError when it is malformed or over the limits."""
    try:
        value = yaml.load(raw.decode(), Loader=_JsonYamlLoader)  # a SafeLoader subclass: no arbitrary objects
    except (ValueError, yaml.YAMLError) as exc:
        raise BodyError(str(exc)) from None
    except RecursionError:
        raise BodyError(f"the body is nested more than {MAX_DEPTH} levels deep") from None
    _expanded_size(value, {})
    try:
        # Now bounded: expand the aliases and turn YAML-only values (sets, bytes) into an error.
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise BodyError(f"the YAML has a value JSON cannot hold: {exc}") from None


def decode_json(raw: bytes) -> Any:
    """A JSON document; BodyError when it is malformed or nested too deep."""
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise BodyError(str(exc)) from None
    except RecursionError:
        raise BodyError(f"the body is nested more than {MAX_DEPTH} levels deep") from None
    _expanded_size(value, {}, limit=len(raw) + 1)  # no aliases in JSON: only the depth can fail
    return value
