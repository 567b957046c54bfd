"""Kafka protocol fuzzing: mutated request frames of every API and version, sent to a node.

Used by ``tests/integration/test_fuzz.py`` (100,000 frames in the suite) and by ``make fuzz``
(a longer run with a seed from the command line). Everything is derived from one seed, so a
failing run can be repeated exactly.

Valid requests are built from the schemas (``raftlog.protocol.schemas*``) with values chosen by
field name (topic names from a small pool, small timeouts so nothing long-polls for minutes,
boundary integers, nulls where the version allows them). Each is then sent as it is or
mutated: bit flips, interesting integers written over a field, truncation, extension, ranges
deleted or duplicated, splices from another request, the API key or version changed, or the
size prefix lied about.

The node closes a connection at its first malformed frame, so the frames of one connection
are planned with the node's own decoder: every frame it will accept comes first, and at most
one frame it refuses comes last. Nearly every frame sent is therefore read and handled.

Destructive but legitimate requests are kept away from what the caller checks afterwards:
requests name only the topics in ``FUZZ_TOPICS`` (and the internal topics), config changes use
topic-level names only (a broker resource refuses them), and the broker RPCs name broker ids
and epochs that are not the node's own.
"""

from __future__ import annotations

import argparse
import random
import struct
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from raftlog.partition.batch import build_batch
from raftlog.protocol import codec
from raftlog.protocol.api_table import APIS_BY_KEY
from raftlog.protocol.codec import Api, DecodeError, Field
from raftlog.protocol.schemas import API_VERSIONS, ENVELOPE, PRODUCE
from raftlog.security.session import ADMIN_USER, CLUSTER_MECHANISM, ClusterCredentials

# Every API the listener decodes: schemas.py, schemas_group.py, schemas_txn.py and the rest.
EVERY_API: tuple[Api, ...] = tuple(sorted(APIS_BY_KEY.values(), key=lambda api: api.key))
# SaslHandshake and SaslAuthenticate change what the connection may send next (Kafka: only
# SASL requests during an exchange, nothing after a failed one).
_SASL_KEYS = frozenset({17, 36})
FUZZ_TOPICS = ("fuzz", "fuzz-b")
# Settings for the node under fuzz: group sessions short enough that a member a fuzzed
# JoinGroup left behind never holds the next rebalance for long (JoinGroup v0 has no
# rebalance timeout: the session timeout stands in for it), and no initial rebalance delay.
NODE_PROPERTIES = {
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "10",
    "group.max.session.timeout.ms": "1000",
}
_SIZE = struct.Struct(">i")
_CORRELATION = struct.Struct(">i")
# How often a refused frame is sent (ending its connection) rather than drawn again: the node
# reads nothing after it, so a low share keeps most frames handled.
REFUSAL_ENDS = 0.01
# The same for accepted frames after which the node may close (acks=0 produce, SASL).
ACCEPTED_ENDS = 0.1
_HEADER_END = 8  # api key, version, correlation id
_FRAMES_PER_SEND = 16

# ---------------------------------------------------------------------------------------------
# Values by field name

# The longest string every version can carry (an int16 length): echoed into a response, or
# quoted in an error message, it must still fit. Any string field or client id may be it,
# rarely (its frames are big and every log line quoting it is 32 KB).
LONGEST = "L" * 0x7FFF
LONGEST_SHARE = 0.01
_TOPIC_NAMES: tuple[str | None, ...] = (
    *FUZZ_TOPICS, *FUZZ_TOPICS, "missing", "", "__consumer_offsets", "__transaction_state",
    "bad/name", "t" * 250, "\u00fcn\u00efc\u00f6de",
)
_GROUPS = ("g1", "g2", "", "g" * 300)
_TXN_IDS = ("t1", "t2", "", "x" * 300)
_CONFIG_NAMES = ("retention.ms", "cleanup.policy", "max.message.bytes", "segment.bytes",
                 "min.insync.replicas", "unknown.config", "")
_CONFIG_VALUES = ("1", "-1", "0", "compact", "delete", "x", "1000000", "99999999999999999999")
_STRINGS = ("", "a", "range", "roundrobin", "consumer", "Ongoing", "x" * 1000, "\u2603")
CLIENT_IDS = ("fuzz", "fuzz", "fuzz", None, "")  # request headers' (LONGEST aside)

