"""Compaction invariants (Hypothesis): the latest value per key survives, older values and
expired tombstones go, offsets and producer identities never change, cleaning is idempotent."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.partition.batch import (
    RECORD_BATCH_OVERHEAD,
    build_batch,
    check_batch,
    decode_records,
    parse_header,
)
from raftlog.partition.cleaner import (
    AbortedRanges,
    SegmentInfo,
    build_offset_map,
    compact,
    iter_batches,
    plan_pass,
    rebuild_batch,
)
from raftlog.partition.compression import decompress_batches

KEYS = [b"a", b"b", b"c", b"d", None]
RETENTION = 1_000

record = st.tuples(st.sampled_from(KEYS), st.one_of(st.none(), st.binary(max_size=4)))
batch_spec = st.tuples(st.lists(record, min_size=1, max_size=5),
                       st.integers(-1, 2),  # producer id (-1: not idempotent)
                       st.integers(0, 3_000))  # timestamp


def _log(specs: list[tuple[list[tuple[bytes | None, bytes | None]], int, int]]) -> bytes:
    out = bytearray()
    offset = 0
    sequences: dict[int, int] = {}
    for records, producer, timestamp in specs:
        sequence = sequences.get(producer, 0) if producer >= 0 else -1
        out += build_batch([(k, v, ()) for k, v in records], base_offset=offset,
                           timestamp_ms=timestamp, producer_id=producer,
                           producer_epoch=0 if producer >= 0 else -1, base_sequence=sequence)
        if producer >= 0:
            sequences[producer] = sequence + len(records)
        offset += len(records)
    return bytes(out)


@settings(max_examples=300, deadline=None)
@given(st.lists(batch_spec, min_size=1, max_size=12), st.integers(0, 5_000))
def test_compaction_invariants(specs: list, now_ms: int) -> None:
    data = _log(specs)
    before = decode_records(data)
    offset_map = build_offset_map(data)
    cleaned = compact(data, offset_map, now_ms=now_ms, delete_retention_ms=RETENTION)
    after = decode_records(cleaned)
    original = {r.offset: r for r in before}
    # Only removals: every survivor is the original record at its original offset.
    assert all(original[r.offset] == r for r in after)
    assert [r.offset for r in after] == sorted({r.offset for r in after})
    latest = {k: max(r.offset for r in before if r.key == k)
              for k in {r.key for r in before if r.key is not None}}
    survivors = {r.offset for r in after}
    headers = {h.base_offset: h for h, _ in iter_batches(data)}
    for r in before:
        if r.key is None:
            assert r.offset in survivors  # unkeyed records are never compacted away
        elif r.offset < latest[r.key]:
            assert r.offset not in survivors  # an older value never survives its newer one
        elif r.value is not None:
            assert r.offset in survivors  # the latest value always survives
        else:
            header = next(h for h in headers.values()
                          if h.base_offset <= r.offset <= h.last_offset)
            expired = header.max_timestamp + RETENTION <= now_ms
            assert (r.offset in survivors) == (not expired)
    # Batches keep their identity: offsets, producer id/epoch/sequence.
    kept_producers = set()
    for header, _ in iter_batches(cleaned):
        source = headers[header.base_offset]
        assert (header.last_offset_delta, header.producer_id, header.producer_epoch,
                header.base_sequence, header.partition_leader_epoch) == \
            (source.last_offset_delta, source.producer_id, source.producer_epoch,
             source.base_sequence, source.partition_leader_epoch)
        kept_producers.add(header.producer_id)
    for producer in {h.producer_id for h in headers.values() if h.producer_id >= 0}:
        assert producer in kept_producers  # its last batch stays, maybe empty
    # Cleaning again changes nothing.
    again = compact(cleaned, build_offset_map(cleaned), now_ms=now_ms,
                    delete_retention_ms=RETENTION)
    assert decode_records(again) == after


@pytest.mark.parametrize("codec", [1, 2, 3, 4])  # gzip, snappy, lz4, zstd
def test_a_partly_cleaned_compressed_batch_keeps_its_codec(codec: int) -> None:
    plain = build_batch([(b"a", b"1", ()), (b"b", b"2", ()), (b"a", b"3", ())],
                        producer_id=5, producer_epoch=1, base_sequence=10)
    header = replace(parse_header(plain), attributes=codec)
    compressed = rebuild_batch(header, plain[RECORD_BATCH_OVERHEAD:], 3)
    assert parse_header(compressed).compression_codec == codec
    assert decode_records(decompress_batches(compressed)) == decode_records(plain)
    cleaned = compact(compressed, build_offset_map(compressed), now_ms=0,
                      delete_retention_ms=RETENTION)
    out = parse_header(cleaned)
    check_batch(cleaned)
    assert out.compression_codec == codec and out.records_count == 2
    assert (out.last_offset_delta, out.producer_id, out.base_sequence) == (2, 5, 10)
    assert [(r.offset, r.key, r.value) for r in decode_records(decompress_batches(cleaned))] \
        == [(1, b"b", b"2"), (2, b"a", b"3")]


def test_a_batch_that_decompresses_past_the_cap_is_kept_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A compression bomb costs at most the cap: the cleaner keeps such a batch as it is (its
    keys shadow nothing), and the produce-time key check refuses it."""
    import raftlog.partition.cleaner as cleaner
    from raftlog.partition.compression import DecompressedSizeError

    older = build_batch([(b"a", b"old", ())])
    plain = build_batch([(b"a", b"x" * 20_000, ()), (b"a", b"y" * 20_000, ())], base_offset=1)
    header = replace(parse_header(plain), attributes=1)  # gzip
    bomb = rebuild_batch(header, plain[RECORD_BATCH_OVERHEAD:], 2)
    log = older + bomb
    monkeypatch.setattr(cleaner, "DECOMPRESSED_RECORDS_BYTES_MAX", 10_000)
    offset_map = build_offset_map(log)
    assert offset_map == {b"a": 0}  # the bomb's keys were not read
    assert compact(log, offset_map, now_ms=0, delete_retention_ms=RETENTION) == log
    with pytest.raises(DecompressedSizeError):
        cleaner.has_record_without_key(bomb)


