"""Typed conversion between frozen dataclasses and CBOR, driven by the dataclass annotations.

Records, images and snapshots all go through these two functions, so every byte the metadata layer
reads back is checked against the same annotations it was written from. Supported annotations:
``int``, ``bool``, ``float``, ``str``, ``bytes``, ``None`` and unions of them, ``tuple[T, ...]``,
``tuple[A, B]``, ``Mapping[K, V]`` (decoded as a read-only ``MappingProxyType``) and nested frozen
dataclasses. Anything else is a programming error and fails loudly.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import types
import typing
from collections.abc import Mapping
from typing import Any

import cbor2

# Why a cap: a corrupt length prefix inside CBOR must not make us build a huge nested structure.
CBOR_DEPTH_MAX = 64


class CodecError(ValueError):
    """Bytes or values that do not match the declared schema."""


def dumps(plain: object) -> bytes:
    """Encode a plain value (see :func:`to_plain`) as canonical CBOR.

    Canonical encoding sorts map keys, so equal values give equal bytes on every node.
    """
    return cbor2.dumps(plain, canonical=True)


def loads(data: bytes) -> object:
    """Decode exactly one CBOR item that spans all of ``data``."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CodecError(f"expected bytes, got {type(data).__name__}")
    stream = io.BytesIO(data)
    decoder = cbor2.CBORDecoder(stream, allow_duplicate_keys=False, max_depth=CBOR_DEPTH_MAX)
    try:
        plain = decoder.decode()
    except (cbor2.CBORError, ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise CodecError(f"invalid CBOR: {exc}") from exc
    if stream.tell() != len(data):
        raise CodecError(f"{len(data) - stream.tell()} trailing bytes after the CBOR item")
    return plain


def to_plain(value: object) -> object:
    """Turn a dataclass tree into dicts, lists and scalars that CBOR can encode."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [to_plain(item) for item in value]
    if isinstance(value, Mapping):
        return {key: to_plain(item) for key, item in value.items()}
    assert value is None or isinstance(value, int | float | str | bytes), type(value)
    return value


def from_plain(hint: Any, plain: object, path: str) -> Any:
    """Rebuild a value of type ``hint`` from ``plain``, checking every type on the way.

    Raises:
        CodecError: ``plain`` does not match ``hint``; the message names the path.
    """
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _dataclass_from_plain(hint, plain, path)
    if hint in (int, bool, float, str, bytes, type(None)):
        return _scalar_from_plain(hint, plain, path)
    origin = typing.get_origin(hint)
    if origin is types.UnionType or origin is typing.Union:
        return _union_from_plain(typing.get_args(hint), plain, path)
    if origin is tuple:
        return _tuple_from_plain(typing.get_args(hint), plain, path)
    if origin is Mapping:
        key_hint, value_hint = typing.get_args(hint)
        return _mapping_from_plain(key_hint, value_hint, plain, path)
    raise AssertionError(f"unsupported annotation {hint!r} at {path}")


def field_hints(cls: type) -> dict[str, Any]:
    """Resolved annotations of a dataclass's fields, in declaration order."""
    return _field_hints(cls)


@functools.cache
def _field_hints(cls: Any) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {field.name: hints[field.name] for field in dataclasses.fields(cls)}


def _scalar_from_plain(hint: type, plain: object, path: str) -> object:
    # Exact type check: bool is an int subclass, and a bool where an int belongs is a bug.
    if type(plain) is not hint:
        if hint is bytes and isinstance(plain, bytearray):
            return bytes(plain)
        raise CodecError(f"{path}: expected {hint.__name__}, got {type(plain).__name__}")
    return plain


def _union_from_plain(args: tuple[Any, ...], plain: object, path: str) -> object:
    errors = []
    for arg in args:
        try:
            return from_plain(arg, plain, path)
        except CodecError as exc:
            errors.append(str(exc))
    raise CodecError(f"{path}: matches none of the union members ({'; '.join(errors)})")


def _tuple_from_plain(args: tuple[Any, ...], plain: object, path: str) -> tuple[object, ...]:
    if not isinstance(plain, list | tuple):
        raise CodecError(f"{path}: expected an array, got {type(plain).__name__}")
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(from_plain(args[0], item, f"{path}[{i}]") for i, item in enumerate(plain))
    if len(plain) != len(args):
        raise CodecError(f"{path}: expected {len(args)} items, got {len(plain)}")
    return tuple(
        from_plain(arg, item, f"{path}[{i}]")
        for i, (arg, item) in enumerate(zip(args, plain, strict=True))
    )


def _mapping_from_plain(
    key_hint: Any, value_hint: Any, plain: object, path: str
) -> Mapping[object, object]:
    if not isinstance(plain, dict):
        raise CodecError(f"{path}: expected a map, got {type(plain).__name__}")
    result = {
        from_plain(key_hint, key, f"{path}.<key>"): from_plain(value_hint, item, f"{path}[{key!r}]")
        for key, item in plain.items()
    }
    return types.MappingProxyType(result)


def _dataclass_from_plain(cls: type, plain: object, path: str) -> object:
    if not isinstance(plain, dict):
        raise CodecError(f"{path}: expected a map for {cls.__name__}, got {type(plain).__name__}")
    hints = field_hints(cls)
    missing = sorted(set(hints) - set(plain))
    extra = sorted(str(key) for key in set(plain) - set(hints))
    if missing or extra:
        raise CodecError(f"{path}: {cls.__name__} fields missing {missing}, unexpected {extra}")
    values = {name: from_plain(hint, plain[name], f"{path}.{name}") for name, hint in hints.items()}
    return cls(**values)
