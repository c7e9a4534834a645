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
    "as_number",
    "as_object",
    "as_str",
    "check_plain",
    "check_tree",
    "join",
    "key_path",
    "load_json",
    "load_toml",
    "load_yaml",
]

T = TypeVar("T")
E = TypeVar("E", bound=Enum)

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*\Z"


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
    if re.match(_IDENT, key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def key_path(path: str, key: str) -> str:
    """The path of a map entry: always bracketed (``env["HOME"]``), since keys are data, not fields."""
    return f"{path}[{json.dumps(key)}]"


def _where(path: str) -> str:
    return path or "document"


def load_json(data: bytes | str, *, what: str = "document", max_depth: int | None = None) -> Any:
    """Parse one JSON value (RFC 8259) strictly.

    Refused with :class:`InvalidError`: duplicate keys, NaN/Infinity, trailing data, whitespace JSON
    does not allow (``\\x0b``, ``\\xa0``), strings with unpaired surrogates, integers beyond
    64 bits, numbers that overflow to infinity, and nesting deeper than ``max_depth``
    (default :data:`MAX_DEPTH`).
    """
    _check_text(data, what)
    if isinstance(data, bytes | bytearray):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", path=what) from None

    def refuse_constant(name: str) -> Any:
        raise InvalidError(f"{name} is not valid JSON", path=what)

    decoder = json.JSONDecoder(object_pairs_hook=_Object, parse_constant=refuse_constant, parse_int=_json_int)
    text = data
    start = len(text) - len(text.lstrip(_JSON_SPACE))
    try:
        value, end = decoder.raw_decode(text, start)
        rest = text[end:].strip(_JSON_SPACE)
        if rest:
            raise InvalidError(f"trailing data after the JSON value: {rest[:30]!r}", path=what)
    except json.JSONDecodeError as exc:
        raise InvalidError(
            f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})", path=what
        ) from None
    except RecursionError:
        raise InvalidError(_TOO_DEEP, path=what) from None
    check_tree(value, max_depth=max_depth)
    return value


# RFC 8259 whitespace: str.strip() would also take \x0b, \x0c, \x1c-\x1f, \x85, \xa0 and more.
_JSON_SPACE = " \t\n\r"


class _OutOfRange(str):
    """An integer literal too long to convert (Python refuses more than 4,300 digits, and anything
    over 19 is beyond int64): kept as text, refused with its path by :func:`check_tree`."""


def _json_int(text: str) -> int | _OutOfRange:
    if len(text) > 20:
        return _OutOfRange(text)
    return int(text)


def load_yaml(data: bytes | str, *, what: str = "document", max_depth: int | None = None) -> Any:
    """Parse one YAML document with the same strictness as :func:`load_json`.

    Only the JSON-compatible subset is read, with the scalars of the YAML 1.2 core schema: ``null``,
    ``true``/``false``, decimal, ``0x`` and ``0o`` integers, floats; every other plain scalar is a
    string (so YAML 1.1 forms such as ``1:30``, ``yes``, ``0b101``, ``1_000`` and dates are strings,
    never numbers, booleans or timestamps). Explicit tags other than the core ones (``!!str``,
    ``!!int``, ``!!float``, ``!!bool``, ``!!null``, ``!!map``, ``!!seq``) are refused, as is a core
    tag whose value does not fit it (``!!int x``). Aliases may expand the document by at most
    :data:`MAX_ALIAS_EXPANSION` values and characters; merge keys (``<<``) are refused.
    """
    _check_text(data, what)
    if isinstance(data, bytes | bytearray):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", path=what) from None
    from dispatch.model._yaml import read_yaml  # deferred: keeps ``import dispatch`` light

    limit = MAX_DEPTH if max_depth is None else max_depth
    value = read_yaml(data, what=what, max_depth=limit, budget=len(data) + MAX_ALIAS_EXPANSION)
    check_tree(value, max_depth=max_depth)
    return value


def load_toml(data: bytes | str, *, what: str = "document", max_depth: int | None = None) -> Any:
    """Parse one TOML document into plain JSON values, with the limits of :func:`load_json`.

    Dates and times (no JSON form), NaN and infinities are refused, as are integers beyond
    64 bits and nesting deeper than ``max_depth``."""
    _check_text(data, what)
    import tomllib  # deferred: only TOML documents need it

    try:
        text = bytes(data).decode("utf-8") if isinstance(data, bytes | bytearray) else data
        value = tomllib.loads(text)
    except UnicodeDecodeError as exc:
        raise InvalidError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", path=what) from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidError(f"not valid TOML: {exc}", path=what) from None
    except RecursionError:
        raise InvalidError(_TOO_DEEP, path=what) from None
    except ValueError as exc:  # an integer of more than 4,300 digits
        raise InvalidError(f"not valid TOML: {_first_line(exc)}", path=what) from None
    check_tree(value, max_depth=max_depth)
    return check_plain(value, "")


def _first_line(exc: BaseException) -> str:
    text = str(exc).splitlines()
    return text[0] if text else type(exc).__name__


_TOO_DEEP = "nested too deeply to decode"


def _check_text(data: Any, what: str) -> None:
    if not isinstance(data, str | bytes | bytearray):
        raise InvalidError(f"expected text (str or bytes), got {_type_name(data)}", path=what)


