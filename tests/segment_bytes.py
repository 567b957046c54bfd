"""What a segment file holds as data: its batches, without the zero tail that a live node's
active segment is allocated ahead with (``raftlog.partition.files.preallocate``). For tests
that read segment files straight from disk."""

from __future__ import annotations

import struct

_LENGTH = struct.Struct(">i")  # batchLength, after the 8-byte base offset
_LENGTH_END = 12


def stored_bytes(data: bytes) -> bytes:
    """``data`` up to the first zero batch length (the preallocated tail). A negative length
    is damage, not a tail: then ``data`` comes back whole, to be compared as it is."""
    position = 0
    while position + _LENGTH_END <= len(data):
        (length,) = _LENGTH.unpack_from(data, position + 8)
        if length == 0:
            return data[:position]
        if length < 0:
            return data
        position += _LENGTH_END + length
    return data
