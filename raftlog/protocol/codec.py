"""Sans-I/O Kafka wire codec: bytes in, frozen structs out; mappings in, bytes out.

Every API is declared once (see ``schemas.py``) as a tree of :class:`Field` objects whose
``versions`` strings use the notation of Kafka's own message JSON ("0+", "3-5", "none"). For
each (API, version, direction) the tree is compiled once into a flat list of field codecs,
so the per-request cost is a loop over pre-bound functions.

Flexible versions (KIP-482) switch strings, bytes, arrays and records to their compact form
(unsigned varint of length + 1, 0 meaning null) and end every struct with a tagged-field
buffer. Unknown tagged fields are skipped on decode, as the protocol requires.

Records fields are never decoded here: they come out as a ``memoryview`` slice of the frame
(zero copy) and go in either as bytes or as *regions* (objects with ``size_bytes``) that the
I/O layer writes itself, e.g. with ``os.sendfile`` from a segment file.

This module is the codec's entry points (bodies and the request/response headers that frame
them); the parts live beside it: ``declarations`` (Field, Api, Struct), ``primitives`` (the
typed readers and writers, the error types) and ``compiler`` (field tree to codec list).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from raftlog.protocol.compiler import compiled_body, struct_reader, struct_writer
from raftlog.protocol.declarations import Api, Field, Struct, VersionRange
from raftlog.protocol.primitives import (
    I32,
    DecodeError,
    EncodeError,
    Output,
    Region,
    read_i32,
    read_uvarint,
    string_reader,
    string_writer,
)

__all__ = [
    "Api",
    "DecodeError",
    "EncodeError",
    "Field",
    "Region",
    "Struct",
    "VersionRange",
    "decode",
    "decode_request_header",
    "decode_response_header",
    "encode",
    "encode_request_header",
    "encode_response_header",
]


def decode(
    api: Api,
    version: int,
    buf: memoryview | bytes,
    *,
    is_request: bool = True,
    allow_trailing: bool = False,
) -> Struct:
    """Decodes a request (or response) body at ``version``; trailing bytes are an error
    unless ``allow_trailing`` (the broker's choice: Kafka's own parser ignores them, and
    librdkafka 2.x sends a few extra bytes in its all-topics flexible Metadata request)."""
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    value, pos = struct_reader(compiled_body(api, version, is_request))(view, 0)
    if pos != len(view) and not allow_trailing:
        raise DecodeError(f"{len(view) - pos} trailing bytes after {api.name} v{version}")
    assert isinstance(value, Struct)
    return value


def encode(
    api: Api, version: int, value: Mapping[str, Any] | Struct, *, is_request: bool = False
) -> list[bytes | bytearray | memoryview | Region]:
    """Encodes a response (or request) body; missing fields take their declared default.

    Raises:
        EncodeError: the body does not fit the schema at ``version`` (names the field).
    """
    out = Output()
    try:
        struct_writer(compiled_body(api, version, is_request))(out, value)
    except EncodeError as exc:
        kind = "request" if is_request else "response"
        raise EncodeError(exc.problem, f"{api.name} v{version} {kind} {exc.path}") from None
    return out.finish()


def encode_bytes(
    api: Api, version: int, value: Mapping[str, Any] | Struct, *, is_request: bool = False
) -> bytes:
    """Like :func:`encode` for bodies that hold no regions."""
    chunks = encode(api, version, value, is_request=is_request)
    assert all(isinstance(c, bytes | bytearray | memoryview) for c in chunks)
    return b"".join(chunks)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


_read_nullable_string = string_reader(compact=False, nullable=True)
_HEADER_PREFIX = struct.Struct(">hhi")


def peek_request_header(buf: memoryview) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id) from the first 8 bytes, before any schema."""
    if len(buf) < _HEADER_PREFIX.size:
        raise DecodeError("request shorter than a header")
    key, version, correlation_id = _HEADER_PREFIX.unpack_from(buf, 0)
    return key, version, correlation_id


def decode_request_header(buf: memoryview, flexible: bool) -> tuple[RequestHeader, int]:
    """Request header v1 (v2 when flexible: plus tagged fields). client_id is never compact."""
    key, version, correlation_id = peek_request_header(buf)
    client_id, pos = _read_nullable_string(buf, _HEADER_PREFIX.size)
    if flexible:
        pos = _skip_tagged(buf, pos)
    return RequestHeader(key, version, correlation_id, client_id), pos


def _skip_tagged(buf: memoryview, pos: int) -> int:
    count, pos = read_uvarint(buf, pos)
    for _ in range(count):
        _, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        pos += size
        if pos > len(buf):
            raise DecodeError("tagged field runs past the end of the frame")
    return pos


def encode_request_header(header: RequestHeader, flexible: bool) -> bytes:
    out = Output()
    out.buf += _HEADER_PREFIX.pack(header.api_key, header.api_version, header.correlation_id)
    string_writer(compact=False, nullable=True)(out, header.client_id)
    if flexible:
        out.buf.append(0)
    return bytes(out.buf)


def encode_response_header(correlation_id: int, flexible: bool) -> bytes:
    """Response header v0, or v1 (plus an empty tagged-field buffer) when flexible."""
    return I32.pack(correlation_id) + (b"\x00" if flexible else b"")


def decode_response_header(buf: memoryview, flexible: bool) -> tuple[int, int]:
    correlation_id, pos = read_i32(buf, 0)
    if flexible:
        pos = _skip_tagged(buf, pos)
    return correlation_id, pos


def iter_fields(fields: Iterable[Field]) -> Iterable[Field]:
    """Every field of a tree, depth first (used by the schema cross-check test)."""
    for f in fields:
        yield f
        if isinstance(f.type, list | tuple):
            yield from iter_fields(f.type)
