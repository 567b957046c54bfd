"""Decompression of record batches for tooling (the console consumer, tests).

The broker never calls this: it stores and serves batches exactly as producers compressed
them. A compressed batch is rewritten as the equivalent uncompressed batch so the plain
record decoder can read it. gzip needs only the standard library; snappy, lz4 and zstd use
``cramjam`` (or ``lz4`` / ``zstandard``) when installed.
"""

from __future__ import annotations

import gzip
import struct

import crc32c

from raftlog.partition.batch import RECORD_BATCH_OVERHEAD, parse_header
from raftlog.partition.errors import UnsupportedCompressionError

CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD = range(5)
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_INT16 = struct.Struct(">h")


def _snappy(data: bytes) -> bytes:
    import cramjam

    if data.startswith(_XERIAL_MAGIC):
        # Java's producer frames snappy in xerial blocks: [8 magic][4 ver][4 compat] then
        # repeated [int32 length][raw snappy block].
        out = bytearray()
        pos = 16
        while pos < len(data):
            (length,) = _INT32.unpack_from(data, pos)
            out += bytes(cramjam.snappy.decompress_raw(data[pos + 4:pos + 4 + length]))
            pos += 4 + length
        return bytes(out)
    return bytes(cramjam.snappy.decompress_raw(data))


def _lz4(data: bytes) -> bytes:
    import cramjam

    return bytes(cramjam.lz4.decompress(data))


def _zstd(data: bytes) -> bytes:
    import cramjam

    return bytes(cramjam.zstd.decompress(data))


def decompress(codec: int, data: bytes) -> bytes:
    """One batch's records section, decompressed."""
    try:
        if codec == CODEC_GZIP:
            return gzip.decompress(data)
        if codec == CODEC_SNAPPY:
            return _snappy(data)
        if codec == CODEC_LZ4:
            return _lz4(data)
        if codec == CODEC_ZSTD:
            return _zstd(data)
    except ImportError as exc:
        raise UnsupportedCompressionError(f"codec {codec} needs the cramjam package") from exc
    raise UnsupportedCompressionError(f"unknown compression codec {codec}")


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
            payload = decompress(codec, bytes(records[pos + RECORD_BATCH_OVERHEAD:end]))
            out += _uncompressed_batch(bytes(records[pos:pos + RECORD_BATCH_OVERHEAD]), payload)
        pos = end
    return bytes(out)


def _uncompressed_batch(header: bytes, payload: bytes) -> bytes:
    batch = bytearray(header) + payload
    _INT32.pack_into(batch, 8, len(batch) - 12)
    (attributes,) = _INT16.unpack_from(batch, 21)
    _INT16.pack_into(batch, 21, attributes & ~0x07)
    _UINT32.pack_into(batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)
