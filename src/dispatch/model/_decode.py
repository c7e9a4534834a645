"""Strict decoding of JSON and YAML documents into typed values.

Every refusal is an :class:`~dispatch.errors.InvalidError` naming the path of the offending value in
the form users write it: ``extensions["dispatch/Image"].ref``, ``command[2]``, ``env["A B"]``.
Refused: unknown fields, unknown enum names, ``null`` (it would read as "unset" and silently take a
default), duplicate keys, trailing data, and values of the wrong type.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from enum import Enum
from typing import Any, TypeVar

from dispatch.errors import InvalidError

__all__ = [
    "Fields",
    "as_bool",
    "as_enum",
    "as_int",
    "as_list",
    "as_mapping",
    "as_number",
    "as_object",
    "as_str",
    "check_plain",
    "join",
    "key_path",
    "load_json",
    "load_yaml",
]

T = TypeVar("T")
E = TypeVar("E", bound=Enum)

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class _Object(dict[str, Any]):
    """A decoded JSON/YAML object that remembers the keys that appeared more than once."""

    duplicates: list[str]

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__()
        self.duplicates = []
        for key, value in pairs:
            if key in self and key not in self.duplicates:
                self.duplicates.append(key)
            self[key] = value


def join(path: str, key: str | int) -> str:
    """The path of ``key`` inside the value at ``path``."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _IDENT.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def key_path(path: str, key: str) -> str:
    """The path of a map entry: always bracketed (``env["HOME"]``), since keys are data, not fields."""
    return f"{path}[{json.dumps(key)}]"


def _where(path: str) -> str:
    return path or "document"


def load_json(data: bytes | str, *, what: str = "document") -> Any:
    """Parse one JSON value; refuse duplicate keys (reported when the value is walked), NaN/Infinity
    and trailing data."""
    _check_text(data, what)
    if isinstance(data, bytes | bytearray):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", path=what) from None

    def refuse_constant(name: str) -> Any:
        raise InvalidError(f"{name} is not valid JSON", path=what)

    decoder = json.JSONDecoder(object_pairs_hook=_Object, parse_constant=refuse_constant)
    text = data.lstrip()
    try:
        value, end = decoder.raw_decode(text)
        rest = text[end:].strip()
        if rest:
            raise InvalidError(f"trailing data after the JSON value: {rest[:30]!r}", path=what)
        _refuse_duplicates_anywhere(value, "")
    except json.JSONDecodeError as exc:
        raise InvalidError(
            f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})", path=what
        ) from None
    except RecursionError:
        raise InvalidError(_TOO_DEEP, path=what) from None
    return value


