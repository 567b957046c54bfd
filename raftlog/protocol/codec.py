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
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Protocol

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


class DecodeError(ValueError):
    """The peer sent bytes that do not parse under the declared schema (a remote error)."""


class EncodeError(ValueError):
    """A body does not fit its schema: a None where the version allows no null, an integer out
    of its field's range, a string too long for its length prefix (a local bug, never the
    peer's). ``path`` names the field, e.g. ``topics[0].name``, so the log says which handler
    built what."""

    def __init__(self, problem: str, path: str = "") -> None:
        super().__init__(f"{path}: {problem}" if path else problem)
        self.problem = problem
        self.path = path

    def within(self, name: str) -> EncodeError:
        """The same error one level up: ``name`` is a field or an ``[index]``."""
        joined = name if not self.path else (
            f"{name}{self.path}" if self.path.startswith("[") else f"{name}.{self.path}")
        return EncodeError(self.problem, joined)


# What a writer raises for a value that does not fit (struct.error for an integer out of
# range or a string too long for an int16 length, TypeError/AttributeError for a wrong type).
_WRITE_FAILURES = (EncodeError, struct.error, TypeError, ValueError, AttributeError,
                   OverflowError)


def _field_error(exc: Exception, name: str, value: Any) -> EncodeError:
    """``exc`` from the writer of field ``name`` (or element ``[i]``), as an EncodeError."""
    if isinstance(exc, EncodeError):
        return exc.within(name)
    return EncodeError(f"{exc} (value {value!r:.80})", name)


