"""ListOffsets by timestamp at record granularity (KIP-79) and MAX_TIMESTAMP (KIP-734).

Kafka answers the offset and timestamp of the first *record* whose timestamp is >= the
target: the time index finds the first batch whose maxTimestamp reaches it, then that one
batch's records are decoded (decompressed if need be). ``build_batch`` gives every record
the batch timestamp, so these tests encode batches whose records carry distinct ones.
"""

from __future__ import annotations

import gzip
import logging
import struct
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import cramjam
import crc32c
import pytest

import raftlog.partition.segment_timestamps as segment_timestamps
from raftlog.broker.apis import KafkaApis
from raftlog.config import ServerConfig
from raftlog.metadata.image import MetadataImage
from raftlog.partition.batch import RECORD_BATCH_OVERHEAD, parse_header, record_timestamps
from raftlog.partition.errors import CorruptRecordError
from raftlog.partition.log import LOG_APPEND_TIME, LogConfig, PartitionLog
from raftlog.partition.manager import PartitionManager
from raftlog.partition.segment_timestamps import TimestampAndOffset
from raftlog.protocol import codec
from raftlog.protocol.codec import RequestHeader
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import LIST_OFFSETS
from raftlog.quorum.interface import Quorum
from raftlog.server.listener import RequestContext

T0 = 1_700_000_000_000
_HEADER = struct.Struct(">qiibIhiqqqhii")  # the v2 batch header, see raftlog.partition.batch
_CODEC_GZIP, _CODEC_ZSTD, _CODEC_SNAPPY = 1, 4, 2
_CONTROL_BITS = 0x30  # control + transactional


def _varint(value: int) -> bytes:
    encoded = (value << 1) ^ (value >> 63)
    out = bytearray()
    while encoded >= 0x80:
        out.append((encoded & 0x7F) | 0x80)
        encoded >>= 7
    out.append(encoded)
    return bytes(out)


def _record(offset_delta: int, timestamp_delta: int, value: bytes) -> bytes:
    body = b"\x00" + _varint(timestamp_delta) + _varint(offset_delta)
    body += _varint(-1) + _varint(len(value)) + value + _varint(0)  # null key, no headers
    return _varint(len(body)) + body


def timed_batch(timestamps: Sequence[int], *, codec: int = 0, attributes: int = 0,
                producer_id: int = -1, payload: bytes | None = None) -> bytes:
    """A v2 batch (as a producer sends it) whose records carry ``timestamps`` in order:
    firstTimestamp is the first record's, maxTimestamp the largest."""
    records = b"".join(_record(i, ts - timestamps[0], b"value-%d" % i)
                       for i, ts in enumerate(timestamps))
    if payload is None:
        payload = {0: records, _CODEC_GZIP: gzip.compress(records),
                   _CODEC_ZSTD: bytes(cramjam.zstd.compress(records))}[codec]
    header = _HEADER.pack(0, 49 + len(payload), -1, 2, 0, attributes | codec,
                          len(timestamps) - 1, timestamps[0], max(timestamps), producer_id,
                          0 if producer_id >= 0 else -1, -1, len(timestamps))
    batch = bytearray(header + payload)
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


def open_log(directory: Path, **settings: int | str) -> PartitionLog:
    return PartitionLog.open(directory / "topic-0", LogConfig(**settings), T0)  # type: ignore[arg-type]


def answer(log: PartitionLog, target_ms: int) -> tuple[int, int] | None:
    found = log.find_offset_by_timestamp(target_ms)
    return None if found is None else (found.offset, found.timestamp_ms)


