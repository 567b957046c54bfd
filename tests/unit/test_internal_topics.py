"""Internal topics: which they are, the config changes refused for them, and the coordinators'
decoders and replay, which must skip any record they cannot decode instead of failing the load.

The failure this guards against: a garbage record in ``__transaction_state`` made the
transaction coordinator's replay raise UnicodeDecodeError, so the partition never loaded and
every transactional producer got COORDINATOR_LOAD_IN_PROGRESS forever (also after restarts).
"""

from __future__ import annotations

import contextlib
import json
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.controller.core import (
    CONFIG_OP_DELETE,
    CONFIG_OP_SET,
    CONFIG_RESOURCE_TOPIC,
    ConfigAlteration,
    ConfigOp,
    plan_config_change,
)
from raftlog.group.records import (
    GroupKey,
    GroupValue,
    MemberValue,
    OffsetKey,
    OffsetValue,
    RecordFormatError,
    decode_group_value,
    decode_key,
    decode_offset_value,
    encode_group_value,
    encode_key,
    encode_offset_value,
)
from raftlog.metadata import errors
from raftlog.metadata.image import MetadataImage, TopicImage, frozen_mapping
from raftlog.partition.batch import build_batch
from raftlog.partition.log import LogConfig, PartitionLog
from raftlog.partition.partition import Partition
from raftlog.protocol.internal_topics import (
    OFFSETS_TOPIC,
    TRANSACTION_STATE_TOPIC,
    UndecodableRecords,
    cleanup_policy_refusal,
    is_internal_topic,
)
from raftlog.txn import coordinator as core
from raftlog.txn.state_log import _replay

T0 = 1_700_000_000_000

# -- which topics, and their configs ------------------------------------------------------


def test_internal_topics_are_kafkas() -> None:
    assert is_internal_topic("__consumer_offsets") and is_internal_topic("__transaction_state")
    assert not is_internal_topic("__other") and not is_internal_topic("orders")


def test_cleanup_policy_of_internal_topics_must_stay_compact() -> None:
    assert cleanup_policy_refusal(OFFSETS_TOPIC, "compact") is None
    assert cleanup_policy_refusal(OFFSETS_TOPIC, " compact ") is None
    for bad in ("delete", "compact,delete", "delete,compact", "", None):
        assert cleanup_policy_refusal(OFFSETS_TOPIC, bad) is not None, bad
        assert cleanup_policy_refusal(TRANSACTION_STATE_TOPIC, bad) is not None, bad
    assert cleanup_policy_refusal("orders", "delete") is None


def _image_with(name: str, configs: dict[str, str]) -> MetadataImage:
    topic = TopicImage(name, b"\x01" * 16, (), frozen_mapping(configs), 3)
    return MetadataImage(topics=frozen_mapping({name: topic}))


def _alter(name: str, *ops: ConfigOp, incremental: bool = True) -> Any:
    image = _image_with(name, {"cleanup.policy": "compact"})
    request = ConfigAlteration(CONFIG_RESOURCE_TOPIC, name, ops, incremental)
    return plan_config_change(image, request, {"cleanup.policy": "delete"})


def test_config_changes_that_stop_compacting_an_internal_topic_are_refused() -> None:
    for name in (OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC):
        refused = [
            _alter(name, ConfigOp("cleanup.policy", CONFIG_OP_SET, "delete")),
            _alter(name, ConfigOp("cleanup.policy", CONFIG_OP_SET, "compact,delete")),
            # Deleting the override falls back to the default, delete.
            _alter(name, ConfigOp("cleanup.policy", CONFIG_OP_DELETE, None)),
            # AlterConfigs (legacy) replaces every override: without the policy, it is gone.
            _alter(name, ConfigOp("segment.bytes", CONFIG_OP_SET, "1048576"), incremental=False),
        ]
        for decision in refused:
            assert decision.error_code == errors.INVALID_CONFIG, decision
            assert not decision.proposals
        allowed = _alter(name, ConfigOp("segment.bytes", CONFIG_OP_SET, "1048576"))
        assert allowed.error_code == errors.NONE and allowed.proposals
    ordinary = _alter("orders", ConfigOp("cleanup.policy", CONFIG_OP_SET, "delete"))
    assert ordinary.error_code == errors.NONE and ordinary.proposals


# -- __consumer_offsets decoders ------------------------------------------------------------


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_offsets_decoders_raise_only_their_own_error(data: bytes) -> None:
    for decode in (decode_key, decode_offset_value, decode_group_value):
        with contextlib.suppress(RecordFormatError):  # anything else fails the test
            decode(data)


_short_text = st.text(max_size=8)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_short_text, st.integers(-2, 40)), max_size=12),
       st.sampled_from([0, 1, 2, 3]))
def test_offsets_decoders_on_near_valid_layouts(fields: list[str | int], version: int) -> None:
    """Strings (maybe not UTF-8 once cut) and int16/int32 lengths in the layouts' order: the
    shapes a fuzzer over raw bytes rarely reaches."""
    out = bytearray(struct.pack(">h", version))
    for item in fields:
        if isinstance(item, str):
            raw = item.encode("utf-16-le")  # often not valid UTF-8
            out += struct.pack(">h", len(raw)) + raw
        else:
            out += struct.pack(">i", item)
    for decode in (decode_key, decode_offset_value, decode_group_value):
        with contextlib.suppress(RecordFormatError):  # anything else fails the test
            decode(bytes(out))


