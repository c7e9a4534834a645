"""The public declaration kit: what an adapter needs to declare its settings (and extensions) once.

An adapter declares each settings type as a :class:`Model` (a frozen msgspec Struct whose JSON keys are
the camelCase names); decoding with paths in errors, encoding and the JSON Schema derive from that
declaration. This module is the one place adapters import those tools from: the modules behind it
(``_base``, ``_decode``) are private and may change.
"""

from __future__ import annotations

import re
from typing import Any

from dispatch.errors import InvalidError
from dispatch.model._base import EMPTY_MAP, Model, check_declared, custom_type, frozen_map, json_schema
from dispatch.model._decode import as_str, key_path, load_json

__all__ = [
    "DURATION",
    "EMPTY_MAP",
    "Duration",
    "Model",
    "as_str",
    "check_declared",
    "custom_type",
    "frozen_map",
    "json_schema",
    "key_path",
    "load_json",
    "parse_duration",
]

DURATION = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
"""The pattern of a duration string (shared by the parser and the schema, so the two agree)."""

_DURATION_RE = DURATION
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)"


def parse_duration(text: str, path: str = "duration") -> float:
    """Seconds in a duration string such as ``"10s"``, ``"1m"``, ``"1m30s"``, ``"1500ms"``."""
    if len(text) > 64 or not re.match(_DURATION_RE, text):
        raise InvalidError(
            f'{text[:80]!r} is not a duration: write a number and a unit (ms, s, m, h), e.g. "10s", "1m30s"',
            path=path,
        )
    return sum(float(n) * _UNITS[u] for n, u in re.findall(_DURATION_PART, text))


class Duration(float):
    """Seconds, written as a duration string (``"10s"``, ``"1m30s"``); its JSON form is that string."""

    text: str

    def __new__(cls, text: str, path: str = "duration") -> Duration:
        value = super().__new__(cls, parse_duration(text, path))
        value.text = text
        return value

    def __reduce__(self) -> Any:
        return (Duration, (self.text,))


custom_type(
    Duration,
    decode=lambda value, path: Duration(as_str(value, path or "duration"), path or "duration"),
    encode=lambda value: value.text,
    schema=lambda: {"type": "string", "maxLength": 64, "pattern": DURATION},
)
