"""The records of ``__consumer_offsets``, in Kafka's own layouts.

Keys and values are Kafka's ``OffsetCommitKey`` / ``OffsetCommitValue`` and
``GroupMetadataKey`` / ``GroupMetadataValue`` (apache/kafka
``group-coordinator/src/main/resources/common/message/*.json``), each prefixed by an int16
version as Kafka writes them: key version 1 = an offset commit (0 is the same layout), 2 =
group metadata. Values are written at OffsetCommitValue v3 (offset, leaderEpoch, metadata,
commitTimestamp) and GroupMetadataValue v3 (with groupInstanceId); both are below the first
flexible version (4), so plain (non-compact) encodings. A null value is a tombstone: the
offset was deleted, or the group was.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3
GROUP_METADATA_VALUE_VERSION = 3

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class RecordFormatError(ValueError):
    """A key or value that is not one of the layouts above: an unknown version, a truncated
    or overrunning field, a string that is not UTF-8. The decoders raise nothing else for any
    input bytes, so a replay can skip such a record instead of failing its load."""


@dataclass(frozen=True)
class OffsetKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True)
class GroupKey:
    group: str


@dataclass(frozen=True)
class OffsetValue:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp_ms: int = -1


@dataclass(frozen=True)
class MemberValue:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True)
class GroupValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp_ms: int
    members: tuple[MemberValue, ...]


# -- encoding ---------------------------------------------------------------------------------


def _string(value: str | None) -> bytes:
    if value is None:
        return _I16.pack(-1)
    data = value.encode()
    return _I16.pack(len(data)) + data


def _bytes(value: bytes | None) -> bytes:
    if value is None:
        return _I32.pack(-1)
    return _I32.pack(len(value)) + value


def encode_key(key: OffsetKey | GroupKey) -> bytes:
    if isinstance(key, OffsetKey):
        return (_I16.pack(OFFSET_COMMIT_KEY_VERSION) + _string(key.group) + _string(key.topic)
                + _I32.pack(key.partition))
    return _I16.pack(GROUP_METADATA_KEY_VERSION) + _string(key.group)


def encode_offset_value(value: OffsetValue) -> bytes:
    return (_I16.pack(OFFSET_COMMIT_VALUE_VERSION) + _I64.pack(value.offset)
            + _I32.pack(value.leader_epoch) + _string(value.metadata)
            + _I64.pack(value.commit_timestamp_ms))


def encode_group_value(value: GroupValue) -> bytes:
    out = bytearray(_I16.pack(GROUP_METADATA_VALUE_VERSION))
    out += _string(value.protocol_type) + _I32.pack(value.generation)
    out += _string(value.protocol) + _string(value.leader)
    out += _I64.pack(value.current_state_timestamp_ms)
    out += _I32.pack(len(value.members))
    for m in value.members:
        out += _string(m.member_id) + _string(m.group_instance_id) + _string(m.client_id)
        out += _string(m.client_host) + _I32.pack(m.rebalance_timeout_ms)
        out += _I32.pack(m.session_timeout_ms) + _bytes(m.subscription) + _bytes(m.assignment)
    return bytes(out)


# -- decoding ---------------------------------------------------------------------------------


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def _take(self, packer: struct.Struct) -> int:
        if self.pos + packer.size > len(self.data):
            raise RecordFormatError("record truncated")
        (value,) = packer.unpack_from(self.data, self.pos)
        self.pos += packer.size
        return int(value)

    def i16(self) -> int:
        return self._take(_I16)

    def i32(self) -> int:
        return self._take(_I32)

    def i64(self) -> int:
        return self._take(_I64)

    def raw(self, size: int) -> bytes:
        if size < 0 or self.pos + size > len(self.data):
            raise RecordFormatError("record field overruns the record")
        chunk = self.data[self.pos:self.pos + size]
        self.pos += size
        return chunk

    def nullable_string(self) -> str | None:
        size = self.i16()
        if size == -1:
            return None
        try:
            return self.raw(size).decode()
        except UnicodeDecodeError as exc:
            raise RecordFormatError(f"string field is not UTF-8: {exc}") from exc

    def string(self) -> str:
        value = self.nullable_string()
        if value is None:
            raise RecordFormatError("null where a string is required")
        return value

    def bytes_(self) -> bytes:
        size = self.i32()
        return b"" if size == -1 else self.raw(size)


def decode_key(data: bytes) -> OffsetKey | GroupKey:
    cursor = _Cursor(data)
    version = cursor.i16()
    if version in (0, 1):
        return OffsetKey(cursor.string(), cursor.string(), cursor.i32())
    if version == 2:
        return GroupKey(cursor.string())
    raise RecordFormatError(f"unknown __consumer_offsets key version {version}")


def decode_offset_value(data: bytes) -> OffsetValue:
    cursor = _Cursor(data)
    version = cursor.i16()
    if not 0 <= version <= 3:
        raise RecordFormatError(f"unsupported OffsetCommitValue version {version}")
    offset = cursor.i64()
    epoch = cursor.i32() if version >= 3 else -1
    metadata = cursor.string()
    timestamp = cursor.i64()
    if version == 1:
        cursor.i64()  # expireTimestamp
    return OffsetValue(offset, epoch, metadata, timestamp)


def decode_group_value(data: bytes) -> GroupValue:
    cursor = _Cursor(data)
    version = cursor.i16()
    if not 0 <= version <= 3:
        raise RecordFormatError(f"unsupported GroupMetadataValue version {version}")
    protocol_type = cursor.string()
    generation = cursor.i32()
    protocol = cursor.nullable_string()
    leader = cursor.nullable_string()
    timestamp = cursor.i64() if version >= 2 else -1
    members = []
    for _ in range(cursor.i32()):
        member_id = cursor.string()
        instance = cursor.nullable_string() if version >= 3 else None
        client_id = cursor.string()
        client_host = cursor.string()
        rebalance = cursor.i32() if version >= 1 else -1
        session = cursor.i32()
        subscription = cursor.bytes_()
        assignment = cursor.bytes_()
        members.append(MemberValue(member_id, instance, client_id, client_host,
                                   rebalance if rebalance >= 0 else session, session,
                                   subscription, assignment))
    return GroupValue(protocol_type, generation, protocol, leader, timestamp, tuple(members))
