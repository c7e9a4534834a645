"""The portable description of a training job: :class:`JobSpec`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from msgspec.structs import force_setattr

from dispatch.errors import InvalidError
from dispatch.model._base import EMPTY_MAP, Model, frozen_map
from dispatch.model._decode import INT_MAX, key_path, load_json, load_yaml
from dispatch.model.extensions import EMPTY_EXTENSIONS, Extensions
from dispatch.model.identity import ENV_PREFIX

__all__ = ["ENV_NAME", "JobSpec"]

ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*\Z"


class JobSpec(Model, frozen=True):
    """What to run: the command on every node, how many nodes, environment, time limit, extensions.

    Construction validates every rule and raises :class:`~dispatch.errors.InvalidError` naming the field.
    """

    command: tuple[str, ...]
    nodes: int = 1
    procs_per_node: int | None = None
    env: Mapping[str, str] = EMPTY_MAP
    time_limit: int | None = None
    extensions: Extensions = EMPTY_EXTENSIONS

    def __post_init__(self) -> None:
        command = self.command
        if isinstance(command, str) or not isinstance(command, list | tuple):
            raise InvalidError("expected a list of strings", path="command")
        if not command:
            raise InvalidError("must not be empty", path="command")
        for i, item in enumerate(command):
            if not isinstance(item, str):
                raise InvalidError(f"expected a string, got {type(item).__name__}", path=f"command[{i}]")
            _check_runnable(item, f"command[{i}]", _UNRUNNABLE_ITEM)
        force_setattr(self, "command", tuple(command))
        _check_count(self.nodes, "nodes")
        if self.procs_per_node is not None:
            _check_count(self.procs_per_node, "procsPerNode")
        if self.time_limit is not None:
            _check_count(self.time_limit, "timeLimit")
        if not isinstance(self.env, Mapping):
            raise InvalidError("expected a mapping of names to strings", path="env")
        for name, value in self.env.items():
            where = key_path("env", str(name))
            if not isinstance(name, str) or not re.match(ENV_NAME, name):
                raise InvalidError("not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)", path=where)
            if name.startswith(ENV_PREFIX):
                raise InvalidError(f"names starting {ENV_PREFIX} are reserved to dispatch", path=where)
            if not isinstance(value, str):
                raise InvalidError(f"expected a string, got {type(value).__name__}", path=where)
            _check_runnable(value, where)
        force_setattr(self, "env", frozen_map(self.env))
        ext = self.extensions
        if not isinstance(ext, Extensions):
            ext = Extensions(ext)
        force_setattr(self, "extensions", ext if ext else EMPTY_EXTENSIONS)

    @classmethod
    def loads(cls, data: bytes | str, *, format: str = "json") -> JobSpec:
        """Parse a JSON or YAML document (``format="yaml"``) into a JobSpec, strictly."""
        if format == "json":
            raw = load_json(data, what="job spec")
        elif format == "yaml":
            raw = load_yaml(data, what="job spec")
        else:
            raise InvalidError(f'unknown format {format!r}; expected "json" or "yaml"', path="format")
        return cls.from_json(raw)

    def dumps(self) -> str:
        import json

        return json.dumps(self.to_json(), sort_keys=True)


# No cluster can run these: NUL ends a C string (execve, environ), and a line break splits the line-based
# forms that carry environments to nodes (env files, `--export`). A command item may hold line breaks (a
# multi-line `sh -c` script is common): every adapter passes it as one argument, quoted.
_UNRUNNABLE = r"[\x00\n\r]"
_UNRUNNABLE_ITEM = r"\x00"
_UNRUNNABLE_NAMES = {"\x00": "NUL", "\n": "a newline", "\r": "a carriage return"}


def _check_runnable(text: str, path: str, unrunnable: str = _UNRUNNABLE) -> None:
    found = re.search(unrunnable, text)
    if found:
        raise InvalidError(
            f"must not contain {_UNRUNNABLE_NAMES[found.group()]} (at character {found.start()}): "
            "no cluster can pass it to a process",
            path=path,
        )


def _check_count(value: Any, path: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidError(f"expected an integer, got {type(value).__name__}", path=path)
    if value < 1:
        raise InvalidError(f"must be at least 1, got {value}", path=path)
    if value > INT_MAX:  # what a document could say (int64); a larger int cannot even be printed
        raise InvalidError(f"integer out of range; integers are 64-bit (at most {INT_MAX})", path=path)