def load_yaml(data: bytes | str, *, what: str = "document") -> Any:
    """Parse one YAML document with the same strictness as :func:`load_json`.

    Only the JSON-compatible subset is kept: timestamps and other implicit YAML types stay strings.
    """
    _check_text(data, what)
    import yaml  # deferred: keeps ``import dispatch`` light

    class _Loader(yaml.SafeLoader):
        pass

    # Dates must not turn into datetime objects: every field of ours is a string or a number.
    _Loader.yaml_implicit_resolvers = {
        k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:timestamp"]
        for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> _Object:
        loader.flatten_mapping(node)
        pairs: list[tuple[str, Any]] = []
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                mark = key_node.start_mark
                raise InvalidError(
                    f"line {mark.line + 1}: mapping keys must be strings, got {_type_name(key)} {key!r}",
                    path=what,
                )
            pairs.append((key, loader.construct_object(value_node, deep=True)))
        return _Object(pairs)

    _Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    if isinstance(data, bytes | bytearray):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", path=what) from None
    try:
        docs = list(yaml.load_all(data, Loader=_Loader))
        if len(docs) == 1:
            _refuse_duplicates_anywhere(docs[0], "")
    except yaml.YAMLError as exc:
        raise InvalidError(f"not valid YAML: {_yaml_problem(exc)}", path=what) from None
    except RecursionError:
        raise InvalidError(_TOO_DEEP, path=what) from None
    if len(docs) != 1:
        raise InvalidError(
            "expected exactly one YAML document" if docs else "empty document: expected a mapping", path=what
        )
    return docs[0]


_TOO_DEEP = "nested too deeply to decode"


def _check_text(data: Any, what: str) -> None:
    if not isinstance(data, str | bytes | bytearray):
        raise InvalidError(f"expected text (str or bytes), got {_type_name(data)}", path=what)


def _yaml_problem(exc: Exception) -> str:
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    return str(problem)


MAX_DEPTH = 100
"""How deeply a document may nest: far beyond any real spec or settings, and well inside Python's
recursion limit, so that the walks that decode a value never hit it."""


def _refuse_duplicates_anywhere(value: Any, path: str, depth: int = 0) -> None:
    if isinstance(value, _Object | list) and depth >= MAX_DEPTH:
        raise InvalidError(f"{_TOO_DEEP} (more than {MAX_DEPTH} levels)", path=_where(path))
    if isinstance(value, _Object):
        if value.duplicates:
            raise InvalidError(f"duplicate key {json.dumps(value.duplicates[0])}", path=_where(path))
        for k, v in value.items():
            _refuse_duplicates_anywhere(v, join(path, k), depth + 1)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _refuse_duplicates_anywhere(v, join(path, i), depth + 1)


def check_plain(value: Any, path: str) -> Any:
    """Check an untyped JSON region (e.g. a Kubernetes object passed through): no nulls, only JSON
    types, string keys. Returns a plain copy (dicts and lists)."""
    if value is None:
        raise InvalidError("null is not allowed; omit the field instead", path=_where(path))
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise InvalidError(f"keys must be strings, got {_type_name(k)}", path=_where(path))
            out[k] = check_plain(v, join(path, k))
        return out
    if isinstance(value, list | tuple):
        return [check_plain(v, join(path, i)) for i, v in enumerate(value)]
    if isinstance(value, bool | str | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidError("must be a finite number", path=_where(path))
        return value
    raise InvalidError(f"expected a JSON value, got {_type_name(value)}", path=_where(path))


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


def _null(value: Any, path: str) -> None:
    if value is None:
        raise InvalidError("null is not allowed; omit the field to use its default", path=_where(path))


def as_str(value: Any, path: str) -> str:
    _null(value, path)
    if not isinstance(value, str):
        raise InvalidError(f"expected a string, got {_type_name(value)}", path=_where(path))
    return value


def as_int(value: Any, path: str) -> int:
    _null(value, path)
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise InvalidError(f"expected an integer, got {_type_name(value)}", path=_where(path))
    return value


def as_number(value: Any, path: str) -> float:
    _null(value, path)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidError(f"expected a number, got {_type_name(value)}", path=_where(path))
    if not math.isfinite(value):
        raise InvalidError("must be a finite number", path=_where(path))
    return float(value)


def as_bool(value: Any, path: str) -> bool:
    _null(value, path)
    if not isinstance(value, bool):
        raise InvalidError(f"expected true or false, got {_type_name(value)}", path=_where(path))
    return value


def as_enum(cls: type[E], value: Any, path: str) -> E:
    text = as_str(value, path)
    for member in cls:
        if member.value == text:
            return member
    names = ", ".join(json.dumps(m.value) for m in cls)
    raise InvalidError(
        f"unknown {cls.__name__} {json.dumps(text)}; expected one of {names}", path=_where(path)
    )


def as_list(value: Any, path: str, item: Callable[[Any, str], T]) -> list[T]:
    _null(value, path)
    if not isinstance(value, list | tuple):
        raise InvalidError(f"expected a list, got {_type_name(value)}", path=_where(path))
    return [item(v, join(path, i)) for i, v in enumerate(value)]


def as_mapping(value: Any, path: str, item: Callable[[Any, str], T]) -> dict[str, T]:
    """A map with data keys (``env``, ``labels``): every value decoded by ``item``."""
    obj = as_object(value, path)
    return {k: item(v, key_path(path, k)) for k, v in obj.items()}


def as_object(value: Any, path: str) -> Mapping[str, Any]:
    _null(value, path)
    if not isinstance(value, Mapping):
        raise InvalidError(f"expected an object, got {_type_name(value)}", path=_where(path))
    dups = getattr(value, "duplicates", None)
    if dups:
        raise InvalidError(f"duplicate key {json.dumps(dups[0])}", path=_where(path))
    for k in value:
        if not isinstance(k, str):
            raise InvalidError(f"keys must be strings, got {_type_name(k)}", path=_where(path))
    return value


class Fields:
    """Reads the fields of one JSON object and refuses any it was not asked for.

    >>> f = Fields(obj, "spec"); n = f.optional("nodes", as_int, 1); f.done()
    """

    def __init__(self, value: Any, path: str, *, what: str = "field") -> None:
        self.obj = as_object(value, path)
        self.path = path
        self.what = what
        self._seen: set[str] = set()

    def has(self, key: str) -> bool:
        return key in self.obj

    def required(self, key: str, read: Callable[[Any, str], T]) -> T:
        self._seen.add(key)
        if key not in self.obj:
            raise InvalidError("required field is missing", path=join(self.path, key))
        return read(self.obj[key], join(self.path, key))

    def optional(self, key: str, read: Callable[[Any, str], T], default: T) -> T:
        self._seen.add(key)
        if key not in self.obj:
            return default
        return read(self.obj[key], join(self.path, key))

    def unread(self) -> Iterator[str]:
        return (k for k in self.obj if k not in self._seen)

    def done(self) -> None:
        """Refuse the first field nobody asked for, naming the allowed ones."""
        for key in self.unread():
            allowed = ", ".join(sorted(self._seen)) or "none"
            raise InvalidError(
                f"unknown {self.what} {json.dumps(key)}{nearest(key, self._seen)}; allowed: {allowed}",
                path=join(self.path, key),
            )


def nearest(key: str, known: Iterable[str]) -> str:
    """``"; did you mean "x"?"`` for the known name closest to a misspelt ``key`` (difflib), else ``""``."""
    import difflib  # deferred: only an error needs it

    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    if not close:
        lowered = {k.lower(): k for k in known}  # probewindow → probeWindow
        close = [lowered[key.lower()]] if key.lower() in lowered else []
    return f"; did you mean {json.dumps(close[0])}?" if close else ""