_INT_BITS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64, "uint16": 16, "uint32": 32}
_WAITS = (0, 0, 1, 10, 100, -1)
_BY_NAME: tuple[tuple[Callable[[str], bool], tuple[int, ...]], ...] = (
    (lambda n: n == "acks", (-1, -1, 1, 0, 2, -2)),
    (lambda n: n == "session_timeout_ms", (100, 500, 6000, 1, -1)),
    (lambda n: n == "transaction_timeout_ms", (1000, 60_000, 0, -1)),
    (lambda n: "timeout" in n or "wait" in n or n.endswith("_ms"), _WAITS),
    (lambda n: n in ("broker_id", "node_id", "leader_id"), (2, 3, 1000, -1)),
    (lambda n: n.endswith("broker_epoch"), (-1, 2**40, 2**62)),
    (lambda n: n in ("replica_id",), (-1, -1, -1, 2, -2)),
    (lambda n: "partition" in n or n in ("index", "count"), (0, 0, 1, 2, -1, 2**31 - 1)),
    (lambda n: n in ("num_partitions", "replication_factor"), (1, 1, 2, 3, 0, -1, 100_000)),
    (lambda n: "offset" in n or n == "timestamp", (0, 1, -1, -2, -3, 5, 2**63 - 1)),
    (lambda n: "epoch" in n or "generation" in n, (-1, 0, 1, 2**15 - 1)),
    (lambda n: n.startswith("producer_id"), (-1, 0, 1000, 2**62)),
    (lambda n: n in ("isolation_level", "resource_type", "key_type", "config_operation"),
     (0, 1, 2, 4, -1, 99)),
)
_GENERIC_INTS = (0, 1, -1, 2, 127, 255, 32767, -32768, 2**31 - 1, -(2**31), 2**63 - 1)


def int_choices(name: str) -> tuple[int, ...]:
    """The integers tried for a field called ``name`` (before wrapping to its type)."""
    for matches, choices in _BY_NAME:
        if matches(name):
            return choices
    return _GENERIC_INTS


def string_choices(name: str) -> tuple[str | None, ...]:
    """The strings tried for a field called ``name``: names from small pools, so requests
    meet the same topics, groups and transactions again."""
    if name in ("name", "topic", "topic_name", "resource_name") or name.startswith("topic"):
        return _TOPIC_NAMES
    if "group" in name:
        return _GROUPS
    if "transactional_id" in name:
        return _TXN_IDS
    if name == "value":
        return _CONFIG_VALUES
    if name.startswith("config") or name.endswith("_name"):
        return _CONFIG_NAMES + _STRINGS
    return _STRINGS


def fit(value: int, type_name: str) -> int:
    """``value`` wrapped into the type's range (two's complement, as the wire would)."""
    bits = _INT_BITS[type_name]
    value &= (1 << bits) - 1
    if type_name.startswith("int") and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


