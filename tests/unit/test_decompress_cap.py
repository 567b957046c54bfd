"""raftlog.partition.compression's output bound: every codec stops at ``max_bytes`` (streaming, or a
declared length checked first) instead of decompressing everything, so a compression bomb
in a producer's batch costs a lookup at most the bound."""

from __future__ import annotations

import gzip
import struct
import sys
import tracemalloc

import cramjam
import lz4.frame
import pytest
import zstandard

from raftlog.partition.compression import (
    CODEC_GZIP,
    CODEC_LZ4,
    CODEC_SNAPPY,
    CODEC_ZSTD,
    DecompressedSizeError,
    decompress,
    decompress_records,
)

DATA = bytes(range(256)) * 1024  # 256 KiB, mildly compressible
BOMB_BYTES = 8 * 1024 * 1024  # zeros: most codecs squeeze them to a few KiB
CAP_BYTES = 64 * 1024


def _xerial(data: bytes, block_bytes: int = 32 * 1024) -> bytes:
    """Snappy as the Java producer frames it: a header, then length-prefixed raw blocks."""
    out = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    for start in range(0, len(data), block_bytes):
        block = bytes(cramjam.snappy.compress_raw(data[start:start + block_bytes]))
        out += struct.pack(">i", len(block)) + block
    return out


COMPRESSORS = {
    "gzip": (CODEC_GZIP, gzip.compress),
    "snappy-raw": (CODEC_SNAPPY, lambda data: bytes(cramjam.snappy.compress_raw(data))),
    "snappy-xerial": (CODEC_SNAPPY, _xerial),
    "lz4": (CODEC_LZ4, lz4.frame.compress),
    "zstd": (CODEC_ZSTD, lambda data: zstandard.ZstdCompressor().compress(data)),
    "zstd-cramjam": (CODEC_ZSTD, lambda data: bytes(cramjam.zstd.compress(data))),
}


@pytest.mark.parametrize("name", list(COMPRESSORS))
def test_round_trip_up_to_the_bound(name: str) -> None:
    codec, compress = COMPRESSORS[name]
    compressed = compress(DATA)
    assert bytes(decompress_records(codec, memoryview(compressed), max_bytes=len(DATA))) == DATA
    assert decompress(codec, compressed) == DATA, "no bound: the tooling path"
    with pytest.raises(DecompressedSizeError):
        decompress_records(codec, compressed, max_bytes=len(DATA) - 1)


@pytest.mark.parametrize("name", list(COMPRESSORS))
def test_a_bomb_stops_at_the_bound(name: str) -> None:
    codec, compress = COMPRESSORS[name]
    bomb = compress(bytes(BOMB_BYTES))
    assert len(bomb) < BOMB_BYTES // 10  # snappy squeezes least: ~21x
    tracemalloc.start()
    try:
        with pytest.raises(DecompressedSizeError, match=f"more than {CAP_BYTES} bytes"):
            decompress_records(codec, bomb, max_bytes=CAP_BYTES)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak_bytes < 16 * CAP_BYTES, "nothing near the bomb's size was allocated"


@pytest.mark.parametrize("library", ["zstandard", "lz4"])
def test_cramjam_fallback_is_bounded_too(monkeypatch: pytest.MonkeyPatch, library: str) -> None:
    """Without zstandard / lz4 the codec falls back to cramjam, which has no streaming
    limit: it decompresses into an anonymous mapping one byte larger than the bound."""
    monkeypatch.setitem(sys.modules, library, None)  # import raises ImportError
    if library == "lz4":
        monkeypatch.setitem(sys.modules, "lz4.frame", None)
    codec, module = (CODEC_ZSTD, cramjam.zstd) if library == "zstandard" \
        else (CODEC_LZ4, cramjam.lz4)
    compressed = bytes(module.compress(DATA))
    assert bytes(decompress_records(codec, compressed, max_bytes=len(DATA))) == DATA
    assert decompress(codec, compressed) == DATA
    with pytest.raises(DecompressedSizeError):
        decompress_records(codec, bytes(module.compress(bytes(BOMB_BYTES))),
                           max_bytes=CAP_BYTES)


@pytest.mark.parametrize("name", ["gzip", "lz4"])
def test_truncated_streams_are_corrupt(name: str) -> None:
    codec, compress = COMPRESSORS[name]
    compressed = compress(DATA)
    with pytest.raises(Exception, match="ends"):
        decompress_records(codec, compressed[: len(compressed) // 2], max_bytes=len(DATA))


def test_concatenated_gzip_members_are_read_as_gzip_does() -> None:
    compressed = gzip.compress(DATA[:1000]) + gzip.compress(DATA[1000:2000]) + b"\x00" * 8
    assert bytes(decompress_records(CODEC_GZIP, compressed, max_bytes=2000)) == DATA[:2000]
    with pytest.raises(DecompressedSizeError):
        decompress_records(CODEC_GZIP, compressed, max_bytes=1999)
