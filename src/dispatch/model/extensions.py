"""Extensions: typed, namespaced additions to a :class:`~dispatch.model.JobSpec`.

Each extension type has a name ``"<namespace>/<Type>"`` (``NAME``) and a strict JSON form. Types are
registered so JSON can be decoded into typed values; an unknown name decodes into an
:class:`OpaqueExtension`, which every backend refuses with ``UnsupportedError``, naming it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, TypeVar

from dispatch.errors import InvalidError
from dispatch.model._base import Model, custom_type, encode, frozen_json
from dispatch.model._decode import Fields, check_plain, key_path

__all__ = [
    "EMPTY_EXTENSIONS",
    "Extension",
    "Extensions",
    "Image",
    "OpaqueExtension",
    "SharedCheckpoint",
    "extension_types",
    "register_extension",
]

_NAME = r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?/[A-Z][A-Za-z0-9]*\Z"

X = TypeVar("X", bound="Extension")


class Extension:
    """Base class of extension types. Subclasses are :class:`~dispatch.model.Model` types (frozen
    msgspec structs) that set ``NAME``; their JSON form and schema come from their fields."""

    __slots__ = ()
    NAME: ClassVar[str]

    def to_json(self) -> Any:
        raise NotImplementedError

    @classmethod
    def from_json(cls: type[X], value: Any, path: str) -> X:
        raise NotImplementedError


_REGISTRY: dict[str, type[Extension]] = {}


def register_extension(cls: type[X]) -> type[X]:
    """Register an extension type (usable as a class decorator). Re-registering the same class is a
    no-op; registering another class under a taken name is refused."""
    name = getattr(cls, "NAME", None)
    if not isinstance(name, str) or not re.match(_NAME, name):
        raise InvalidError(
            f'extension name {name!r} must look like "<namespace>/<Type>" (e.g. "acme/Thing")',
            path=f"{cls.__qualname__}.NAME",
        )
    existing = _REGISTRY.get(name)
    if existing is not None and existing is not cls and existing.__qualname__ != cls.__qualname__:
        raise InvalidError(f"extension {name!r} is already registered by {existing.__qualname__}")
    _REGISTRY[name] = cls
    return cls


def extension_types() -> Mapping[str, type[Extension]]:
    """The registered extension types by name."""
    return dict(_REGISTRY)


class OpaqueExtension(Extension):
    """An extension whose type is not registered in this process: kept verbatim (and immutable),
    refused by backends."""

    __slots__ = ("name", "value")
    name: str
    value: Any

    def __init__(self, name: str, value: Any) -> None:
        # Checked here, not only when decoded: a value built in Python (a NaN, a tuple key) would
        # otherwise be stored and then refused when the record is read back.
        checked = check_plain(value, key_path("extensions", name))
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "value", frozen_json(checked))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"OpaqueExtension is immutable: cannot set {name!r}")

    @property
    def NAME(self) -> str:  # type: ignore[override]
        return self.name

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OpaqueExtension):
            return NotImplemented
        return (self.name, self.value) == (other.name, other.value)

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"OpaqueExtension(name={self.name!r}, value={self.value!r})"

    def __reduce__(self) -> Any:
        return (OpaqueExtension, (self.name, self.value))

    def to_json(self) -> Any:
        """The value as plain JSON; ``InvalidError`` naming the extension when it is not JSON."""
        return check_plain(self.value, key_path("extensions", self.name))


@register_extension
class Image(Model, Extension, frozen=True):
    """``dispatch/Image``: the container image the job runs with."""

    NAME: ClassVar[str] = "dispatch/Image"
    ref: str

    def __post_init__(self) -> None:
        if not isinstance(self.ref, str) or not self.ref.strip():
            raise InvalidError("expected a non-empty image reference", path="ref")


@register_extension
class SharedCheckpoint(Model, Extension, frozen=True):
    """``dispatch/SharedCheckpoint``: an absolute directory every node of every incarnation sees.

    The job gets ``DISPATCH_CHECKPOINT_DIR`` set to it. How it is provided is the adapter's business.
    """

    NAME: ClassVar[str] = "dispatch/SharedCheckpoint"
    ENV: ClassVar[str] = "DISPATCH_CHECKPOINT_DIR"
    """The variable every node of the job sees, set to ``dir``."""
    dir: str

    def __post_init__(self) -> None:
        if not isinstance(self.dir, str) or not self.dir.startswith("/"):
            raise InvalidError(f"expected an absolute directory, got {self.dir!r}", path="dir")


class Extensions(Mapping[str, Extension]):
    """An immutable set of extensions, at most one per name, looked up by name or by type.

    >>> ext = Extensions([Image("pytorch/pytorch:2.5")]); ext[Image].ref
    """

    __slots__ = ("_items",)

    def __init__(self, items: Any = ()) -> None:
        values = items.values() if isinstance(items, Mapping) else items
        if isinstance(values, str | bytes) or not hasattr(values, "__iter__"):
            raise InvalidError(
                f"expected a list of extension values, got {type(items).__name__}", path="extensions"
            )
        found: dict[str, Extension] = {}
        for item in values:
            if not isinstance(item, Extension):
                raise InvalidError(
                    f"expected an extension value, got {type(item).__name__}", path="extensions"
                )
            name = item.NAME
            if name in found:
                raise InvalidError("at most one value per extension name", path=key_path("extensions", name))
            found[name] = item
        self._items = dict(sorted(found.items()))

    def __getitem__(self, key: str | type[X]) -> Any:
        name = key if isinstance(key, str) else key.NAME
        return self._items[name]

    def get(self, key: Any, default: Any = None) -> Any:
        name = key if isinstance(key, str) else key.NAME
        return self._items.get(name, default)

    def __contains__(self, key: object) -> bool:
        name = key if isinstance(key, str) else getattr(key, "NAME", None)
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Extensions):
            return self._items == other._items
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self._items))

    def __repr__(self) -> str:
        return f"Extensions({list(self._items.values())!r})"

    def opaque(self) -> list[str]:
        """Names of the extensions whose type is unknown in this process."""
        return [n for n, v in self._items.items() if isinstance(v, OpaqueExtension)]

    def to_json(self) -> dict[str, Any]:
        return {name: value.to_json() for name, value in self._items.items()}

    def __reduce__(self) -> Any:
        return (Extensions, (list(self._items.values()),))

    @classmethod
    def from_json(cls, value: Any, path: str = "extensions") -> Extensions:
        f = Fields(value, path)
        items: list[Extension] = []
        for name in list(f.obj):
            where = key_path(path, name)
            raw = f.obj[name]
            if not re.match(_NAME, name):
                raise InvalidError(
                    'extension names look like "<namespace>/<Type>" (e.g. "dispatch/Image")', path=where
                )
            ext_type = _REGISTRY.get(name)
            if ext_type is None:
                items.append(OpaqueExtension(name, check_plain(raw, where)))
            else:
                items.append(ext_type.from_json(raw, where))
        return cls(items)


EMPTY_EXTENSIONS = Extensions()
"""The default of :attr:`JobSpec.extensions` (encoding omits a field equal to its default)."""

custom_type(
    Extensions,
    decode=lambda value, path: Extensions.from_json(value, path or "extensions"),
    encode=lambda value: encode(value.to_json()),
    schema=lambda: {
        "type": "object",
        "description": 'Extensions by name ("<namespace>/<Type>"): each value is that type\'s JSON form.',
        "propertyNames": {"pattern": _NAME.removesuffix("\\Z").join("^$")},
    },
)