class Region(Protocol):
    """A span of bytes the I/O layer writes itself (for example a slice of a segment file)."""

    @property
    def size_bytes(self) -> int: ...


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
    """An immutable decoded message or nested struct with attribute access."""

    __slots__ = ("_values",)
    _values: dict[str, Any]

    def __init__(self, values: dict[str, Any]) -> None:
        object.__setattr__(self, "_values", values)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Struct is immutable")

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self._values.get(name, default)

    def to_dict(self) -> dict[str, Any]:
        """A deep, mutable copy (structs become dicts, tuples become lists)."""
        return {key: _unfreeze(value) for key, value in self._values.items()}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Struct) and self._values == other._values

    def __hash__(self) -> int:
        return hash(tuple(self._values.items()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{key}={value!r}" for key, value in self._values.items())
        return f"Struct({inner})"


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

    @property
    def version_range(self) -> VersionRange:
        return VersionRange.parse(self.versions)

    def is_nullable(self, version: int) -> bool:
        return self.nullable is not None and version in VersionRange.parse(self.nullable)

    def is_tagged(self, version: int) -> bool:
        return self.tag is not None and version in VersionRange.parse(self.tagged or self.versions)


F = Field


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
        return version in VersionRange.parse(self.flexible)

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version


# ---------------------------------------------------------------------------------------------
# Primitive readers. Each takes (buffer, position) and returns (value, new position).

Reader = Callable[[memoryview, int], tuple[Any, int]]
Writer = Callable[["Output", Any], None]

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")


def _fixed_reader(packer: struct.Struct) -> Reader:
    size = packer.size
    unpack_from = packer.unpack_from

    def read(buf: memoryview, pos: int) -> tuple[Any, int]:
        if pos + size > len(buf):
            raise DecodeError("buffer underflow")
        return unpack_from(buf, pos)[0], pos + size

    return read


def read_uvarint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise DecodeError("buffer underflow in varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise DecodeError("varint too long")


def _read_bool(buf: memoryview, pos: int) -> tuple[bool, int]:
    if pos >= len(buf):
        raise DecodeError("buffer underflow")
    return buf[pos] != 0, pos + 1


def _read_uuid(buf: memoryview, pos: int) -> tuple[uuid.UUID, int]:
    if pos + 16 > len(buf):
        raise DecodeError("buffer underflow")
    return uuid.UUID(bytes=bytes(buf[pos : pos + 16])), pos + 16


_read_i16 = _fixed_reader(_I16)
_read_i32 = _fixed_reader(_I32)


def _length_reader(compact: bool) -> Callable[[memoryview, int], tuple[int, int]]:
    """Reads a length prefix; returns -1 for null."""
    if compact:

        def read_compact(buf: memoryview, pos: int) -> tuple[int, int]:
            raw, pos = read_uvarint(buf, pos)
            return raw - 1, pos

        return read_compact
    return _read_i32


def _string_reader(compact: bool, nullable: bool) -> Reader:
    read_length = _length_reader(compact) if compact else _read_i16

    def read(buf: memoryview, pos: int) -> tuple[str | None, int]:
        length, pos = read_length(buf, pos)
        if length < 0:
            if not nullable:
                raise DecodeError("null in a non-nullable string")
            return None, pos
        end = pos + length
        if end > len(buf):
            raise DecodeError("string runs past the end of the frame")
        try:
            return str(buf[pos:end], "utf-8"), end
        except UnicodeDecodeError as exc:
            raise DecodeError("string is not valid UTF-8") from exc

    return read


def _bytes_reader(compact: bool, nullable: bool) -> Reader:
    read_length = _length_reader(compact)

    def read(buf: memoryview, pos: int) -> tuple[memoryview | None, int]:
        length, pos = read_length(buf, pos)
        if length < 0:
            if not nullable:
                raise DecodeError("null in non-nullable bytes")
            return None, pos
        end = pos + length
        if end > len(buf):
            raise DecodeError("bytes run past the end of the frame")
        return buf[pos:end], end

    return read


def _array_reader(item: Reader, compact: bool, nullable: bool) -> Reader:
    read_length = _length_reader(compact)

    def read(buf: memoryview, pos: int) -> tuple[tuple[Any, ...] | None, int]:
        count, pos = read_length(buf, pos)
        if count < 0:
            if not nullable:
                raise DecodeError("null in a non-nullable array")
            return None, pos
        if count > len(buf) - pos:  # every element takes at least one byte
            raise DecodeError("array count exceeds the frame")
        items = []
        for _ in range(count):
            value, pos = item(buf, pos)
            items.append(value)
        return tuple(items), pos

    return read


# ---------------------------------------------------------------------------------------------
# Output buffer and primitive writers


class Output:
    """Accumulates encoded bytes; regions (file slices) are kept as separate chunks."""

    __slots__ = ("buf", "chunks")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.chunks: list[bytes | bytearray | memoryview | Region] = []

    def add_region(self, region: Region) -> None:
        if self.buf:
            self.chunks.append(self.buf)
            self.buf = bytearray()
        self.chunks.append(region)

    def finish(self) -> list[bytes | bytearray | memoryview | Region]:
        if self.buf or not self.chunks:
            self.chunks.append(self.buf)
            self.buf = bytearray()
        return self.chunks


def write_uvarint(out: bytearray, value: int) -> None:
    if value < 0:
        raise EncodeError(f"negative varint {value}")
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _fixed_writer(packer: struct.Struct) -> Writer:
    pack = packer.pack

    def write(out: Output, value: Any) -> None:
        out.buf += pack(value)

    return write


def _write_bool(out: Output, value: Any) -> None:
    out.buf.append(1 if value else 0)


def _write_uuid(out: Output, value: Any) -> None:
    if value is None:
        out.buf += bytes(16)
    elif isinstance(value, uuid.UUID):
        out.buf += value.bytes
    else:
        raw = bytes(value)
        if len(raw) != 16:
            raise EncodeError(f"a uuid is 16 bytes, not {len(raw)}")
        out.buf += raw


def _write_length(out: Output, length: int, compact: bool, wide: bool) -> None:
    """Writes a length prefix (-1 = null): compact uvarint, int32 (wide) or int16."""
    if compact:
        write_uvarint(out.buf, length + 1)
    elif wide:
        out.buf += _I32.pack(length)
    else:
        out.buf += _I16.pack(length)


_STRING_BYTES_MAX = 0x7FFF  # a non-compact string's int16 length


def _string_writer(compact: bool, nullable: bool) -> Writer:
    def write(out: Output, value: Any) -> None:
        if value is None:
            if not nullable:
                raise EncodeError("None in a non-nullable string")
            _write_length(out, -1, compact, wide=False)
            return
        raw = value.encode("utf-8")
        if len(raw) > _STRING_BYTES_MAX and not compact:
            raise EncodeError(f"a string of {len(raw)} bytes (at most {_STRING_BYTES_MAX})")
        _write_length(out, len(raw), compact, wide=False)
        out.buf += raw

    return write


def _message_writer(compact: bool, nullable: bool) -> Writer:
    """Kafka's free-text error messages are for people and often quote the request's own
    strings (a topic or config name of up to 32767 bytes), so one that would not fit a
    non-compact string is shortened to fit, where any other string too long is a bug."""
    write = _string_writer(compact, nullable)
    if compact:
        return write

    def write_message(out: Output, value: Any) -> None:
        if isinstance(value, str) and len(value) > _STRING_BYTES_MAX // 4:  # may not fit
            raw = value.encode("utf-8")
            if len(raw) > _STRING_BYTES_MAX:
                # Cut at a character boundary, then mark the cut; at most the limit in all.
                value = raw[: _STRING_BYTES_MAX - 3].decode("utf-8", "ignore") + "..."
        write(out, value)

    return write_message


def _bytes_writer(compact: bool, nullable: bool) -> Writer:
    def write(out: Output, value: Any) -> None:
        if value is None:
            if not nullable:
                raise EncodeError("None in non-nullable bytes")
            _write_length(out, -1, compact, wide=True)
            return
        _write_length(out, len(value), compact, wide=True)
        out.buf += value

    return write


def _records_writer(compact: bool, nullable: bool) -> Writer:
    """Records are bytes, or a sequence of regions the I/O layer sends itself."""

    def write(out: Output, value: Any) -> None:
        if value is None:
            if not nullable:
                raise EncodeError("None in non-nullable records")
            _write_length(out, -1, compact, wide=True)
        elif isinstance(value, bytes | bytearray | memoryview):
            _write_length(out, len(value), compact, wide=True)
            out.buf += value
        else:
            regions: Sequence[Region] = value
            _write_length(out, sum(r.size_bytes for r in regions), compact, wide=True)
            for region in regions:
                out.add_region(region)

    return write


def _array_writer(item: Writer, compact: bool, nullable: bool) -> Writer:
    def write(out: Output, value: Any) -> None:
        if value is None:
            if not nullable:
                raise EncodeError("None in a non-nullable array")
            _write_length(out, -1, compact, wide=True)
            return
        _write_length(out, len(value), compact, wide=True)
        for index, element in enumerate(value):
            try:
                item(out, element)
            except _WRITE_FAILURES as exc:
                raise _field_error(exc, f"[{index}]", element) from None

    return write


# ---------------------------------------------------------------------------------------------
# Compilation of a field tree for one version


_FIXED: dict[str, tuple[Reader, Writer]] = {
    "int8": (_fixed_reader(_I8), _fixed_writer(_I8)),
    "int16": (_read_i16, _fixed_writer(_I16)),
    "uint16": (_fixed_reader(_U16), _fixed_writer(_U16)),
    "int32": (_read_i32, _fixed_writer(_I32)),
    "uint32": (_fixed_reader(_U32), _fixed_writer(_U32)),
    "int64": (_fixed_reader(_I64), _fixed_writer(_I64)),
    "float64": (_fixed_reader(_F64), _fixed_writer(_F64)),
    "bool": (_read_bool, _write_bool),
    "uuid": (_read_uuid, _write_uuid),
}

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
class _Compiled:
    """A struct compiled for one version: regular fields in order, tagged fields by tag."""

    fields: tuple[tuple[str, Reader, Writer, Callable[[], Any]], ...]
    tagged: dict[int, tuple[str, Reader, Writer, Callable[[], Any]]]
    flexible: bool
    # Fields declared for other versions: decoded structs carry them at their default, so
    # handlers read every field the same way whatever version the client spoke.
    absent: tuple[tuple[str, Callable[[], Any]], ...] = ()


def _primitive_codec(type_name: str, compact: bool, nullable: bool) -> tuple[Reader, Writer]:
    if type_name in _FIXED:
        return _FIXED[type_name]
    if type_name == "string":
        return _string_reader(compact, nullable), _string_writer(compact, nullable)
    if type_name == "bytes":
        return _bytes_reader(compact, nullable), _bytes_writer(compact, nullable)
    if type_name == "records":
        return _bytes_reader(compact, nullable), _records_writer(compact, nullable)
    raise ValueError(f"unknown type {type_name!r}")


def _field_codec(f: Field, version: int, flexible: bool) -> tuple[Reader, Writer]:
    nullable = f.is_nullable(version)
    if f.type == "string" and f.name.endswith("error_message"):
        return _string_reader(flexible, nullable), _message_writer(flexible, nullable)
    if isinstance(f.type, list):
        inner = _compile_struct(tuple(f.type), version, flexible)
        return (
            _array_reader(_struct_reader(inner), flexible, nullable),
            _array_writer(_struct_writer(inner), flexible, nullable),
        )
    if isinstance(f.type, tuple):
        inner = _compile_struct(f.type, version, flexible)
        return _struct_reader(inner), _struct_writer(inner)
    if f.type.startswith("[]"):
        item_reader, item_writer = _primitive_codec(f.type[2:], flexible, nullable=False)
        return (
            _array_reader(item_reader, flexible, nullable),
            _array_writer(item_writer, flexible, nullable),
        )
    return _primitive_codec(f.type, flexible, nullable)


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


def _compile_struct(fields: tuple[Field, ...], version: int, flexible: bool) -> _Compiled:
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
    return _Compiled(tuple(regular), tagged, flexible, tuple(absent))


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


def _struct_reader(compiled: _Compiled) -> Reader:
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


def _read_tagged(buf: memoryview, pos: int, compiled: _Compiled, values: dict[str, Any]) -> int:
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


def _struct_writer(compiled: _Compiled) -> Writer:
    def write(out: Output, value: Any) -> None:
        get = _getter(value)
        for name, _, writer, make in compiled.fields:
            item = get(name)
            try:
                writer(out, make() if item is _MISSING else item)
            except _WRITE_FAILURES as exc:
                raise _field_error(exc, name, item) from None
        if compiled.flexible:
            _write_tagged(out, compiled, get)

    return write


def _write_tagged(out: Output, compiled: _Compiled, get: Callable[[str], Any]) -> None:
    present = []
    for tag in sorted(compiled.tagged):
        name, _, writer, make = compiled.tagged[tag]
        item = get(name)
        if item is _MISSING or item is None or item == make():
            continue  # tagged fields at their default are omitted
        encoded = Output()
        try:
            writer(encoded, item)
        except _WRITE_FAILURES as exc:
            raise _field_error(exc, name, item) from None
        present.append((tag, bytes(encoded.buf)))
    write_uvarint(out.buf, len(present))
    for tag, raw in present:
        write_uvarint(out.buf, tag)
        write_uvarint(out.buf, len(raw))
        out.buf += raw


_MISSING = object()


def _getter(value: Any) -> Callable[[str], Any]:
    if isinstance(value, Struct):
        values = value._values
        return lambda name: values.get(name, _MISSING)
    if isinstance(value, Mapping):
        return lambda name: value.get(name, _MISSING)
    raise EncodeError(f"cannot encode {type(value).__name__} as a struct")


# ---------------------------------------------------------------------------------------------
# Public entry points


@cache
def _compiled_body(api: Api, version: int, is_request: bool) -> _Compiled:
    fields = api.request if is_request else api.response
    return _compile_struct(tuple(fields), version, api.is_flexible(version))


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
    value, pos = _struct_reader(_compiled_body(api, version, is_request))(view, 0)
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
        _struct_writer(_compiled_body(api, version, is_request))(out, value)
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


_read_nullable_string = _string_reader(compact=False, nullable=True)
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
    _string_writer(compact=False, nullable=True)(out, header.client_id)
    if flexible:
        out.buf.append(0)
    return bytes(out.buf)


def encode_response_header(correlation_id: int, flexible: bool) -> bytes:
    """Response header v0, or v1 (plus an empty tagged-field buffer) when flexible."""
    return _I32.pack(correlation_id) + (b"\x00" if flexible else b"")


def decode_response_header(buf: memoryview, flexible: bool) -> tuple[int, int]:
    correlation_id, pos = _read_i32(buf, 0)
    if flexible:
        pos = _skip_tagged(buf, pos)
    return correlation_id, pos


def iter_fields(fields: Iterable[Field]) -> Iterable[Field]:
    """Every field of a tree, depth first (used by the schema cross-check test)."""
    for f in fields:
        yield f
        if isinstance(f.type, list | tuple):
            yield from iter_fields(f.type)