MAX_DEPTH = 100
"""How deeply a document (JSON, YAML or TOML) may nest, counting objects and lists: far beyond any real
spec or settings, and well inside Python's recursion limit, so that the walks that decode a value
never hit it. The store reads records with :data:`STORED_DEPTH`, so that every spec that decodes can
be stored and read back."""

STORED_DEPTH = MAX_DEPTH + 10
"""The depth limit of a stored record: a spec (or settings value) nested :data:`MAX_DEPTH` deep sits a
few levels down inside the record that holds it."""

MAX_ALIAS_EXPANSION = 100_000
"""How many values and characters a YAML document's aliases may add beyond the document's own length
(the "billion laughs": a few hundred bytes that expand to gigabytes)."""

INT_MAX = 2**63 - 1
INT_MIN = -(2**63)
"""Integers in a document are 64-bit, as JSON tools and Kubernetes read them."""

_SURROGATE = "[\ud800-\udfff]"


def check_tree(value: Any, path: str = "", *, max_depth: int | None = None) -> None:
    """Check a decoded document: depth, duplicate keys, integers within int64, finite numbers, and
    strings that are Unicode text (no unpaired surrogates). ``InvalidError`` names the path."""
    _check_tree(value, path, 0, MAX_DEPTH if max_depth is None else max_depth)


def _check_tree(value: Any, path: str, depth: int, max_depth: int) -> None:
    if isinstance(value, str):
        if isinstance(value, _OutOfRange):
            raise InvalidError(
                f"integer out of range (a literal of {len(value)} characters); {_INT_RANGE}",
                path=_where(path),
            )
        if re.search(_SURROGATE, value):
            raise InvalidError("not Unicode text: the string holds an unpaired surrogate", path=_where(path))
    elif isinstance(value, bool):
        pass
    elif isinstance(value, int):
        if not INT_MIN <= value <= INT_MAX:
            raise InvalidError(f"integer out of range; {_INT_RANGE}", path=_where(path))
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidError("number out of range: must be finite", path=_where(path))
    elif isinstance(value, dict | list):
        if depth >= max_depth:
            raise InvalidError(f"{_TOO_DEEP} (more than {max_depth} levels)", path=_where(path))
        if isinstance(value, dict):
            dups = getattr(value, "duplicates", None)
            if dups:
                raise InvalidError(f"duplicate key {json.dumps(dups[0])}", path=_where(path))
            for k, v in value.items():
                if isinstance(k, str) and re.search(_SURROGATE, k):
                    raise InvalidError(
                        "not Unicode text: a key holds an unpaired surrogate", path=_where(path)
                    )
                _check_tree(
                    v, join(path, k) if isinstance(k, str) else f"{path}[{k!r}]", depth + 1, max_depth
                )
        else:
            for i, v in enumerate(value):
                _check_tree(v, join(path, i), depth + 1, max_depth)


_INT_RANGE = f"integers are 64-bit (from {INT_MIN} to {INT_MAX})"


def check_plain(value: Any, path: str, *, _depth: int = 0) -> Any:
    """Check an untyped JSON region (e.g. a Kubernetes object passed through): no nulls, only JSON
    types, string keys, finite numbers, integers within int64, at most :data:`STORED_DEPTH` levels.
    Returns a plain copy (dicts and lists)."""
    if value is None:
        raise InvalidError("null is not allowed; omit the field instead", path=_where(path))
    if isinstance(value, Mapping | list | tuple) and _depth >= STORED_DEPTH:
        raise InvalidError(f"{_TOO_DEEP} (more than {STORED_DEPTH} levels)", path=_where(path))
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise InvalidError(f"keys must be strings, got {_type_name(k)}", path=_where(path))
            out[k] = check_plain(v, join(path, k), _depth=_depth + 1)
        return out
    if isinstance(value, list | tuple):
        return [check_plain(v, join(path, i), _depth=_depth + 1) for i, v in enumerate(value)]
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        if not INT_MIN <= value <= INT_MAX:
            raise InvalidError(f"integer out of range; {_INT_RANGE}", path=_where(path))
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


def _shown(value: Any) -> str:
    """The type of ``value``, and a short string itself: YAML reads ``1:30`` or ``yes`` as a string
    (see :func:`load_yaml`), and the message should show what was read."""
    if isinstance(value, str) and len(value) <= 24 and value.isprintable():
        return f"a string ({json.dumps(value)})"
    return _type_name(value)


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
        if isinstance(value, float) and value.is_integer() and INT_MIN <= value <= INT_MAX:
            return int(value)
        raise InvalidError(f"expected an integer, got {_shown(value)}", path=_where(path))
    if not INT_MIN <= value <= INT_MAX:
        raise InvalidError(f"integer out of range; {_INT_RANGE}", path=_where(path))
    return value


def as_number(value: Any, path: str) -> float:
    _null(value, path)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidError(f"expected a number, got {_shown(value)}", path=_where(path))
    if isinstance(value, int) and not INT_MIN <= value <= INT_MAX:
        raise InvalidError(f"integer out of range; {_INT_RANGE}", path=_where(path))
    if not math.isfinite(value):
        raise InvalidError("must be a finite number", path=_where(path))
    return float(value)


def as_bool(value: Any, path: str) -> bool:
    _null(value, path)
    if not isinstance(value, bool):
        raise InvalidError(f"expected true or false, got {_shown(value)}", path=_where(path))
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

    def allow(self, key: str) -> None:
        """Count ``key`` as known without reading it (a field left at its default)."""
        self._seen.add(key)

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