# Offsets 0-1 precede the batch under test, which holds offsets 2-6 (timestamps not in
# order, as producers may send them) and is followed by offsets 7-8.
MIDDLE = [T0 + 10, T0 + 20, T0 + 20, T0 + 30, T0 + 25]
EXPECTED = {
    T0 - 5: (0, T0 + 1),  # before everything: the first record
    T0 + 2: (1, T0 + 2),
    T0 + 3: (2, T0 + 10),  # between batches: the first record of the next one
    T0 + 10: (2, T0 + 10),  # equal to a record's timestamp
    T0 + 15: (3, T0 + 20),  # between records inside one batch: not the batch's base offset
    T0 + 20: (3, T0 + 20),  # two records share it: the first one
    T0 + 21: (5, T0 + 30),
    T0 + 25: (5, T0 + 30),  # offset order wins: 30 at offset 5 comes before 25 at offset 6
    T0 + 30: (5, T0 + 30),
    T0 + 31: (7, T0 + 40),  # past the batch's maxTimestamp: the next batch
    T0 + 41: (8, T0 + 41),  # the last record
    T0 + 42: None,  # after the last record
}


def fill(log: PartitionLog, codec: int = 0) -> None:
    log.append(timed_batch([T0 + 1, T0 + 2]), leader_epoch=3, now_ms=T0)
    log.append(timed_batch(MIDDLE, codec=codec), leader_epoch=4, now_ms=T0)
    log.append(timed_batch([T0 + 40, T0 + 41]), leader_epoch=5, now_ms=T0)


@pytest.mark.parametrize("codec", [0, _CODEC_GZIP, _CODEC_ZSTD], ids=["none", "gzip", "zstd"])
def test_answers_the_first_record_at_or_after_the_target(tmp_path: Path, codec: int) -> None:
    log = open_log(tmp_path)
    fill(log, codec)
    for target, expected in EXPECTED.items():
        assert answer(log, target) == expected, target
        assert log.offset_for_timestamp(target) == expected, target
    assert log.find_offset_by_timestamp(T0 + 15) == TimestampAndOffset(T0 + 20, 3, 4), \
        "the leader epoch is the found record's batch's"
    log.close()


def test_same_answers_from_sealed_segments_after_reopen(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=61, index_interval_bytes=1)  # one batch a segment
    fill(log, _CODEC_GZIP)
    assert log.segment_base_offsets == [0, 2, 7]
    for target, expected in EXPECTED.items():
        assert answer(log, target) == expected, target
    log.close()
    reopened = open_log(tmp_path, segment_bytes=61, index_interval_bytes=1)
    for target, expected in EXPECTED.items():
        assert answer(reopened, target) == expected, target
    reopened.close()


def test_log_append_time_gives_every_record_the_append_time(tmp_path: Path) -> None:
    log = open_log(tmp_path, message_timestamp_type=LOG_APPEND_TIME)
    # The producer's timestamps (deltas) would answer offset 1 for T0 + 150; the broker's
    # append time replaces them all.
    log.append(timed_batch([T0 + 100, T0 + 200, T0 + 300]), leader_epoch=0, now_ms=T0 + 50)
    log.append(timed_batch([T0 + 1, T0 + 2]), leader_epoch=0, now_ms=T0 + 60)
    assert answer(log, T0) == (0, T0 + 50)
    assert answer(log, T0 + 50) == (0, T0 + 50)
    assert answer(log, T0 + 51) == (3, T0 + 60)
    assert answer(log, T0 + 150) is None
    found = log.find_max_timestamp()
    assert found is not None and (found.offset, found.timestamp_ms) == (3, T0 + 60)
    log.close()


