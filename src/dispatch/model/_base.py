"""The one declaration of a value type, and everything derived from it.

A value type is a :class:`Model` (a frozen ``msgspec.Struct``): its fields are written once, with their
types, defaults and constraints (``Annotated[int, Meta(ge=1)]``), and from that single declaration come

- **decoding** (:func:`decode`, ``from_json``): ``msgspec`` converts the value in one C pass. When it
  refuses, or when the value holds something msgspec would let through but dispatch refuses (``null``,
  an integer beyond 64 bits, a non-finite number), the same declaration is walked again by
  :func:`_explain`, which applies the strict readers of :mod:`dispatch.model._decode` and raises the
  :class:`InvalidError` that names the path as users write it (``env["A B"]``, ``command[2]``). That
  walk is the reference: whatever it accepts is what the fast path returns, and it alone speaks to users.
  (Duplicate keys, depth and unpaired surrogates are refused by the text decoders, before either path.)
- **encoding** (:func:`encode`, ``to_json``): camelCase keys, absent optional fields omitted (never
  ``null``), extension types and epochs in their own forms.
- **the JSON Schema** (:func:`json_schema`): draft 2020-12, ``additionalProperties: false`` on every
  object with fixed keys, no ``null`` anywhere (the decoders refuse it).

Checks that span fields, or that no type can say, live in ``__post_init__``; they raise ``InvalidError``
with a path relative to the value, which the decoder prefixes with where the value sits.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, TypeVar

import msgspec
from msgspec import Struct

from dispatch.errors import InvalidError

__all__ = [
    "EMPTY_MAP",
    "Frozen",
    "FrozenList",
    "FrozenMap",
    "Int64",
    "Model",
    "check_declared",
    "custom_type",
    "decode",
    "decode_text",
    "encode",
    "encode_text",
    "frozen_json",
    "frozen_map",
    "json_schema",
]

M = TypeVar("M", bound="Model")

Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
"""An integer as JSON tools and Kubernetes read one: msgspec alone would take up to 2**64 - 1."""


class FrozenMap(dict[str, Any]):
    """A ``dict`` that refuses changes: the maps inside value types (``env``, ``labels``) are immutable,
    and stay ``dict`` so that msgspec encodes them without help."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("this mapping is immutable; build a new value instead")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def __repr__(self) -> str:
        return f"FrozenMap({dict.__repr__(self)})"

    def __reduce__(self) -> Any:
        return (FrozenMap, (dict(self),))


EMPTY_MAP: FrozenMap = FrozenMap()
"""The default of every map field: encoding omits a field equal to its default, so empty maps are
normalised to this one instance."""


