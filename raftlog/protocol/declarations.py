"""How a Kafka message is declared and what it decodes to.

Every API is declared once (see ``schemas.py``) as a tree of :class:`Field` objects whose
``versions`` strings use the notation of Kafka's own message JSON ("0+", "3-5", "none");
:class:`Api` bundles an API's key, implemented versions and request/response trees. A decoded
body is a frozen :class:`Struct`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

# ---------------------------------------------------------------------------------------------
# Version ranges


@dataclass(frozen=True, slots=True)
class VersionRange:
    """An inclusive version range; ``high`` is None for an open-ended range ("3+")."""

    low: int
    high: int | None

    @classmethod
    def parse(cls, text: str | None) -> VersionRange:
        if text is None or text == "none":
            return cls(1, 0)  # empty
        if text.endswith("+"):
            return cls(int(text[:-1]), None)
        if "-" in text:
            low, high = text.split("-")
            return cls(int(low), int(high))
        return cls(int(text), int(text))

    def __contains__(self, version: object) -> bool:
        assert isinstance(version, int)
        return version >= self.low and (self.high is None or version <= self.high)


# ---------------------------------------------------------------------------------------------
# Frozen struct values


class Struct:
    """An immutable decoded message or nested struct with attribute access.

    The decoded values are the instance's ``__dict__`` itself, so ``body.acks`` is an ordinary
    attribute lookup. A ``__getattr__`` over a private dict (the earlier design) cost 0.76 us
    an access against 0.03 us: the failed normal lookup raised an AttributeError first, on
    every field of every request. Field names therefore must not shadow the methods below
    (``FIELD_NAMES_RESERVED``: ``Field`` refuses such a name when it is declared)."""

    def __init__(self, values: dict[str, Any]) -> None:
        object.__setattr__(self, "__dict__", values)

    @property
    def _values(self) -> dict[str, Any]:
        """The decoded values (the instance dict; Struct's own methods read it directly)."""
        return self.__dict__

    if TYPE_CHECKING:  # for the type checker only: at run time a missing field is the
        # ordinary AttributeError of an instance without that attribute
        def __getattr__(self, name: str) -> Any: ...

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Struct is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("Struct is immutable")

    def __getitem__(self, name: str) -> Any:
        return self.__dict__[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self.__dict__.get(name, default)

    def replace(self, **changes: Any) -> Struct:
        """A copy with ``changes`` (decoded values: nested structs, tuples) in place."""
        return Struct({**self.__dict__, **changes})

    def to_dict(self) -> dict[str, Any]:
        """A deep, mutable copy (structs become dicts, tuples become lists)."""
        return {key: _unfreeze(value) for key, value in self.__dict__.items()}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Struct) and self.__dict__ == other.__dict__

    def __hash__(self) -> int:
        return hash(tuple(self.__dict__.items()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{key}={value!r}" for key, value in self.__dict__.items())
        return f"Struct({inner})"


# Struct's own attributes: a field of one of these names would shadow them (its value sits in
# the instance __dict__, which ordinary lookup reads before the class's methods).
FIELD_NAMES_RESERVED = frozenset(name for name in vars(Struct) if not name.startswith("__"))


def _unfreeze(value: Any) -> Any:
    if isinstance(value, Struct):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_unfreeze(item) for item in value]
    return value


# ---------------------------------------------------------------------------------------------
# Declarations


@dataclass(frozen=True)
class Field:
    """One field of a message, declared like Kafka's message JSON.

    ``type`` is a primitive name ("int32", "string", "records", "[]int32", ...), a list of
    Fields (an array of structs) or a tuple of Fields (a single nested struct).
    """

    name: str
    type: str | list[Field] | tuple[Field, ...]
    versions: str = "0+"
    nullable: str | None = None
    tag: int | None = None
    tagged: str | None = None
    default: Any = None

    def __post_init__(self) -> None:
        if self.name in FIELD_NAMES_RESERVED:
            raise ValueError(f"field name {self.name!r} would shadow Struct.{self.name}")

    @property
    def version_range(self) -> VersionRange:
        return VersionRange.parse(self.versions)

    def is_nullable(self, version: int) -> bool:
        return self.nullable is not None and version in VersionRange.parse(self.nullable)

    def is_tagged(self, version: int) -> bool:
        return self.tag is not None and version in VersionRange.parse(self.tagged or self.versions)



@dataclass(frozen=True, eq=False)
class Api:
    """A Kafka API: its key, the versions this broker implements, and its schemas."""

    key: int
    name: str
    min_version: int
    max_version: int
    flexible: str
    request: list[Field]
    response: list[Field]
    # Versions advertised but answered with UNSUPPORTED_VERSION (Produce 0-2, see KAFKA-18659).
    rejected: frozenset[int] = field(default_factory=frozenset)
    # Broker-to-controller APIs: served, but not advertised to clients in ApiVersions.
    internal: bool = False
    # Versions above this are served but not advertised (AddPartitionsToTxn v4+ is for
    # brokers only); None advertises up to max_version.
    advertised_max_version: int | None = None

    @property
    def advertised_max(self) -> int:
        limit = self.advertised_max_version
        return self.max_version if limit is None else min(limit, self.max_version)

    def is_flexible(self, version: int) -> bool:
        return version in _version_range(self.flexible)

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version


@functools.cache
def _version_range(text: str | None) -> VersionRange:
    """``VersionRange.parse``, once per distinct text (asked twice for every request)."""
    return VersionRange.parse(text)