class BodyMaker:
    """Random but mostly sensible request bodies, straight from the schemas."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def body(self, api: Api, version: int) -> dict[str, Any]:
        body = self._struct(api.request, version)
        if api is ENVELOPE and self.rng.random() < 0.7:
            body["request_data"] = self.embedded_request()
        return body

    def embedded_request(self) -> bytes:
        """A request header and body, as an Envelope carries one."""
        api = self.rng.choice(EVERY_API)
        version = self.rng.randint(api.min_version, api.max_version)
        return request_payload(api, version, self.body(api, version), 0, "enveloped")

    def _struct(self, fields: Sequence[Field], version: int) -> dict[str, Any]:
        return {f.name: self._value(f, version) for f in fields if version in f.version_range}

    def _value(self, f: Field, version: int) -> Any:
        rng = self.rng
        if f.is_nullable(version) and rng.random() < 0.15:
            return None
        if isinstance(f.type, list):
            return [self._struct(f.type, version) for _ in range(rng.choice((0, 1, 1, 1, 2, 3)))]
        if isinstance(f.type, tuple):
            return self._struct(f.type, version)
        if f.type.startswith("[]"):
            item = Field(f.name, f.type[2:])
            return [self._value(item, version) for _ in range(rng.choice((0, 1, 1, 2, 3)))]
        return self._primitive(f.name, f.type)

    def _primitive(self, name: str, type_name: str) -> Any:
        rng = self.rng
        if type_name in _INT_BITS:
            return fit(rng.choice(int_choices(name)), type_name)
        if type_name == "bool":
            return rng.random() < 0.5
        if type_name == "float64":
            return rng.choice((0.0, 1.5, -1.0))
        if type_name == "uuid":
            return rng.choice((bytes(16), rng.randbytes(16)))
        if type_name == "string":
            return LONGEST if rng.random() < LONGEST_SHARE else rng.choice(string_choices(name))
        if type_name == "records":
            return records_value(rng)
        if name == "client_host_address":  # an Envelope's: IPv4 or IPv6, or nonsense
            return rng.choice((b"\x7f\x00\x00\x01", bytes(16), b"", b"\x01\x02"))
        return rng.randbytes(rng.choice((0, 1, 8, 40)))  # bytes


def records_value(rng: random.Random) -> bytes | None:
    """A records field: mostly a valid batch (plain, transactional or a control batch, which
    clients may not send), else null or garbage."""
    kind = rng.random()
    if kind < 0.7:
        values = [(None, rng.randbytes(rng.choice((0, 5, 50))), ())
                  for _ in range(rng.choice((1, 1, 3)))]
        attributes = rng.choice((0, 0, 0, 0x10, 0x20))  # plain, transactional, control
        pid = rng.choice((-1, -1, 1000))
        return build_batch(values, timestamp_ms=rng.choice((0, 1_700_000_000_000)),
                           producer_id=pid, producer_epoch=0 if pid >= 0 else -1,
                           base_sequence=0 if pid >= 0 else -1, attributes=attributes)
    if kind < 0.8:
        return None
    return rng.randbytes(rng.choice((0, 1, 61, 100)))


def request_payload(api: Api, version: int, body: dict[str, Any], correlation_id: int,
                    client_id: str | None) -> bytes:
    """Header and body of one request, without the size prefix."""
    header = codec.RequestHeader(api.key, version, correlation_id, client_id)
    return codec.encode_request_header(header, api.is_flexible(version)) + codec.encode_bytes(
        api, version, body, is_request=True)


# ---------------------------------------------------------------------------------------------
# Mutations


_INTERESTING = (b"\x00", b"\xff", b"\x7f", b"\x80", b"\x01", b"\xff\xff", b"\x7f\xff",
                b"\x80\x00", b"\x00\x00", b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff",
                b"\x80\x00\x00\x00", b"\x00\x00\x00\x00", b"\x00\x00\x10\x00",
                b"\xff" * 8, b"\x7f" + b"\xff" * 7, b"\x80" + b"\x00" * 7)


class Mutator:
    """Byte-level damage to a request payload (header and body, no size prefix)."""

    def __init__(self, rng: random.Random, donors: Sequence[bytes]) -> None:
        self.rng = rng
        self.donors = donors
        self._ops: tuple[Callable[[bytearray], None], ...] = (
            self._flip_bits, self._flip_bits, self._interesting, self._interesting,
            self._truncate, self._extend, self._delete_range, self._duplicate_range,
            self._splice, self._splice, self._other_version, self._other_api,
        )

    def mutate(self, payload: bytes) -> bytes:
        data = bytearray(payload)
        for _ in range(self.rng.choice((1, 1, 1, 2, 3))):
            self.rng.choice(self._ops)(data)
        return bytes(data)

    def _body_pos(self, data: bytearray) -> int:
        return self.rng.randrange(min(_HEADER_END, len(data)), max(len(data), _HEADER_END + 1))

    def _flip_bits(self, data: bytearray) -> None:
        for _ in range(self.rng.choice((1, 1, 2, 4))):
            if len(data) > _HEADER_END:
                pos = self.rng.randrange(_HEADER_END, len(data))
                data[pos] ^= 1 << self.rng.randrange(8)

    def _interesting(self, data: bytearray) -> None:
        value = self.rng.choice(_INTERESTING)
        pos = self._body_pos(data)
        data[pos:pos + len(value)] = value

    def _truncate(self, data: bytearray) -> None:
        del data[self.rng.randrange(4, max(len(data), 5)):]

    def _extend(self, data: bytearray) -> None:
        data += self.rng.randbytes(self.rng.choice((1, 4, 30)))

    def _delete_range(self, data: bytearray) -> None:
        pos = self._body_pos(data)
        del data[pos:pos + self.rng.choice((1, 2, 4, 8, 20))]

    def _duplicate_range(self, data: bytearray) -> None:
        pos = self._body_pos(data)
        chunk = data[pos:pos + self.rng.choice((1, 2, 4, 16))]
        data[pos:pos] = chunk

    def _splice(self, data: bytearray) -> None:
        """A piece of another valid request (whole fields, often) over part of this one."""
        donor = self.rng.choice(self.donors)
        start = self.rng.randrange(_HEADER_END, max(len(donor), _HEADER_END + 1))
        piece = donor[start:start + self.rng.choice((2, 4, 8, 16, 64))]
        pos = self._body_pos(data)
        data[pos:pos + self.rng.choice((0, len(piece)))] = piece

    def _other_version(self, data: bytearray) -> None:
        struct.pack_into(">h", data, 2, struct.unpack_from(">h", data, 2)[0]
                         + self.rng.choice((-1, 1, 1, 2)))

    def _other_api(self, data: bytearray) -> None:
        api = self.rng.choice(EVERY_API)
        struct.pack_into(">hh", data, 0, api.key,
                         self.rng.randint(api.min_version, api.max_version))


# ---------------------------------------------------------------------------------------------
# What the node will do with a frame


@dataclass(frozen=True)
class Verdict:
    accepted: bool  # the listener decodes it and calls a handler (else it closes)
    answered: bool  # a response comes back (acks=0 produce: none)
    last: bool  # the connection may end with it, so nothing is planned after it


def judge(payload: bytes) -> Verdict:
    """The listener's decisions (``server._dispatch``) for one payload, by the same codec."""
    refused = Verdict(False, False, True)
    if len(payload) < 8:
        return refused
    view = memoryview(payload)
    key, version, _ = codec.peek_request_header(view)
    api = APIS_BY_KEY.get(key)
    if api is None:
        return refused
    if not api.supports(version):
        return Verdict(True, True, False) if api is API_VERSIONS else refused
    try:
        _, pos = codec.decode_request_header(view, api.is_flexible(version))
        body = codec.decode(api, version, view[pos:], is_request=True, allow_trailing=True)
    except DecodeError:
        return refused
    if api is PRODUCE and body.acks == 0:  # a failed acks=0 produce closes (Kafka's way)
        return Verdict(True, False, True)
    return Verdict(True, True, api.key in _SASL_KEYS)