class FrozenList(list[Any]):
    """A ``list`` that refuses changes (inside an unknown extension's value), as :class:`FrozenMap`."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("this list is immutable; build a new value instead")

    __setitem__ = __delitem__ = append = extend = insert = pop = remove = clear = sort = reverse = _refuse
    __iadd__ = __imul__ = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self))

    def __reduce__(self) -> Any:
        return (FrozenList, (list(self),))


def frozen_json(value: Any) -> Any:
    """A deep copy of a JSON value that cannot be changed: maps and lists become their frozen kinds."""
    if isinstance(value, Mapping):
        return FrozenMap({k: frozen_json(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return FrozenList(frozen_json(v) for v in value)
    return value


def frozen_map(value: Mapping[str, Any]) -> FrozenMap:
    """``value`` as an immutable map (:data:`EMPTY_MAP` when empty)."""
    if type(value) is FrozenMap:
        return value if value else EMPTY_MAP
    return FrozenMap(value) if value else EMPTY_MAP


class Frozen:
    """Base of the few immutable values whose JSON form is not an object of their fields (an epoch's
    ``"N.R"``, the config's store choice): set once in ``__init__`` with :meth:`_set`, compared and
    hashed by their ``__slots__``."""

    __slots__ = ()

    def _set(self, **values: Any) -> None:
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def _key(self) -> tuple[Any, ...]:
        names: tuple[str, ...] = type(self).__slots__  # always a tuple here
        return tuple(getattr(self, name) for name in names)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable: cannot set {name!r}")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, Frozen)
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __reduce__(self) -> Any:
        return (type(self), self._key())


class Model(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel", omit_defaults=True):
    """Base of dispatch's value types: immutable, compared by value, with a strict JSON form."""

    json_what: ClassVar[str] = "field"
    """How an unknown key is called in errors ("unknown field", "unknown setting")."""
    json_path: ClassVar[str] = ""
    """Where errors say a value decoded on its own sits ("plan.notBefore")."""
    json_unknown_first: ClassVar[bool] = False
    """Refuse an unknown key before a missing one (a config file: a typo names the key it misspells)."""

    def to_json(self) -> dict[str, Any]:
        """The JSON form (camelCase keys; absent optional fields are omitted, never ``null``)."""
        out: dict[str, Any] = encode(self)
        return out

    @classmethod
    def from_json(cls: type[M], value: Any, path: str | None = None) -> M:
        """Decode the JSON form (already parsed) strictly; ``InvalidError`` names the offending path
        (within ``path``, by default the type's :attr:`json_path`)."""
        return decode(cls, value, cls.json_path if path is None else path)

    def replace(self: M, **changes: Any) -> M:
        """A copy with ``changes`` applied (by Python field name), checked like a new value."""
        return msgspec.structs.replace(self, **changes)


# --- custom types: values whose JSON form is not an object of their fields ------------------------------


class _Custom(Struct, frozen=True):
    decode: Callable[[Any, str], Any]  # (JSON value, path) -> value; raises InvalidError
    encode: Callable[[Any], Any]
    schema: Callable[[], dict[str, Any]]


_CUSTOM: dict[type, _Custom] = {}


def custom_type(
    cls: type,
    *,
    decode: Callable[[Any, str], Any],
    encode: Callable[[Any], Any],
    schema: Callable[[], dict[str, Any]],
) -> None:
    """Teach the codec a type msgspec does not know (an epoch's ``"N.R"``, the extensions map)."""
    _CUSTOM[cls] = _Custom(decode, encode, schema)


def _custom(cls: type) -> _Custom:
    for klass in cls.__mro__:
        found = _CUSTOM.get(klass)
        if found is not None:
            return found
    raise TypeError(f"{cls.__qualname__} is not a type the model codec knows")


def _dec_hook(cls: type, value: Any) -> Any:
    return _custom(cls).decode(value, "")


def _enc_hook(value: Any) -> Any:
    return _custom(type(value)).encode(value)


def encode(value: Any) -> Any:
    """The plain JSON value (dicts, lists, strings, numbers, booleans) of ``value``, keys sorted."""
    # Through JSON text rather than msgspec.to_builtins, which keeps tuples as tuples: two C passes.
    return msgspec.json.decode(encode_text(value))


def encode_text(value: Any) -> bytes:
    """The canonical JSON text of ``value``: compact, keys sorted."""
    return msgspec.json.encode(value, enc_hook=_enc_hook, order="sorted")


# --- decoding ------------------------------------------------------------------------------------------


def decode(cls: type[M], value: Any, path: str = "") -> M:
    """Decode an already parsed JSON value into ``cls`` strictly (see the module docstring)."""
    if _plain(value):
        try:
            return msgspec.convert(value, cls, strict=True, dec_hook=_dec_hook)
        except (msgspec.ValidationError, InvalidError):
            pass  # _explain says why, with the path as users write it (or accepts what msgspec could not)
    result: M = _explain(_type_info(cls), value, path)
    return result


def decode_text(cls: type[M], text: str | bytes, what: str, *, max_depth: int, fresh: bool = False) -> M:
    """Decode JSON text written by dispatch (a stored record) in one pass, when it is exactly the text
    dispatch writes for the value it decodes to (:func:`encode_text`). Any other text — not dispatch's
    canonical form (an older version's, an edited row), or one that does not decode — is read again by
    the strict decoders, which refuse what they refuse in any document (``null``, a duplicate key, a
    64-bit overflow) and name the path. ``fresh``: the text is :func:`encode_text`'s output of a
    moment ago, canonical by construction (a store checking what it is about to write)."""
    raw = text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
    try:
        # An integer field is Int64; an integer in a number field re-encodes as a float (not canonical).
        value = msgspec.json.decode(raw, type=cls, strict=True, dec_hook=_dec_hook)
        if fresh or encode_text(value) == raw:
            return value
    except (msgspec.ValidationError, msgspec.DecodeError, InvalidError):
        pass
    from dispatch.model._decode import load_json

    return decode(cls, load_json(text, what=what, max_depth=max_depth))


def _plain(value: Any) -> bool:
    """Whether msgspec may decode ``value`` as it is: nothing in it that msgspec would accept and the
    strict readers refuse. False sends the value to :func:`_explain`.

    msgspec accepts ``null`` for an optional field (dispatch refuses it: it would silently mean
    "default"), non-finite numbers (its encoder writes them as ``null``) and integers up to 2**64
    (dispatch's are 64-bit signed); one C pass over the value finds them all. A string that says
    "null" or holds 19 digits in a row is a false alarm that costs only time. Duplicate keys and
    unpaired surrogates are refused by the text decoders already."""
    try:
        text = msgspec.json.encode(value)
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
        return False
    return b"null" not in text and re.search(_LONG_NUMBER, text) is None


_LONG_NUMBER = rb"[0-9]{19}"


_INFO: dict[type, Any] = {}


def _type_info(cls: type) -> Any:
    info = _INFO.get(cls)
    if info is None:
        import msgspec.inspect as mi  # deferred: only a refusal needs it

        info = _INFO[cls] = mi.type_info(cls)
    return info


def check_declared(value: Model) -> None:
    """Check a value built in Python against its declared field types and constraints, as decoding
    does (msgspec checks them only when it decodes): for the types whose ``__post_init__`` calls it."""
    for field in _type_info(type(value)).fields:
        current = getattr(value, field.name)
        if current is not None and current is not field.default:
            _explain(field.type, current, field.encode_name)


def _explain(t: Any, value: Any, path: str, expected: str | None = None) -> Any:
    """Decode ``value`` as the msgspec type description ``t`` with the strict readers, raising the
    ``InvalidError`` users see. ``expected`` words a refused constraint (``Meta(extra={"expected":
    ...})``)."""
    import msgspec.inspect as mi

    from dispatch.model import _decode as d

    if isinstance(t, mi.Metadata):
        return _explain(t.type, value, path, (t.extra or {}).get("expected", expected))
    if isinstance(t, mi.StructType | mi.CustomType) and isinstance(value, t.cls):
        return value  # built in Python: it checked itself when it was made
    if isinstance(t, mi.StructType):
        cls = t.cls
        f = d.Fields(value, path, what=getattr(cls, "json_what", "field"))
        if getattr(cls, "json_unknown_first", False):
            for field in t.fields:
                f.allow(field.encode_name)
            f.done()
        kwargs: dict[str, Any] = {}
        for field in t.fields:
            if field.required:
                kwargs[field.name] = f.required(field.encode_name, _reader(field.type))
            elif f.has(field.encode_name):
                kwargs[field.name] = f.optional(field.encode_name, _reader(field.type), None)
            else:
                f.allow(field.encode_name)  # known, absent, defaulted
        f.done()
        try:
            return cls(**kwargs)
        except InvalidError as exc:
            raise InvalidError(exc.detail, path=_within(path, exc.path)) from None
    if isinstance(t, mi.UnionType):
        return _union(t, value, path)
    if isinstance(t, mi.StrType):
        return _bounded(t, d.as_str(value, path), path, expected)
    if isinstance(t, mi.BoolType):
        return d.as_bool(value, path)
    if isinstance(t, mi.IntType):
        return _bounded(t, d.as_int(value, path), path, expected)
    if isinstance(t, mi.FloatType):
        return _bounded(t, d.as_number(value, path), path, expected)
    if isinstance(t, mi.EnumType):
        return d.as_enum(t.cls, value, path)
    if isinstance(t, mi.LiteralType):
        text = d.as_str(value, path)
        if text not in t.values:
            allowed = ", ".join(repr(v) for v in t.values)
            raise InvalidError(f"unknown value {text!r}; expected one of {allowed}", path=path or "document")
        return text
    if isinstance(t, mi.ListType | mi.VarTupleType | mi.SetType | mi.FrozenSetType):
        items = d.as_list(value, path, _reader(t.item_type))
        _length(t, items, path, expected)
        kind = {mi.ListType: list, mi.VarTupleType: tuple, mi.SetType: set, mi.FrozenSetType: frozenset}
        return kind[type(t)](items)
    if isinstance(t, mi.DictType):
        obj = d.as_object(value, path)
        out: dict[Any, Any] = {}
        for k, v in obj.items():
            where = d.key_path(path, k)
            key = _explain(t.key_type, k, where)
            out[key] = _explain(t.value_type, v, where)
        _length(t, out, path, expected)
        return out
    if isinstance(t, mi.CustomType):
        return _custom(t.cls).decode(value, path)
    if isinstance(t, mi.AnyType):
        return d.check_plain(value, path)
    raise TypeError(f"the model codec cannot decode {t!r}")  # a declaration error, found by the tests


def _reader(t: Any) -> Callable[[Any, str], Any]:
    return lambda value, path: _explain(t, value, path)


def _within(path: str, inner: str | None) -> str | None:
    """The path of ``inner`` (relative to a value) inside the document, the value being at ``path``."""
    if not inner:
        return path or None
    if not path:
        return inner
    return f"{path}{inner}" if inner.startswith("[") else f"{path}.{inner}"


def _union(t: Any, value: Any, path: str) -> Any:
    import msgspec.inspect as mi

    from dispatch.model import _decode as d

    options = [o for o in t.types if not isinstance(o, mi.NoneType)]
    if len(options) == 1:
        return _explain(options[0], value, path)
    # A union of one string-like and one object-like type (a rule is "fail" or {"action": ...}).
    textual = (mi.StrType, mi.EnumType, mi.LiteralType, mi.CustomType)
    if value is not None:
        for o in options:
            if isinstance(value, str) == isinstance(o, textual):
                return _explain(o, value, path)
    return d.as_str(value, path)  # refuses null, or the wrong type, in the shared words


def _bounded(t: Any, value: Any, path: str, expected: str | None) -> Any:
    where = path or "document"
    try:
        return _within_bounds(t, value, where)
    except InvalidError:
        if expected is None:
            raise
        raise InvalidError(f"{_shown(value)} is not {expected}", path=where) from None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _within_bounds(t: Any, value: Any, where: str) -> Any:
    path = where
    ge, gt, le, lt = (getattr(t, k, None) for k in ("ge", "gt", "le", "lt"))
    if isinstance(value, str):
        _length(t, value, path)
        pattern = getattr(t, "pattern", None)
        if pattern is not None and not re.search(pattern, value):
            raise InvalidError(f"{value[:80]!r} does not match the pattern {pattern}", path=where)
        return value
    if ge is not None and value < ge:
        raise InvalidError(f"must be at least {ge}, got {value}", path=where)
    if gt is not None and value <= gt:
        raise InvalidError(f"must be more than {gt}, got {value}", path=where)
    if le is not None and value > le:
        raise InvalidError(f"must be at most {le}, got {value}", path=where)
    if lt is not None and value >= lt:
        raise InvalidError(f"must be less than {lt}, got {value}", path=where)
    return value


def _length(t: Any, value: Any, path: str, expected: str | None = None) -> None:
    low, high = getattr(t, "min_length", None), getattr(t, "max_length", None)
    outside = (low is not None and len(value) < low) or (high is not None and len(value) > high)
    if expected is not None and not isinstance(value, str) and outside:
        raise InvalidError(f"expected {expected}, got {len(value)}", path=path or "document")
    if low is not None and len(value) < low:
        raise InvalidError(
            "must not be empty" if low == 1 else f"must have at least {low} items", path=path or "document"
        )
    if high is not None and len(value) > high:
        raise InvalidError(
            f"must have at most {high} {'characters' if isinstance(value, str) else 'items'}",
            path=path or "document",
        )


# --- schema --------------------------------------------------------------------------------------------


def json_schema(cls: type, *, title: str, description: str, id: str | None = None) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of ``cls``'s JSON form, derived from its declaration: every
    definition inlined, ``null`` removed (the decoders refuse it), ``additionalProperties: false`` on
    every object with fixed keys."""
    raw = msgspec.json.schema(cls, schema_hook=lambda t: _custom(t).schema())
    defs = raw.get("$defs", {})
    top = _inline(raw, defs)
    out: dict[str, Any] = {"$schema": "https://json-schema.org/draft/2020-12/schema"}
    if id is not None:
        out["$id"] = id
    out |= {"title": title, "description": description}
    out.update(top)
    return out


def _inline(node: Any, defs: Mapping[str, Any]) -> Any:
    if isinstance(node, list | tuple):
        return [_inline(v, defs) for v in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = dict(defs[node["$ref"].rsplit("/", 1)[-1]])
        target.pop("title", None)
        target.pop("description", None)  # the class docstring, written for Python readers
        rest = {k: v for k, v in node.items() if k != "$ref"}
        return _inline({**target, **rest}, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$defs":
            continue
        if key == "anyOf":
            options = [o for o in value if o != {"type": "null"}]
            if len(options) == 1:
                out.update(_inline(options[0], defs))
                continue
            value = options
        if key == "default" and value is None:
            continue
        if key == "required" and not value:
            continue
        out[key] = _inline(value, defs)
    return out
