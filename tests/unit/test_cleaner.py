"""Compaction invariants (Hypothesis): the latest value per key survives, older values and
expired tombstones go, offsets and producer identities never change, cleaning is idempotent."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.partition.batch import build_batch, decode_records
from raftlog.partition.cleaner import build_offset_map, compact, iter_batches

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
