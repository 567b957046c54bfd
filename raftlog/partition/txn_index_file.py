"""The on-disk aborted-transaction index of one segment (``<base>.txnindex``), in Kafka's
format (``TransactionIndex``): back-to-back 34-byte entries, big-endian::

    version int16 (0) | producerId int64 | firstOffset int64 | lastOffset int64 |
    lastStableOffset int64

``lastOffset`` is the offset of the ABORT marker, which lies in this segment; ``firstOffset``
the first offset of the aborted transaction in this partition (it may lie in an earlier
segment); ``lastStableOffset`` the LSO once the transaction ended. Like Kafka's, the file
has no checksum: it is sanity-checked on open (size, version, offsets inside the segment and
increasing) and rebuilt from the log when a check fails.

An entry is written for every ABORT marker, also for a transaction that wrote nothing to this
partition (``firstOffset == lastOffset``, the marker itself): then "every ABORT marker of the
segment has its entry" is a complete check of the file against the log after a crash.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ENTRY_BYTES", "TxnIndexEntry", "decode_entries", "encode_entries", "entries_below"]

_ENTRY = struct.Struct(">hqqqq")
ENTRY_BYTES = _ENTRY.size
_VERSION = 0
assert ENTRY_BYTES == 34


@dataclass(frozen=True, slots=True)
class TxnIndexEntry:
    producer_id: int
    first_offset: int
    last_offset: int  # the ABORT marker's offset
    last_stable_offset: int


def encode_entries(entries: Iterable[TxnIndexEntry]) -> bytes:
    return b"".join(
        _ENTRY.pack(_VERSION, e.producer_id, e.first_offset, e.last_offset,
                    e.last_stable_offset)
        for e in entries
    )


def decode_entries(data: bytes, *, base_offset: int, end_offset: int
                   ) -> list[TxnIndexEntry] | None:
    """Parse a ``.txnindex`` of the segment ``[base_offset, end_offset)``; None when a check
    fails: size not a multiple of 34, another version, a negative producer id, a marker
    outside the segment, ``firstOffset > lastOffset``, markers not strictly increasing."""
    if len(data) % ENTRY_BYTES:
        return None
    entries: list[TxnIndexEntry] = []
    previous_last = base_offset - 1
    for version, producer_id, first, last, stable in _ENTRY.iter_unpack(data):
        if version != _VERSION or producer_id < 0 or not 0 <= first <= last:
            return None
        if not previous_last < last < end_offset:
            return None
        entries.append(TxnIndexEntry(producer_id, first, last, stable))
        previous_last = last
    return entries


def entries_below(data: bytes, offset: int) -> bytes:
    """The whole entries of ``data`` whose marker is below ``offset`` (for truncation)."""
    whole = len(data) - len(data) % ENTRY_BYTES
    return b"".join(
        data[start:start + ENTRY_BYTES] for start in range(0, whole, ENTRY_BYTES)
        if _ENTRY.unpack_from(data, start)[3] < offset
    )