def test_an_emptied_batch_goes_unless_it_is_the_last_of_its_producer() -> None:
    first = build_batch([(b"a", b"1", ())], producer_id=5, producer_epoch=0, base_sequence=0)
    second = build_batch([(b"a", b"2", ())], base_offset=1, producer_id=5, producer_epoch=0,
                         base_sequence=1)
    third = build_batch([(b"a", b"3", ())], base_offset=2)
    data = first + second + third
    cleaned = compact(data, build_offset_map(data), now_ms=0, delete_retention_ms=RETENTION)
    headers = [h for h, _ in iter_batches(cleaned)]
    # The first goes; the second is producer 5's last: kept empty, identity intact.
    assert [(h.base_offset, h.records_count, h.producer_id, h.base_sequence)
            for h in headers] == [(1, 0, 5, 1), (2, 1, -1, -1)]


def test_records_of_aborted_transactions_never_enter_the_offset_map() -> None:
    committed = build_batch([(b"k", b"old", ())])
    aborted = build_batch([(b"k", b"aborted", ())], base_offset=1, producer_id=7,
                          producer_epoch=0, base_sequence=0, attributes=0x10)
    data = committed + aborted
    ranges = AbortedRanges([(7, 1, 2)])
    offset_map = build_offset_map(data, aborted=ranges)
    assert offset_map == {b"k": 0}
    cleaned = compact(data, offset_map, now_ms=0, delete_retention_ms=RETENTION,
                      aborted=ranges)
    assert [(r.offset, r.value) for r in decode_records(cleaned)] == [(0, b"old")]


def _infos(*sizes_and_times: tuple[int, int]) -> list[SegmentInfo]:
    """Segments of 100 offsets each with (size, largest timestamp); the last is active."""
    return [SegmentInfo(100 * i, 100 * (i + 1), size, timestamp)
            for i, (size, timestamp) in enumerate(sizes_and_times)]


def test_plan_cleans_whole_sealed_segments_below_the_uncleanable_offset() -> None:
    segments = _infos((10, 0), (10, 0), (10, 0), (10, 0))
    plan = plan_pass(segments, first_dirty_offset=0, uncleanable_offset=10**9, now_ms=0,
                     min_cleanable_dirty_ratio=0.5, min_compaction_lag_ms=0)
    assert plan is not None and plan.cleanable_count == 3  # never the active segment
    plan = plan_pass(segments, first_dirty_offset=0, uncleanable_offset=250, now_ms=0,
                     min_cleanable_dirty_ratio=0.5, min_compaction_lag_ms=0)
    assert plan is not None and plan.cleanable_count == 2  # the LSO is inside segment 2
    assert plan_pass(segments, first_dirty_offset=0, uncleanable_offset=99, now_ms=0,
                     min_cleanable_dirty_ratio=0.0, min_compaction_lag_ms=0) is None


def test_plan_needs_the_dirty_ratio_and_respects_the_compaction_lag() -> None:
    segments = _infos((30, 0), (10, 0), (10, 900), (10, 0))
    # Clean: segment 0 (30 bytes); dirty: 1 and 2 (20 bytes): ratio 0.4.
    assert plan_pass(segments, first_dirty_offset=100, uncleanable_offset=10**9, now_ms=1000,
                     min_cleanable_dirty_ratio=0.5, min_compaction_lag_ms=0) is None
    plan = plan_pass(segments, first_dirty_offset=100, uncleanable_offset=10**9, now_ms=1000,
                     min_cleanable_dirty_ratio=0.4, min_compaction_lag_ms=0)
    assert plan is not None and (plan.cleanable_count, plan.first_dirty_slot) == (3, 1)
    # Segment 2 is younger than the lag: it waits.
    plan = plan_pass(segments, first_dirty_offset=100, uncleanable_offset=10**9, now_ms=1000,
                     min_cleanable_dirty_ratio=0.1, min_compaction_lag_ms=500)
    assert plan is not None and plan.cleanable_count == 2
