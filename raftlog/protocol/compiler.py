"""Compiles a declared field tree, for one (API, version, direction), into a flat list of
pre-bound primitive readers and writers, so the per-request cost is a loop over functions.

Flexible versions end every struct with a tagged-field buffer: unknown tags are skipped on
decode, as KIP-482 requires, and tagged fields at their default are omitted on encode.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from raftlog.protocol.declarations import Api, Field, Struct
from raftlog.protocol.primitives import (
    WRITE_FAILURES,
    DecodeError,
    EncodeError,
    Output,
    Reader,
    Writer,
    array_reader,
    array_writer,
    field_error,
    message_writer,
    primitive_codec,
    read_uvarint,
    string_reader,
    write_uvarint,
)

_ZERO_DEFAULTS: dict[str, Any] = {
    "int8": 0,
    "int16": 0,
    "uint16": 0,
    "int32": 0,
    "uint32": 0,
    "int64": 0,
    "float64": 0.0,
    "bool": False,
    "uuid": uuid.UUID(int=0),
    "string": "",
    "bytes": b"",
    "records": None,
}


@dataclass(frozen=True)
class Compiled:
    """A struct compiled for one version: regular fields in order, tagged fields by tag."""

    fields: tuple[tuple[str, Reader, Writer, Callable[[], Any]], ...]
    tagged: dict[int, tuple[str, Reader, Writer, Callable[[], Any]]]
    flexible: bool
    # Fields declared for other versions: decoded structs carry them at their default, so
    # handlers read every field the same way whatever version the client spoke.
    absent: tuple[tuple[str, Callable[[], Any]], ...] = ()


def _field_codec(f: Field, version: int, flexible: bool) -> tuple[Reader, Writer]:
    nullable = f.is_nullable(version)
    if f.type == "string" and f.name.endswith("error_message"):
        return string_reader(flexible, nullable), message_writer(flexible, nullable)
    if isinstance(f.type, list):
        inner = _compile_struct(tuple(f.type), version, flexible)
        return (
            array_reader(struct_reader(inner), flexible, nullable),
            array_writer(struct_writer(inner), flexible, nullable),
        )
    if isinstance(f.type, tuple):
        inner = _compile_struct(f.type, version, flexible)
        return struct_reader(inner), struct_writer(inner)
    if f.type.startswith("[]"):
        item_reader, item_writer = primitive_codec(f.type[2:], flexible, nullable=False)
        return (
            array_reader(item_reader, flexible, nullable),
            array_writer(item_writer, flexible, nullable),
        )
    return primitive_codec(f.type, flexible, nullable)


def _default_factory(f: Field, version: int) -> Callable[[], Any]:
    if f.default is not None:
        default = f.default
        return lambda: default
    if isinstance(f.type, tuple):
        inner = _compile_struct(f.type, version, False)
        return lambda: Struct({name: make() for name, _, _, make in inner.fields})
    if isinstance(f.type, list) or f.type.startswith("[]"):
        return lambda: None if f.is_nullable(version) else ()
    if f.is_nullable(version):
        return lambda: None
    zero = _ZERO_DEFAULTS[f.type]
    return lambda: zero


def _compile_struct(fields: tuple[Field, ...], version: int, flexible: bool) -> Compiled:
    regular = []
    tagged = {}
    absent = []
    for f in fields:
        if version not in f.version_range:
            absent.append((f.name, _absent_default(f)))
            continue
        reader, writer = _field_codec(f, version, flexible)
        entry = (f.name, reader, writer, _default_factory(f, version))
        if flexible and f.is_tagged(version):
            assert f.tag is not None
            tagged[f.tag] = entry
        else:
            regular.append(entry)
    return Compiled(tuple(regular), tagged, flexible, tuple(absent))


def _absent_default(f: Field) -> Callable[[], Any]:
    if f.default is not None:
        default = f.default
        return lambda: default
    if isinstance(f.type, list) or (isinstance(f.type, str) and f.type.startswith("[]")):
        return lambda: ()
    if isinstance(f.type, tuple):
        return lambda: None
    zero = _ZERO_DEFAULTS[f.type]
    return lambda: zero


def struct_reader(compiled: Compiled) -> Reader:
    """Reads a compiled struct: its fields in order, then (flexible) its tagged fields."""
    def read(buf: memoryview, pos: int) -> tuple[Struct, int]:
        values: dict[str, Any] = {}
        for name, reader, _, _ in compiled.fields:
            values[name], pos = reader(buf, pos)
        if compiled.flexible:
            pos = _read_tagged(buf, pos, compiled, values)
        for name, make in compiled.absent:
            values[name] = make()
        return Struct(values), pos

    return read


def _read_tagged(buf: memoryview, pos: int, compiled: Compiled, values: dict[str, Any]) -> int:
    count, pos = read_uvarint(buf, pos)
    for _ in range(count):
        tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        end = pos + size
        if end > len(buf):
            raise DecodeError("tagged field runs past the end of the frame")
        entry = compiled.tagged.get(tag)
        if entry is not None:  # unknown tags are skipped, as KIP-482 requires
            values[entry[0]], _ = entry[1](buf[:end], pos)
        pos = end
    for name, _, _, make in compiled.tagged.values():
        values.setdefault(name, make())
    return pos


def struct_writer(compiled: Compiled) -> Writer:
    """Writes a mapping or Struct as a compiled struct; missing fields take their default."""
    def write(out: Output, value: Any) -> None:
        get = _getter(value)
        for name, _, writer, make in compiled.fields:
            item = get(name)
            try:
                writer(out, make() if item is _MISSING else item)
            except WRITE_FAILURES as exc:
                raise field_error(exc, name, item) from None
        if compiled.flexible:
            _write_tagged(out, compiled, get)

    return write


def _write_tagged(out: Output, compiled: Compiled, get: Callable[[str], Any]) -> None:
    present = []
    for tag in sorted(compiled.tagged):
        name, _, writer, make = compiled.tagged[tag]
        item = get(name)
        if item is _MISSING or item is None or item == make():
            continue  # tagged fields at their default are omitted
        encoded = Output()
        try:
            writer(encoded, item)
        except WRITE_FAILURES as exc:
            raise field_error(exc, name, item) from None
        present.append((tag, bytes(encoded.buf)))
    write_uvarint(out.buf, len(present))
    for tag, raw in present:
        write_uvarint(out.buf, tag)
        write_uvarint(out.buf, len(raw))
        out.buf += raw


_MISSING = object()


def _getter(value: Any) -> Callable[[str], Any]:
    if isinstance(value, Struct):
        values = vars(value)
        return lambda name: values.get(name, _MISSING)
    if isinstance(value, Mapping):
        return lambda name: value.get(name, _MISSING)
    raise EncodeError(f"cannot encode {type(value).__name__} as a struct")


@cache
def compiled_body(api: Api, version: int, is_request: bool) -> Compiled:
    """The request (or response) body of ``api`` at ``version``, compiled once."""
    fields = api.request if is_request else api.response
    return _compile_struct(tuple(fields), version, api.is_flexible(version))