# ---------------------------------------------------------------------------------------------
# Planning connections


@dataclass
class Planned:
    frames: list[bytes]  # size-prefixed, in sending order
    answers: list[int]  # correlation ids of the frames that get a response, in order
    ends_with_refusal: bool


class FrameSource:
    """Every frame of a run, from one seed."""

    def __init__(self, seed: int, templates_per_version: int = 3) -> None:
        self.rng = random.Random(seed)
        maker = BodyMaker(self.rng)
        self.templates: list[bytes] = []
        for api in EVERY_API:
            for version in range(api.min_version, api.max_version + 1):
                for _ in range(templates_per_version):
                    client_id = (LONGEST if self.rng.random() < LONGEST_SHARE
                                 else self.rng.choice(CLIENT_IDS))
                    self.templates.append(request_payload(
                        api, version, maker.body(api, version), 0, client_id))
        self.maker = maker
        self.mutator = Mutator(self.rng, self.templates)

    def connection(self, size: int) -> Planned:
        """Up to ``size`` frames the node accepts, sometimes followed by one it refuses."""
        rng = self.rng
        plan = Planned([], [], False)
        while len(plan.frames) < size:
            payload = self._next_payload()
            verdict = judge(payload)
            correlation_id = len(plan.frames)
            if len(payload) >= _HEADER_END:
                payload = (payload[:4] + _CORRELATION.pack(correlation_id)
                           + payload[_HEADER_END:])
            if not verdict.accepted:
                if rng.random() < REFUSAL_ENDS or len(plan.frames) == size - 1:
                    plan.frames.append(self._frame(payload, lie=rng.random() < 0.1))
                    plan.ends_with_refusal = True
                    return plan
                continue
            if verdict.last and rng.random() > ACCEPTED_ENDS and len(plan.frames) < size - 1:
                continue
            plan.frames.append(self._frame(payload, lie=False))
            if verdict.answered:
                plan.answers.append(correlation_id)
            if verdict.last:
                return plan
        return plan

    def _next_payload(self) -> bytes:
        rng = self.rng
        roll = rng.random()
        if roll < 0.25:  # a fresh valid request: new values reach the handlers
            api = rng.choice(EVERY_API)
            version = rng.randint(api.min_version, api.max_version)
            return request_payload(api, version, self.maker.body(api, version), 0, "fuzz")
        template = rng.choice(self.templates)
        return template if roll < 0.4 else self.mutator.mutate(template)

    def _frame(self, payload: bytes, *, lie: bool) -> bytes:
        size = len(payload)
        if lie:  # the size prefix disagrees with the bytes that follow
            size = self.rng.choice((size + 1, size + 100, max(size - 1, 0), 2**31 - 1, -1, 0))
        return _SIZE.pack(size) + payload


