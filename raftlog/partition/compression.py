"""Decompression of record batches: tooling (the console consumer, tests), the log cleaner
and ListOffsets by timestamp.

The broker stores and serves batches exactly as producers compressed them; it looks inside
one only to compact it or to find a record by timestamp. A compressed batch is rewritten as
the equivalent uncompressed batch so the plain record decoder can read it. gzip needs only
the standard library; zstd uses ``zstandard``, lz4 uses ``lz4`` (each falling back to
``cramjam``) and snappy uses ``cramjam``, when installed.

``max_bytes`` bounds the decompressed output. The CRC only proves a batch arrived as its
producer sent it, and a few KiB of gzip can expand to gigabytes: a caller that decodes
batches on a server's behalf passes a bound and gets DecompressedSizeError instead of an
unbounded allocation. Every codec stops producing output at the bound (streaming, or
checking a declared length first) rather than decompressing everything and then checking.
"""

from __future__ import annotations

import mmap
import struct
import zlib
from types import ModuleType

import crc32c

from raftlog.partition.batch import RECORD_BATCH_OVERHEAD, Buffer, parse_header
from raftlog.partition.errors import CorruptRecordError, UnsupportedCompressionError

__all__ = [
    "CODEC_GZIP",
    "CODEC_LZ4",
    "CODEC_NONE",
    "CODEC_SNAPPY",
    "CODEC_ZSTD",
    "DecompressedSizeError",
    "decompress",
    "decompress_batches",
    "decompress_records",
]

CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD = range(5)
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_BYTES = 16
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_INT16 = struct.Struct(">h")
# wbits for a gzip member (header and trailer checked), as gzip.decompress reads it.
_GZIP_WBITS = 16 + zlib.MAX_WBITS
# Output is read in pieces of at most this size from streaming decoders: the memory used
# grows with the actual output, never with the bound.
_CHUNK_BYTES = 1024 * 1024
# No bound: larger than any buffer Python can allocate.
_UNBOUNDED_BYTES = 2**62


