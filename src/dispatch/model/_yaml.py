"""A strict YAML reader: one document, JSON values only, YAML 1.2 core scalars, bounded aliases.

PyYAML's loaders construct YAML 1.1 values (``1:30`` is 90, ``yes`` is true, ``0777`` is 511),
honour any ``!!python``-free tag with constructors that raise whatever they raise (``!!bool 9`` is a
KeyError), and expand aliases without bound. This module reads PyYAML's event stream instead and
builds the values itself, without recursion: every refusal is an :class:`InvalidError` with a line.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from dispatch.errors import InvalidError

__all__ = ["read_yaml"]

_CORE = "tag:yaml.org,2002:"
_NULL = r"(?:null|Null|NULL|~|)\Z"
_BOOL = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_INT10 = r"[-+]?[0-9]+\Z"
_INT8 = r"0o([0-7]+)\Z"
_INT16 = r"0x([0-9a-fA-F]+)\Z"
_FLOAT = r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?\Z"
_INF = r"([-+]?)\.(?:inf|Inf|INF)\Z"
_NAN = r"\.(?:nan|NaN|NAN)\Z"
# Longer literals are out of int64 whatever they say; they are kept as text and refused with their
# path by check_tree, before Python's 4,300-digit limit on int() can raise ValueError.
_MAX_INT_CHARS = 24


def _line(event: Any) -> str:
    mark = getattr(event, "start_mark", None)
    return f"line {mark.line + 1}: " if mark is not None else ""


def _core_int(text: str) -> Any:
    from dispatch.model._decode import _OutOfRange

    if re.match(_INT10, text):
        digits = text.lstrip("+-").lstrip("0")
        if len(digits) > _MAX_INT_CHARS:
            return _OutOfRange(text)
        return int(text)
    for rx, base in ((_INT8, 8), (_INT16, 16)):
        m = re.match(rx, text)
        if m:
            if len(m.group(1).lstrip("0")) > _MAX_INT_CHARS:
                return _OutOfRange(text)
            return int(m.group(1), base)
    return None


def _core_float(text: str) -> float | None:
    if re.match(_FLOAT, text):
        return float(text)
    m = re.match(_INF, text)
    if m:
        return float(f"{m.group(1)}inf")
    if re.match(_NAN, text):
        return float("nan")
    return None


def _plain(text: str) -> Any:
    """A plain (unquoted, untagged) scalar by the YAML 1.2 core schema."""
    if re.match(_NULL, text):
        return None
    if text in _BOOL:
        return _BOOL[text]
    value = _core_int(text)
    if value is not None:
        return value
    number = _core_float(text)
    if number is not None:
        return number
    return text


def _tagged(tag: str, text: str, event: Any, what: str) -> Any:
    """A scalar with an explicit core tag; the text must be a value of that type."""
    kind = tag[len(_CORE) :] if tag.startswith(_CORE) else None
    value: Any = None
    if kind == "str":
        return text
    if kind == "null":
        if re.match(_NULL, text):
            return None
    elif kind == "bool":
        if text in _BOOL:
            return _BOOL[text]
    elif kind == "int":
        value = _core_int(text)
    elif kind == "float":
        value = _core_int(text)
        value = float(value) if isinstance(value, int) else _core_float(text)
    else:
        raise InvalidError(f"{_line(event)}the YAML tag {tag_name(tag)} is not supported; {_TAGS}", path=what)
    if value is None:
        raise InvalidError(
            f"{_line(event)}{text[:40]!r} is not a value of the tag {tag_name(tag)}", path=what
        )
    return value


_TAGS = "only the JSON types are (!!str, !!int, !!float, !!bool, !!null, !!map, !!seq)"


def tag_name(tag: str) -> str:
    return "!!" + tag[len(_CORE) :] if tag.startswith(_CORE) else tag


def _unicode(text: str) -> str:
    """Join the UTF-16 surrogate pairs YAML's ``\\uXXXX`` escapes produce (JSON joins them too), so
    that a string survives a round trip through JSON; an unpaired one stays and is refused later."""
    try:
        return text.encode("utf-16", "surrogatepass").decode("utf-16")
    except UnicodeDecodeError:
        return text


class _Frame:
    """A collection being built: a list, or a mapping's pairs and its pending key."""

    __slots__ = ("anchor", "event", "height", "is_map", "items", "key", "size")

    def __init__(self, event: Any, is_map: bool) -> None:
        self.event = event
        self.anchor: str | None = event.anchor
        self.is_map = is_map
        self.items: list[Any] = []
        self.key: Any = _NO_KEY
        self.size = 1  # values and characters, aliases counted at each use
        self.height = 1