def test_log_start_offset_bounds_the_answer(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    fill(log)
    log.close()
    (tmp_path / "topic-0" / "log-start-offset").write_text("0\n4\n")  # as DeleteRecords does
    log = open_log(tmp_path)
    assert log.log_start_offset == 4
    assert answer(log, T0) == (4, T0 + 20), "offsets 0-3 are gone, even inside the batch"
    assert answer(log, T0 + 21) == (5, T0 + 30)
    log.close()


def test_control_batches_are_searched_like_data(tmp_path: Path) -> None:
    """Kafka's FileRecords.searchForTimestamp does not skip control batches."""
    log = open_log(tmp_path)
    log.append(timed_batch([T0 + 1]), leader_epoch=0, now_ms=T0)
    marker = timed_batch([T0 + 9], attributes=_CONTROL_BITS, producer_id=7)
    log.append(marker, leader_epoch=0, now_ms=T0, allow_control=True)
    assert answer(log, T0 + 5) == (1, T0 + 9)
    log.close()


def test_max_timestamp_is_the_earliest_record_carrying_it(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=61)  # one batch a segment
    assert log.find_max_timestamp() is None, "an empty log has no answer"
    log.append(timed_batch([T0 + 1, T0 + 9, T0 + 3]), leader_epoch=1, now_ms=T0)
    log.append(timed_batch([T0 + 2, T0 + 50, T0 + 7, T0 + 50], codec=_CODEC_GZIP),
               leader_epoch=2, now_ms=T0)
    assert log.find_max_timestamp() == TimestampAndOffset(T0 + 50, 4, 2), \
        "the record, not its batch's base offset (3)"
    log.append(timed_batch([T0 + 50, T0 + 4]), leader_epoch=3, now_ms=T0)
    assert log.find_max_timestamp() == TimestampAndOffset(T0 + 50, 4, 2), \
        "ties go to the earliest record"
    log.append(timed_batch([T0 + 60]), leader_epoch=3, now_ms=T0)
    assert log.find_max_timestamp() == TimestampAndOffset(T0 + 60, 9, 3)
    log.close()


def test_unreadable_records_fall_back_to_the_batch(tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A batch whose compressed records cannot be decoded (CRC-valid garbage from a buggy
    producer) answers at batch granularity with a warning instead of failing the request."""
    log = open_log(tmp_path)
    log.append(timed_batch([T0 + 1]), leader_epoch=0, now_ms=T0)
    garbage = timed_batch([T0 + 5, T0 + 8], codec=_CODEC_SNAPPY, payload=b"not snappy at all")
    log.append(garbage, leader_epoch=0, now_ms=T0)
    with caplog.at_level(logging.WARNING):
        assert answer(log, T0 + 7) == (1, T0 + 8)
    assert "cannot read the records" in caplog.text
    log.close()


# -- hardening: records a producer got wrong never steer the answer outside their batch ------


def _batch_with_deltas(deltas: Sequence[int], timestamps: Sequence[int]) -> bytes:
    """A CRC-valid batch whose records claim ``deltas`` as offsetDeltas (the header says
    lastOffsetDelta = len - 1): the broker never decodes records at produce, so it stores
    whatever a buggy or hostile producer sent."""
    records = b"".join(_record(delta, ts - timestamps[0], b"v")
                       for delta, ts in zip(deltas, timestamps, strict=True))
    header = _HEADER.pack(0, 49 + len(records), -1, 2, 0, 0, len(deltas) - 1, timestamps[0],
                          max(timestamps), -1, -1, -1, len(deltas))
    batch = bytearray(header + records)
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


@pytest.mark.parametrize(("deltas", "timestamps"), [
    ([-4, 1000], [T0 + 100, T0 + 100]),  # below the log start, past the log end
    ([0, 2], [T0 + 50, T0 + 100]),  # past the header's lastOffsetDelta (1)
    ([1, 0], [T0 + 100, T0 + 50]),  # decreasing
    ([1, 1], [T0 + 100, T0 + 50]),  # repeated
], ids=["outside-log", "past-last-delta", "decreasing", "repeated"])
def test_bad_record_offset_deltas_fall_back_to_the_batch(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, deltas: list[int],
        timestamps: list[int]) -> None:
    log = open_log(tmp_path)
    for i in range(5):
        log.append(timed_batch([T0 + i]), leader_epoch=0, now_ms=T0)  # offsets 0-4
    log.advance_log_start_offset(3)
    log.append(_batch_with_deltas(deltas, timestamps), leader_epoch=0, now_ms=T0)  # 5-6
    with caplog.at_level(logging.WARNING):
        found = log.find_offset_by_timestamp(T0 + 100)
    assert found is not None
    assert (found.offset, found.timestamp_ms) == (5, T0 + 100), "the batch's base offset"
    assert log.log_start_offset <= found.offset < log.log_end_offset
    assert "cannot read the records" in caplog.text
    log.close()


def test_undecodable_batch_straddling_the_log_start_answers_the_log_start(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """DeleteRecords left the log start inside an undecodable batch (offsets 2-4): the
    batch-granular answer is the log start, not the next batch (which skipped 3-4)."""
    log = open_log(tmp_path)
    log.append(timed_batch([T0 + 1, T0 + 2]), leader_epoch=0, now_ms=T0)
    garbage = timed_batch([T0 + 5, T0 + 6, T0 + 8], codec=_CODEC_SNAPPY, payload=b"not snappy")
    log.append(garbage, leader_epoch=0, now_ms=T0)
    log.append(timed_batch([T0 + 20]), leader_epoch=0, now_ms=T0)
    log.advance_log_start_offset(3)
    with caplog.at_level(logging.WARNING):
        assert answer(log, T0 + 3) == (3, T0 + 8)
        assert answer(log, T0 + 9) == (5, T0 + 20)
        assert answer(log, T0 + 3) == (3, T0 + 8)
    warnings = [r for r in caplog.records if "cannot read the records" in r.getMessage()]
    assert len(warnings) == 1, "one warning per batch, not one per lookup"
    log.close()


def test_max_timestamp_is_not_bounded_by_the_log_start(tmp_path: Path) -> None:
    """As Kafka's UnifiedLog (MAX_TIMESTAMP): the segment with the largest timestamp is
    searched from its start; DeleteRecords' log start does not bound the answer."""
    log = open_log(tmp_path)
    log.append(timed_batch([T0 + 50, T0 + 1]), leader_epoch=1, now_ms=T0)
    log.append(timed_batch([T0 + 2]), leader_epoch=1, now_ms=T0)
    log.advance_log_start_offset(2)
    assert log.find_max_timestamp() == TimestampAndOffset(T0 + 50, 0, 1)
    log.close()


def _bomb_batch(uncompressed_bytes: int) -> bytes:
    """One valid record whose value is ``uncompressed_bytes`` of zeros, gzip-compressed
    (a few KiB on disk)."""
    record = _record(0, 0, bytes(uncompressed_bytes))
    payload = gzip.compress(record)
    header = _HEADER.pack(0, 49 + len(payload), -1, 2, 0, _CODEC_GZIP, 0, T0 + 5, T0 + 5,
                          -1, -1, -1, 1)
    batch = bytearray(header + payload)
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


def test_decompression_past_the_cap_falls_back_to_the_batch(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    cap_bytes = 64 * 1024
    monkeypatch.setattr(segment_timestamps, "DECOMPRESSED_RECORDS_BYTES_MAX", cap_bytes)
    log = open_log(tmp_path)
    log.append(timed_batch([T0 + 1]), leader_epoch=0, now_ms=T0)
    bomb = _bomb_batch(8 * 1024 * 1024)
    assert len(bomb) < 16 * 1024
    log.append(bomb, leader_epoch=0, now_ms=T0)
    tracemalloc.start()
    try:
        with caplog.at_level(logging.WARNING):
            assert answer(log, T0 + 2) == (1, T0 + 5)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "more than 65536 bytes" in caplog.text, "the cap, not another failure"
    assert peak_bytes < 16 * cap_bytes, "decompression stopped near the cap"
    monkeypatch.setattr(segment_timestamps, "DECOMPRESSED_RECORDS_BYTES_MAX", 16 * 1024 * 1024)
    assert answer(log, T0 + 2) == (1, T0 + 5), "below the cap: record granular"
    log.close()


def _records_section(batch: bytes) -> bytes:
    return batch[RECORD_BATCH_OVERHEAD:]


def test_record_timestamps_checks_offset_deltas_and_count_against_the_header() -> None:
    compacted = _batch_with_deltas([0, 2], [T0 + 1, T0 + 3])  # lastOffsetDelta 1: patch to 2
    header_bytes = bytearray(compacted)
    struct.pack_into(">i", header_bytes, 23, 2)
    header = parse_header(bytes(header_bytes))
    assert record_timestamps(header, _records_section(compacted)) == \
        [(0, T0 + 1), (2, T0 + 3)], "compaction leaves gaps: allowed"
    two = _batch_with_deltas([0, 1], [T0 + 1, T0 + 2])
    for records_count in (1, 3, -1):  # fewer, more than lastOffsetDelta allows, negative
        patched = bytearray(two)
        struct.pack_into(">i", patched, 57, records_count)
        with pytest.raises(CorruptRecordError):
            record_timestamps(parse_header(bytes(patched)), _records_section(two))
    with pytest.raises(CorruptRecordError, match="offsetDelta 1000"):
        record_timestamps(parse_header(two), _records_section(_batch_with_deltas(
            [0, 1000], [T0 + 1, T0 + 2])))


def test_an_unreadable_batch_is_not_decoded_again(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 2: a batch past the decompression cap (or otherwise unreadable) was
    decompressed again on every lookup, ~200 ms on the event loop each for a bomb. It is now
    remembered per segment and answered at batch granularity at once."""
    monkeypatch.setattr(segment_timestamps, "DECOMPRESSED_RECORDS_BYTES_MAX", 64 * 1024)
    calls: list[int] = []
    real = segment_timestamps.decompress_records

    def counting(codec: int, data: bytes, *, max_bytes: int | None) -> object:
        calls.append(codec)
        return real(codec, data, max_bytes=max_bytes)

    monkeypatch.setattr(segment_timestamps, "decompress_records", counting)
    log = open_log(tmp_path)
    log.append(timed_batch([T0 + 1]), leader_epoch=0, now_ms=T0)
    log.append(_bomb_batch(1024 * 1024), leader_epoch=0, now_ms=T0)
    for _ in range(3):
        assert answer(log, T0 + 2) == (1, T0 + 5)
    assert len(calls) == 1, "decoded once, then remembered"
    log.close()


def test_a_partition_named_twice_is_answered_invalid_request(tmp_path: Path) -> None:
    """As Kafka (ListOffsetsRequest.duplicatePartitions): every entry of a partition named
    more than once gets INVALID_REQUEST, so one request cannot repeat a costly lookup; the
    other partitions are answered as usual."""
    config = ServerConfig.from_properties({"node.id": "1", "log.dirs": str(tmp_path)})
    manager = PartitionManager(tmp_path, node_id=1)
    for index in (0, 1):
        partition = manager.ensure_partition("t", index, {}, leader_epoch=0)
        partition.log.append(timed_batch([T0 + 1, T0 + 2]), leader_epoch=0, now_ms=T0)
        partition.high_watermark = 2
    apis = KafkaApis(config, cast(Quorum, SimpleNamespace(image=MetadataImage())), manager)
    entries = [{"partition_index": i, "timestamp": T0 + 2} for i in (0, 1, 0)]
    raw = codec.encode_bytes(LIST_OFFSETS, 7, {"replica_id": -1, "topics": [
        {"name": "t", "partitions": entries}]}, is_request=True)
    body = codec.decode(LIST_OFFSETS, 7, raw, is_request=True)
    answer = apis.offset_apis.list_offsets(RequestContext(
        LIST_OFFSETS, RequestHeader(LIST_OFFSETS.key, 7, 1, "c"), body, "peer"))
    assert isinstance(answer, dict)
    got = [(r["partition_index"], r["error_code"], r["offset"])
           for r in answer["topics"][0]["partitions"]]
    assert got == [(0, ErrorCode.INVALID_REQUEST, -1), (1, ErrorCode.NONE, 1),
                   (0, ErrorCode.INVALID_REQUEST, -1)]
    manager.close()
