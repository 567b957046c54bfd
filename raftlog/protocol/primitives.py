"""The wire's primitives: integers, varints, strings, bytes, records and arrays, each as a
reader ``(buffer, position) -> (value, new position)`` and a writer ``(Output, value)``.

Everything here is schema-free; ``compiler.py`` binds these per field of a declared struct.
Flexible versions (KIP-482) use the *compact* forms: an unsigned varint of length + 1, 0
meaning null. The two error types live here because the primitives are what raise them.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol


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
WRITE_FAILURES = (EncodeError, struct.error, TypeError, ValueError, AttributeError,
                  OverflowError)


def field_error(exc: Exception, name: str, value: Any) -> EncodeError:
    """``exc`` from the writer of field ``name`` (or element ``[i]``), as an EncodeError."""
    if isinstance(exc, EncodeError):
        return exc.within(name)
    return EncodeError(f"{exc} (value {value!r:.80})", name)


class Region(Protocol):
    """A span of bytes the I/O layer writes itself (for example a slice of a segment file)."""

    @property
    def size_bytes(self) -> int: ...


# ---------------------------------------------------------------------------------------------
# Primitive readers. Each takes (buffer, position) and returns (value, new position).

Reader = Callable[[memoryview, int], tuple[Any, int]]
Writer = Callable[["Output", Any], None]

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
I32 = struct.Struct(">i")
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
    """An unsigned varint (at most 64 bits), as KIP-482 lengths and tags are written."""
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


read_i16 = _fixed_reader(_I16)
read_i32 = _fixed_reader(I32)


def _length_reader(compact: bool) -> Callable[[memoryview, int], tuple[int, int]]:
    """Reads a length prefix; returns -1 for null."""
    if compact:

        def read_compact(buf: memoryview, pos: int) -> tuple[int, int]:
            raw, pos = read_uvarint(buf, pos)
            return raw - 1, pos

        return read_compact
    return read_i32


def string_reader(compact: bool, nullable: bool) -> Reader:
    """A string reader: int16 length, or compact (uvarint length + 1); -1/0 is null."""
    read_length = _length_reader(compact) if compact else read_i16

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


def array_reader(item: Reader, compact: bool, nullable: bool) -> Reader:
    """An array reader for elements read by ``item``; refuses counts the frame cannot hold."""
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
    """Appends ``value`` as an unsigned varint."""
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
        out.buf += I32.pack(length)
    else:
        out.buf += _I16.pack(length)


_STRING_BYTES_MAX = 0x7FFF  # a non-compact string's int16 length


def string_writer(compact: bool, nullable: bool) -> Writer:
    """A string writer; a non-compact string longer than an int16 length is an EncodeError."""
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


def message_writer(compact: bool, nullable: bool) -> Writer:
    """Kafka's free-text error messages are for people and often quote the request's own
    strings (a topic or config name of up to 32767 bytes), so one that would not fit a
    non-compact string is shortened to fit, where any other string too long is a bug."""
    write = string_writer(compact, nullable)
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


def array_writer(item: Writer, compact: bool, nullable: bool) -> Writer:
    """An array writer; an element's failure names its ``[index]``."""
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
            except WRITE_FAILURES as exc:
                raise field_error(exc, f"[{index}]", element) from None

    return write


_FIXED: dict[str, tuple[Reader, Writer]] = {
    "int8": (_fixed_reader(_I8), _fixed_writer(_I8)),
    "int16": (read_i16, _fixed_writer(_I16)),
    "uint16": (_fixed_reader(_U16), _fixed_writer(_U16)),
    "int32": (read_i32, _fixed_writer(I32)),
    "uint32": (_fixed_reader(_U32), _fixed_writer(_U32)),
    "int64": (_fixed_reader(_I64), _fixed_writer(_I64)),
    "float64": (_fixed_reader(_F64), _fixed_writer(_F64)),
    "bool": (_read_bool, _write_bool),
    "uuid": (_read_uuid, _write_uuid),
}


def primitive_codec(type_name: str, compact: bool, nullable: bool) -> tuple[Reader, Writer]:
    """The reader and writer of a primitive type name ("int32", "string", "records", ...)."""
    if type_name in _FIXED:
        return _FIXED[type_name]
    if type_name == "string":
        return string_reader(compact, nullable), string_writer(compact, nullable)
    if type_name == "bytes":
        return _bytes_reader(compact, nullable), _bytes_writer(compact, nullable)
    if type_name == "records":
        return _bytes_reader(compact, nullable), _records_writer(compact, nullable)
    raise ValueError(f"unknown type {type_name!r}")