_NO_KEY = object()
_SURROGATE = "[\ud800-\udfff]"
# libyaml's parser when PyYAML was built with it (about 7 times faster), else PyYAML's own. Only the
# event stream is used, and both produce the same one.
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_yaml(text: str, *, what: str, max_depth: int, budget: int) -> Any:
    """The one document of ``text`` as JSON values (mappings are ``_Object``, with duplicates noted)."""
    from dispatch.model._decode import MAX_ALIAS_EXPANSION, _Object, _OutOfRange

    too_many = (
        f"the YAML aliases expand the document beyond its length plus {MAX_ALIAS_EXPANSION:,} "
        "values and characters"
    )
    anchors: dict[str, tuple[Any, int, int]] = {}  # anchor -> (value, expanded size, height)
    stack: list[_Frame] = []
    docs: list[Any] = []
    total = 0
    if re.search(_SURROGATE, text):  # not Unicode text (only a str can hold one): libyaml would raise
        raise InvalidError("not Unicode text: the document holds an unpaired surrogate", path=what)
    loader = _Loader(text)
    try:
        while True:
            try:
                event = loader.get_event()
            except yaml.YAMLError as exc:
                if "nesting depth" in str(exc):  # libyaml's own limit, deeper than ours
                    raise InvalidError(
                        f"nested too deeply to decode (more than {max_depth} levels)", path=what
                    ) from None
                raise InvalidError(f"not valid YAML: {_problem(exc)}", path=what) from None
            if event is None:
                break
            if isinstance(event, yaml.DocumentStartEvent):
                if docs:
                    raise InvalidError("expected exactly one YAML document", path=what)
                anchors.clear()
                continue
            if isinstance(event, yaml.StreamStartEvent | yaml.StreamEndEvent | yaml.DocumentEndEvent):
                continue
            value: Any
            size = 1
            height = 0
            anchor: str | None = None
            if isinstance(event, yaml.AliasEvent):
                if event.anchor not in anchors:
                    raise InvalidError(
                        f"{_line(event)}the alias *{event.anchor} names no complete anchor before it",
                        path=what,
                    )
                value, size, height = anchors[event.anchor]
            elif isinstance(event, yaml.ScalarEvent):
                anchor = event.anchor
                tag = event.tag
                if tag is None or tag == "!":
                    # Quoted, literal and folded scalars, and "!"-tagged ones, are strings.
                    value = _plain(event.value) if not event.style and tag is None else event.value
                else:
                    value = _tagged(tag, event.value, event, what)
                if type(value) is str:
                    if re.search(_SURROGATE, value):
                        value = _unicode(value)
                    size += len(value)
            elif isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent):
                is_map = isinstance(event, yaml.MappingStartEvent)
                want = "map" if is_map else "seq"
                if event.tag is not None and event.tag not in ("!", _CORE + want):
                    raise InvalidError(
                        f"{_line(event)}the YAML tag {tag_name(event.tag)} cannot tag a "
                        f"{'mapping' if is_map else 'sequence'}; {_TAGS}",
                        path=what,
                    )
                if len(stack) >= max_depth:
                    raise InvalidError(
                        f"nested too deeply to decode (more than {max_depth} levels)", path=what
                    )
                stack.append(_Frame(event, is_map))
                total += 1
                if total > budget:
                    raise InvalidError(too_many, path=what)
                continue
            elif isinstance(event, yaml.SequenceEndEvent | yaml.MappingEndEvent):
                frame = stack.pop()
                value = _Object(frame.items) if frame.is_map else frame.items
                size, height, anchor = frame.size, frame.height, frame.anchor
            else:  # pragma: no cover - PyYAML has no other events
                raise InvalidError(f"{_line(event)}unexpected YAML event", path=what)
            if isinstance(event, yaml.AliasEvent):
                total += size
                if total > budget:
                    raise InvalidError(too_many, path=what)
                if len(stack) + height > max_depth:
                    raise InvalidError(
                        f"nested too deeply to decode (more than {max_depth} levels)", path=what
                    )
            elif isinstance(event, yaml.ScalarEvent):
                total += size
            if anchor is not None:
                anchors[anchor] = (value, size, height)
            if not stack:
                docs.append(value)
                continue
            parent = stack[-1]
            parent.size += size
            parent.height = max(parent.height, height + 1)
            if not parent.is_map:
                parent.items.append(value)
            elif parent.key is _NO_KEY:
                if not isinstance(value, str) or isinstance(value, _OutOfRange):
                    raise InvalidError(
                        f"{_line(event)}mapping keys must be strings, got {_kind(value)}",
                        path=what,
                    )
                if value == "<<" and isinstance(event, yaml.ScalarEvent) and not event.style:
                    raise InvalidError(f"{_line(event)}merge keys (<<) are not supported", path=what)
                parent.key = value
            else:
                parent.items.append((parent.key, value))
                parent.key = _NO_KEY
    finally:
        loader.dispose()
    if len(docs) != 1:
        raise InvalidError("empty document: expected a mapping", path=what)
    return docs[0]


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int | float | str):
        text = str(value)  # an out-of-range literal is kept as its text
        return f"the number {text}" if len(text) <= 24 else "a number"
    return "a list" if isinstance(value, list) else "a mapping"


def _problem(exc: Exception) -> str:
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    return str(problem)