class DecompressedSizeError(CorruptRecordError):
    """A batch's records decompress to more than the caller's ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"records decompress to more than {max_bytes} bytes")
        self.max_bytes = max_bytes


def _gzip(data: Buffer, max_bytes: int) -> bytes:
    # Kafka producers write one gzip member; gzip.decompress also accepts several.
    chunks: list[bytes] = []
    total = 0
    rest: Buffer = data
    while rest:
        decoder = zlib.decompressobj(_GZIP_WBITS)
        chunk = decoder.decompress(rest, max_bytes + 1 - total)
        total += len(chunk)
        if total > max_bytes:
            raise DecompressedSizeError(max_bytes)
        chunks.append(chunk)
        if not decoder.eof:
            raise CorruptRecordError("gzip data ends before its end-of-stream marker")
        # Trailing zero bytes after a member are padding, as gzip.decompress treats them.
        rest = decoder.unused_data.lstrip(b"\x00")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _snappy(data: Buffer, max_bytes: int) -> Buffer:
    import cramjam

    view = memoryview(data)
    if bytes(view[:len(_XERIAL_MAGIC)]) != _XERIAL_MAGIC:
        if cramjam.snappy.decompress_raw_len(view) > max_bytes:
            raise DecompressedSizeError(max_bytes)
        return memoryview(cramjam.snappy.decompress_raw(view))
    # Java's producer frames snappy in xerial blocks: [8 magic][4 ver][4 compat] then
    # repeated [int32 length][raw snappy block]. Each block declares its raw length, so the
    # bound is checked before anything is decompressed.
    blocks: list[memoryview] = []
    total = 0
    position = _XERIAL_HEADER_BYTES
    while position < len(view):
        if position + 4 > len(view):
            raise CorruptRecordError("xerial snappy block length truncated")
        (length,) = _INT32.unpack_from(view, position)
        if length < 0 or position + 4 + length > len(view):
            raise CorruptRecordError(f"xerial snappy block of {length} bytes overruns")
        block = view[position + 4:position + 4 + length]
        total += cramjam.snappy.decompress_raw_len(block)
        if total > max_bytes:
            raise DecompressedSizeError(max_bytes)
        blocks.append(block)
        position += 4 + length
    out = bytearray(total)
    written = 0
    for block in blocks:
        written += cramjam.snappy.decompress_raw_into(block, memoryview(out)[written:])
    return memoryview(out)[:written]


def _cramjam_bounded(codec: ModuleType, data: Buffer, max_bytes: int) -> Buffer:
    """cramjam has no streaming output limit: it decompresses into a buffer one byte larger
    than the bound, an anonymous mapping, so only the pages actually written use memory."""
    if max_bytes >= _UNBOUNDED_BYTES:
        return memoryview(codec.decompress(data))
    with mmap.mmap(-1, max_bytes + 1) as out:
        try:
            written: int = codec.decompress_into(data, out)
        except Exception as error:
            # cramjam stops with "failed to write whole buffer" once the output fills it.
            if "whole buffer" in str(error):
                raise DecompressedSizeError(max_bytes) from error
            raise
        if written > max_bytes:
            raise DecompressedSizeError(max_bytes)
        return out[:written]


def _lz4(data: Buffer, max_bytes: int) -> Buffer:
    try:
        import lz4.frame
    except ImportError:
        import cramjam

        return _cramjam_bounded(cramjam.lz4, data, max_bytes)
    chunks: list[bytes] = []
    total = 0
    rest = data
    while rest:  # Kafka writes one LZ4 frame per batch; several are read in turn
        decoder = lz4.frame.LZ4FrameDecompressor()
        while not decoder.eof:
            chunk = decoder.decompress(rest, max_length=min(_CHUNK_BYTES, max_bytes + 1 - total))
            rest = b""  # the decoder keeps any input it has not consumed yet
            total += len(chunk)
            if total > max_bytes:
                raise DecompressedSizeError(max_bytes)
            chunks.append(chunk)
            if not decoder.eof and decoder.needs_input:
                raise CorruptRecordError("lz4 data ends inside a frame")
        rest = decoder.unused_data or b""
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _zstd(data: Buffer, max_bytes: int) -> Buffer:
    try:
        import zstandard
    except ImportError:
        import cramjam

        return _cramjam_bounded(cramjam.zstd, data, max_bytes)
    chunks: list[bytes] = []
    total = 0
    # A frame's declared content size is not trusted either: output is read in pieces.
    with zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True) as reader:
        while True:
            chunk = reader.read(min(_CHUNK_BYTES, max_bytes + 1 - total))
            if not chunk:
                break
            total += len(chunk)
            if total > max_bytes:
                raise DecompressedSizeError(max_bytes)
            chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def decompress_records(codec: int, data: Buffer, *, max_bytes: int | None) -> Buffer:
    """One batch's records section, decompressed, without copying it again. Raises
    DecompressedSizeError when it would exceed ``max_bytes`` (None: no bound),
    CorruptRecordError for a truncated gzip or lz4 stream (a truncated zstd stream yields
    short output, which the record decoder rejects), UnsupportedCompressionError for a
    missing library or an unknown codec; the codec libraries raise their own errors for
    malformed data."""
    bound = _UNBOUNDED_BYTES if max_bytes is None else max_bytes
    try:
        if codec == CODEC_GZIP:
            return _gzip(data, bound)
        if codec == CODEC_SNAPPY:
            return _snappy(data, bound)
        if codec == CODEC_LZ4:
            return _lz4(data, bound)
        if codec == CODEC_ZSTD:
            return _zstd(data, bound)
    except ImportError as exc:
        raise UnsupportedCompressionError(
            f"codec {codec} needs a library that is not installed ({exc.name})") from exc
    raise UnsupportedCompressionError(f"unknown compression codec {codec}")


def decompress(codec: int, data: Buffer) -> bytes:
    """One batch's records section, decompressed, with no bound (tooling, the cleaner)."""
    return bytes(decompress_records(codec, data, max_bytes=None))


def decompress_batches(records: bytes | memoryview) -> bytes:
    """Rewrites every compressed batch in ``records`` as an uncompressed one."""
    out = bytearray()
    pos = 0
    while pos + RECORD_BATCH_OVERHEAD <= len(records):
        header = parse_header(records, pos)
        end = pos + header.size_bytes
        if end > len(records):
            break  # a partial trailing batch (allowed in fetch responses)
        codec = header.compression_codec
        if codec == CODEC_NONE:
            out += records[pos:end]
        else:
            payload = decompress(codec, memoryview(records)[pos + RECORD_BATCH_OVERHEAD:end])
            out += _uncompressed_batch(bytes(records[pos:pos + RECORD_BATCH_OVERHEAD]), payload)
        pos = end
    return bytes(out)


def _uncompressed_batch(header: bytes, payload: Buffer) -> bytes:
    batch = bytearray(header) + payload
    _INT32.pack_into(batch, 8, len(batch) - 12)
    (attributes,) = _INT16.unpack_from(batch, 21)
    _INT16.pack_into(batch, 21, attributes & ~0x07)
    _UINT32.pack_into(batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)