# ---------------------------------------------------------------------------------------------
# Sending


@dataclass
class FuzzStats:
    frames_sent: int = 0
    frames_answered: int = 0
    connections: int = 0
    refusals: int = 0  # connections that ended with a frame the node refuses
    closed_early: list[str] = field(default_factory=list)  # fewer answers than planned
    # The same, but the node reset the connection: closing a socket with unread bytes (a
    # refused frame's rest) makes the kernel send RST and drop responses still queued in the
    # node's send buffer (a listener matter, see ``_FrameReader``).
    lost_to_reset: list[str] = field(default_factory=list)
    out_of_order: list[str] = field(default_factory=list)
    timeouts: list[str] = field(default_factory=list)  # still waiting for an answer
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        return self.frames_sent / self.seconds if self.seconds else 0.0

    def summary(self) -> str:
        return (f"{self.frames_sent} frames sent ({self.frames_answered} answered) over "
                f"{self.connections} connections in {self.seconds:.1f} s = {self.rate:.0f} "
                f"frames/s; {self.refusals} ended by a refused frame, "
                f"{len(self.closed_early)} closed early, {len(self.lost_to_reset)} answers lost"
                f" to a reset, {len(self.timeouts)} timed out")


async def fuzz(host: str, port: int, *, frames: int, seed: int, concurrency: int = 48,
               frames_per_connection: int = 200, answer_timeout_s: float = 3.0,
               admin_secret: str | None = None, admin_share: float = 0.2) -> FuzzStats:
    """Sends at least ``frames`` frames to host:port over ``concurrency`` connections at once.

    With ``admin_secret`` (the node's raft.secret) a share of the connections first logs in
    as the cluster's operator, so the broker-to-broker APIs reach their handlers too instead
    of the ClusterAction refusal. A connection that gets no answer for ``answer_timeout_s``
    (a long poll whose wait a mutation stretched) is counted and closed.
    """
    source = FrameSource(seed)
    stats = FuzzStats()
    started = time.monotonic()
    slots = trio.Semaphore(concurrency)
    while stats.frames_sent < frames:  # again for frames a connection closed before sending
        async with trio.open_nursery() as nursery:
            planned = stats.frames_sent
            while planned < frames:
                plan = source.connection(min(frames_per_connection, frames - planned))
                planned += len(plan.frames)
                login = admin_secret if source.rng.random() < admin_share else None
                await slots.acquire()
                nursery.start_soon(_run_connection, host, port, plan, stats, slots,
                                   answer_timeout_s, login)
    stats.seconds = time.monotonic() - started
    return stats


async def _run_connection(host: str, port: int, plan: Planned, stats: FuzzStats,
                          slots: trio.Semaphore, answer_timeout_s: float,
                          admin_secret: str | None) -> None:
    received: list[int] = []
    try:
        with trio.fail_after(30):
            stream = await trio.open_tcp_stream(host, port)
        async with stream:
            stats.connections += 1
            local = "{}:{}".format(*stream.socket.getsockname()[:2])  # as the node logs it
            reader = _FrameReader(stream)
            if admin_secret is not None:
                with trio.fail_after(30):
                    await _login(stream, reader, admin_secret)
            # Answers are read while the frames go out: the node stops reading a connection
            # with 64 requests in flight, and it cannot send answers nobody reads.
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_send_plan, stream, plan, stats)
                quiet = await _read_answers(reader, received, answer_timeout_s)
                nursery.cancel_scope.cancel()  # a sender the node stopped reading from
    finally:
        slots.release()
    stats.refusals += plan.ends_with_refusal
    stats.frames_answered += len(received)
    if received != plan.answers[:len(received)]:
        stats.out_of_order.append(f"expected {plan.answers}, got {received}")
    elif len(received) < len(plan.answers):
        pending = plan.answers[len(received)]
        what = (f"{local}: {len(received)} of {len(plan.answers)} answered, then "
                f"{_describe(plan, pending)}")
        if quiet:
            stats.timeouts.append(f"{what} still unanswered after {answer_timeout_s:g} s")
        elif reader.reset:
            stats.lost_to_reset.append(f"{what}: connection reset")
        else:
            stats.closed_early.append(f"{what} closed the connection")