def test_offsets_strings_that_are_not_utf8_are_a_format_error() -> None:
    key = struct.pack(">hh", 2, 2) + b"\xff\xfe"
    try:
        decode_key(key)
    except RecordFormatError as exc:
        assert "UTF-8" in str(exc)
    else:
        raise AssertionError("a non-UTF-8 group id decoded")


def test_offsets_records_still_round_trip() -> None:
    assert decode_key(encode_key(OffsetKey("g", "t", 3))) == OffsetKey("g", "t", 3)
    assert decode_key(encode_key(GroupKey("g"))) == GroupKey("g")
    value = OffsetValue(42, 7, "meta", T0)
    assert decode_offset_value(encode_offset_value(value)) == value
    group = GroupValue("consumer", 3, "range", "m", T0, (
        MemberValue("m", "i", "c", "/h", 30_000, 10_000, b"s", b"a"),))
    assert decode_group_value(encode_group_value(group)) == group


# -- __transaction_state decoders ---------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=4),
    max_leaves=12)


def _valid_value() -> dict[str, Any]:
    metadata = core.TxnMetadata("t", 1000, 3, 60_000, core.TxnState.ONGOING,
                                frozenset({("orders", 1)}), T0, T0, 2, frozenset({"g"}))
    value: dict[str, Any] = json.loads(core.encode_metadata(metadata))
    return value


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200), st.one_of(st.none(), st.binary(max_size=200)))
def test_txn_replay_raises_only_its_own_error_on_any_bytes(key: bytes, value: bytes | None
                                                           ) -> None:
    txns: dict[str, core.TxnMetadata] = {}
    try:
        core.replay_record(txns, key, value)
    except core.TxnRecordError:
        assert txns == {}


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(sorted(_valid_value())), _json)
def test_txn_values_with_a_field_of_any_json_decode_or_raise_their_error(
        field: str, replacement: Any) -> None:
    value = _valid_value()
    value[field] = replacement
    try:
        metadata = core.decode_metadata("t", json.dumps(value).encode())
    except core.TxnRecordError:
        return
    # What decodes is what the coordinator can write back and answer with.
    assert core.decode_metadata("t", core.encode_metadata(metadata)) == metadata
    assert -(1 << 15) <= metadata.producer_epoch < 1 << 15
    assert all(isinstance(t, str) and p >= 0 for t, p in metadata.partitions)


def test_txn_values_that_are_not_transaction_metadata_are_refused() -> None:
    for bad in (b"\xff\xfe\x00garbage", b"[]", b"null", b"{}", b"[" * 100_000,
                json.dumps({**_valid_value(), "v": 1}).encode(),
                json.dumps({**_valid_value(), "producer_id": 1 << 63}).encode(),
                json.dumps({**_valid_value(), "producer_epoch": True}).encode(),
                json.dumps({**_valid_value(), "groups": "abc"}).encode(),
                json.dumps({**_valid_value(), "partitions": [["t", -1]]}).encode()):
        try:
            core.decode_metadata("t", bad)
        except core.TxnRecordError:
            continue
        raise AssertionError(f"{bad[:60]!r} decoded")


def test_txn_values_without_the_newer_fields_still_decode() -> None:
    value = _valid_value()
    del value["groups"], value["last_producer_epoch"], value["v"]
    metadata = core.decode_metadata("t", json.dumps(value).encode())
    assert metadata.groups == frozenset() and metadata.last_producer_epoch == core.NO_EPOCH


# -- __transaction_state replay over a real log -------------------------------------------


def _compressed_looking(batch: bytes) -> bytes:
    """``batch`` with the gzip codec bit set and its CRC recomputed: valid on disk, but its
    records cannot be read (what a client's compressed garbage would look like)."""
    out = bytearray(batch)
    attributes = struct.unpack_from(">h", out, 21)[0] | 1
    struct.pack_into(">h", out, 21, attributes)
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


def test_txn_replay_skips_undecodable_records_and_keeps_the_rest(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "__transaction_state-0",
                            LogConfig(cleanup_policy="compact"), T0)
    good = core.TxnMetadata("good", 7, 0, 60_000, core.TxnState.EMPTY, last_update_ms=T0)
    later = core.TxnMetadata("later", 8, 1, 60_000, core.TxnState.COMPLETE_COMMIT)
    batches = [
        build_batch([(b"good", core.encode_metadata(good), ())]),
        build_batch([(b"\xff\xfe", b"{}", ()), (b"bad-json", b"\x80garbage", ())]),
        build_batch([(b"bad-fields", b'{"producer_id": "x"}', ())]),
        _compressed_looking(build_batch([(b"zipped", core.encode_metadata(later), ())])),
        build_batch([(b"later", core.encode_metadata(later), ())]),
    ]
    for batch in batches:
        log.append(batch, leader_epoch=0, now_ms=T0)
    try:
        txns, skipped = _replay(cast(Partition, SimpleNamespace(log=log)))
    finally:
        log.close()
    assert txns == {"good": good, "later": later}
    assert skipped.count == 4
    assert skipped.first_offset == 1 and "UTF-8" in skipped.first_reason
    assert "4 undecodable" in skipped.summary("__transaction_state-0")


def test_undecodable_records_keeps_the_first_reason() -> None:
    tally = UndecodableRecords()
    tally.add(5, "first")
    tally.add(9, "second")
    assert (tally.count, tally.first_offset, tally.first_reason) == (2, 5, "first")