async def _send_plan(stream: trio.SocketStream, plan: Planned, stats: FuzzStats) -> None:
    """Sends the frames a few at a time, counting those sent (all of a frame's bytes)."""
    try:
        for start in range(0, len(plan.frames), _FRAMES_PER_SEND):
            chunk = plan.frames[start:start + _FRAMES_PER_SEND]
            await stream.send_all(b"".join(chunk))
            stats.frames_sent += len(chunk)
        await stream.send_eof()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the node hung up early; what it answered is checked by the caller


async def _read_answers(reader: _FrameReader, received: list[int], quiet_s: float) -> bool:
    """Appends correlation ids until the node closes (False) or is quiet for quiet_s (True)."""
    while True:
        frame = None
        with trio.move_on_after(quiet_s):
            frame = await reader.next()
            if frame is None:
                return False
        if frame is None:
            return True
        received.append(_CORRELATION.unpack_from(frame, 0)[0])


def _describe(plan: Planned, correlation_id: int) -> str:
    """"frame 7 (JoinGroup v3 {...})": the request of a connection the node did not answer."""
    payload = memoryview(plan.frames[correlation_id])[4:]
    key, version, _ = codec.peek_request_header(payload)
    api = APIS_BY_KEY[key]
    _, pos = codec.decode_request_header(payload, api.is_flexible(version))
    body = codec.decode(api, version, payload[pos:], is_request=True, allow_trailing=True)
    return f"frame {correlation_id} ({api.name} v{version} {body!r:.300})"


class _FrameReader:
    """Response frames (without their size prefix) until the node closes."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = bytearray()
        self.reset = False  # the node reset the connection (RST) rather than closing it

    async def next(self) -> bytes | None:
        while True:
            if len(self.buffer) >= 4:
                (size,) = _SIZE.unpack_from(self.buffer, 0)
                if len(self.buffer) >= 4 + size:
                    frame = bytes(self.buffer[4:4 + size])
                    del self.buffer[:4 + size]
                    return frame
            try:
                chunk = await self.stream.receive_some(1 << 16)
            except trio.BrokenResourceError:
                self.reset = True
                return None
            if not chunk:
                return None
            self.buffer += chunk


async def _login(stream: trio.SocketStream, reader: _FrameReader, secret: str) -> None:
    """SaslHandshake and SCRAM's two SaslAuthenticate round trips, as the operator."""
    async def call(api: Api, version: int, body: dict[str, Any]) -> codec.Struct:
        payload = request_payload(api, version, body, -1, "fuzz-admin")
        await stream.send_all(_SIZE.pack(len(payload)) + payload)
        frame = await reader.next()
        if frame is None:
            raise RuntimeError(f"the node closed the connection during {api.name}")
        _, pos = codec.decode_response_header(memoryview(frame), api.is_flexible(version))
        answer = codec.decode(api, version, frame[pos:], is_request=False)
        if answer.error_code:
            raise RuntimeError(f"{api.name} of the operator's login failed: {answer}")
        return answer

    handshake, authenticate = APIS_BY_KEY[17], APIS_BY_KEY[36]
    await call(handshake, 1, {"mechanism": CLUSTER_MECHANISM})
    scram = ClusterCredentials(secret).client(ADMIN_USER)
    first = await call(authenticate, 1, {"auth_bytes": scram.first()})
    final = await call(authenticate, 1, {"auth_bytes": scram.final(bytes(first.auth_bytes))})
    scram.verify(bytes(final.auth_bytes))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--frames", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=48)
    parser.add_argument("--secret", help="the node's raft.secret: some connections log in as"
                                         " the cluster's operator")
    args = parser.parse_args(argv)
    host, _, port = args.bootstrap.rpartition(":")
    stats = trio.run(lambda: fuzz(host, int(port), frames=args.frames, seed=args.seed,
                                  concurrency=args.concurrency, admin_secret=args.secret))
    print(stats.summary())
    for problem in stats.out_of_order + stats.closed_early[:20] + stats.timeouts[:20]:
        print("  ", problem)
    return 1 if stats.out_of_order else 0


if __name__ == "__main__":
    sys.exit(main())
