"""Every response the broker can build encodes, for every version of every API.

Two properties:

* Schema round trip: for each API and version in ``schemas.py``, ``schemas_group.py`` and
  ``schemas_txn.py`` (and whatever else the listener registers), any response body the schema
  allows encodes and decodes back to itself.
* Handlers: request bodies drawn from each request schema (every version, nulls wherever the
  version allows them, boundary integers, names from small pools) go to a real node running
  in this process, over TCP, through its real listener. Each must be answered with a response
  that decodes at the request's version; a connection closed by a handler bug (the listener
  logs "after an internal error", e.g. an EncodeError for a request value echoed into a
  response field that cannot hold it) fails with the node's traceback.

The protocol fuzz test with byte-level mutations is ``tests/integration/test_fuzz.py``.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import struct
import threading
import uuid
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftlog.config import ServerConfig
from raftlog.node import Node
from raftlog.protocol import codec
from raftlog.protocol.codec import Api, EncodeError, Field, Struct
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import API_VERSIONS, CREATE_TOPICS, METADATA, PRODUCE
from raftlog.protocol.schemas_group import DESCRIBE_GROUPS, JOIN_GROUP
from raftlog.protocol.schemas_security import SASL_AUTHENTICATE, SASL_HANDSHAKE
from raftlog.security.session import ADMIN_USER, CLUSTER_MECHANISM, ClusterCredentials
from tests.fuzz_frames import (
    CLIENT_IDS,
    EVERY_API,
    FUZZ_TOPICS,
    LONGEST,
    NODE_PROPERTIES,
    fit,
    int_choices,
    records_value,
    request_payload,
    string_choices,
)

_SIZE = struct.Struct(">i")
_INT_RANGES = {"int8": (-(2**7), 2**7 - 1), "int16": (-(2**15), 2**15 - 1),
               "int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1),
               "uint16": (0, 2**16 - 1), "uint32": (0, 2**32 - 1)}
ANSWER_TIMEOUT_S = 30.0
SENTINEL_ID = 2**31 - 1  # the ApiVersions request sent after each request
SECRET = "codec-responses-secret"  # raft.secret: the admin client logs in with it

VERSIONS = [pytest.param(api, version, id=f"{api.name}-v{version}")
            for api in EVERY_API for version in range(api.min_version, api.max_version + 1)]


# ---------------------------------------------------------------------------------------------
# Strategies from the schemas


def _struct_of(fields: list[Field] | tuple[Field, ...], version: int, *, request: bool
               ) -> st.SearchStrategy[dict[str, Any]]:
    present = [f for f in fields if version in f.version_range]
    return st.fixed_dictionaries({f.name: _value_of(f, version, request=request)
                                  for f in present})


def _value_of(f: Field, version: int, *, request: bool) -> st.SearchStrategy[Any]:
    base: st.SearchStrategy[Any]
    if isinstance(f.type, list):
        base = st.lists(_struct_of(f.type, version, request=request), max_size=3)
    elif isinstance(f.type, tuple):
        base = _struct_of(f.type, version, request=request)
    elif f.type.startswith("[]"):
        item = _primitive_of(f.name, f.type[2:], request=request)
        base = st.lists(item, max_size=3)
    else:
        base = _primitive_of(f.name, f.type, request=request)
    return st.one_of(st.none(), base) if f.is_nullable(version) else base


def _primitive_of(name: str, type_name: str, *, request: bool) -> st.SearchStrategy[Any]:
    if type_name in _INT_RANGES:
        low, high = _INT_RANGES[type_name]
        chosen = st.sampled_from(int_choices(name)).map(lambda v: fit(v, type_name))
        # Requests keep to the pools (a random timeout would long-poll for weeks).
        return chosen if request else st.one_of(chosen, st.integers(low, high))
    if type_name == "bool":
        return st.booleans()
    if type_name == "float64":
        return st.floats(allow_nan=False)
    if type_name == "uuid":
        return st.one_of(st.just(uuid.UUID(int=0)), st.uuids())
    if type_name == "string":
        pool = st.sampled_from((*string_choices(name), LONGEST))
        return pool if request else st.one_of(pool, st.text(max_size=20))
    if type_name == "records":
        return st.randoms(use_true_random=False).map(
            lambda rng: records_value(random.Random(rng.random())))
    return st.binary(max_size=40)


# ---------------------------------------------------------------------------------------------
# Schema round trip


def _plain(value: Any) -> Any:
    """Decoded values as plain data: structs to dicts, memoryviews to bytes, tuples to lists."""
    if isinstance(value, Struct):
        return {key: _plain(item) for key, item in value.to_dict().items()}
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, memoryview | bytearray):
        return bytes(value)
    return value


def _only_sent(decoded: Any, sent: Any) -> Any:
    """``decoded`` cut down to the fields ``sent`` had (decoding adds other versions' fields
    at their defaults)."""
    if isinstance(sent, dict):
        return {key: _only_sent(decoded[key], item) for key, item in sent.items()}
    if isinstance(sent, list) and isinstance(decoded, list):
        return [_only_sent(d, s) for d, s in zip(decoded, sent, strict=True)]
    return decoded


@pytest.mark.parametrize(("api", "version"), VERSIONS)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_every_response_schema_round_trips(api: Api, version: int, data: st.DataObject) -> None:
    body = data.draw(_struct_of(api.response, version, request=False), label="response")
    raw = codec.encode_bytes(api, version, body)
    decoded = codec.decode(api, version, raw, is_request=False)
    assert _only_sent(_plain(decoded), _plain(body)) == _plain(body)


# ---------------------------------------------------------------------------------------------
# A real node in this process, and a plain blocking client


def _free_port() -> int:
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class InternalErrors(logging.Handler):
    """Collects the listener's "after an internal error" records (handler bugs)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "internal error" in record.getMessage():
            self.records.append(record)

    def report(self) -> str:
        formatter = logging.Formatter()
        return "\n".join(formatter.format(record) for record in self.records)


class InProcessNode:
    """A combined broker+controller node on a trio loop in a thread of this process."""

    def __init__(self, data_dir: Path) -> None:
        port, controller_port = _free_port(), _free_port()
        self.config = ServerConfig.from_properties({
            "node.id": "1",
            "process.roles": "broker,controller",
            "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
            "controller.listener.names": "CONTROLLER",
            "log.dirs": str(data_dir),
            "raft.secret": SECRET,
            "auto.create.topics.enable": "false",  # names come from small pools anyway
            **NODE_PROPERTIES,
        })
        self.port = port
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="in-process-node", daemon=True)

    def __enter__(self) -> InProcessNode:
        self._thread.start()
        if not self._ready.wait(60) or self._failure is not None:
            raise RuntimeError(f"the node did not start: {self._failure!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._token is not None and self._stop is not None
        trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(30)

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:  # reported by __enter__ or the test's next request
            self._failure = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._stop = trio.Event()
        self._token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            await nursery.start(Node(self.config).run)
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()


class BlockingClient:
    """One connection; each request is followed by an ApiVersions v0 request, so a request
    that gets no answer by design (acks=0 produce) still has an end. ``admin`` logs in as the
    cluster's operator (SCRAM keyed by raft.secret), whom the broker-to-broker APIs serve."""

    def __init__(self, port: int, *, admin: bool = False) -> None:
        self.port = port
        self.admin = admin
        self.sock: socket.socket | None = None

    def exchange(self, payload: bytes) -> tuple[bytes | None, bool]:
        """(the response frame to ``payload`` or None, whether the connection stayed open)."""
        if self.sock is None:
            self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            self.sock.settimeout(ANSWER_TIMEOUT_S)
            if self.admin:
                self._login()
        sentinel = request_payload(API_VERSIONS, 0, {}, SENTINEL_ID, "sentinel")
        self.sock.sendall(_SIZE.pack(len(payload)) + payload
                          + _SIZE.pack(len(sentinel)) + sentinel)
        answer = None
        while True:
            frame = self._read_frame()
            if frame is None:
                self.close()
                return answer, False
            if struct.unpack_from(">i", frame, 0)[0] == SENTINEL_ID:
                return answer, True
            answer = frame

    def _login(self) -> None:
        shake = self._call(SASL_HANDSHAKE, 1, {"mechanism": CLUSTER_MECHANISM})
        assert shake.error_code == 0, shake
        scram = ClusterCredentials(SECRET).client(ADMIN_USER)
        first = self._call(SASL_AUTHENTICATE, 1, {"auth_bytes": scram.first()})
        final = self._call(SASL_AUTHENTICATE, 1, {"auth_bytes": scram.final(
            bytes(first.auth_bytes))})
        assert final.error_code == 0, final
        scram.verify(bytes(final.auth_bytes))

    def _call(self, api: Api, version: int, body: dict[str, Any]) -> Struct:
        assert self.sock is not None
        payload = request_payload(api, version, body, 1, "login")
        self.sock.sendall(_SIZE.pack(len(payload)) + payload)
        frame = self._read_frame()
        assert frame is not None, f"closed during the {api.name} of the login"
        return _decode(api, version, frame)

    def _read_frame(self) -> bytes | None:
        prefix = self._read_exactly(4)
        if prefix is None:
            return None
        return self._read_exactly(_SIZE.unpack(prefix)[0])

    def _read_exactly(self, size: int) -> bytes | None:
        assert self.sock is not None
        data = bytearray()
        while len(data) < size:
            try:
                chunk = self.sock.recv(size - len(data))
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return None
            data += chunk
        return bytes(data)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


@dataclass
class Clients:
    anonymous: BlockingClient
    admin: BlockingClient
    errors: InternalErrors


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clients]:
    errors = InternalErrors()
    listener_log = logging.getLogger("raftlog.server.listener")
    listener_log.addHandler(errors)
    try:
        with InProcessNode(tmp_path_factory.mktemp("codec-responses")) as running:
            clients = Clients(BlockingClient(running.port),
                              BlockingClient(running.port, admin=True), errors)
            _create_fuzz_topics(clients.anonymous)
            yield clients
            clients.anonymous.close()
            clients.admin.close()
    finally:
        listener_log.removeHandler(errors)


def _create_fuzz_topics(client: BlockingClient) -> None:
    body = {"topics": [{"name": name, "num_partitions": 2, "replication_factor": 1}
                       for name in FUZZ_TOPICS], "timeout_ms": 10_000}
    frame, _ = client.exchange(request_payload(CREATE_TOPICS, 4, body, 1, "setup"))
    assert frame is not None
    created = _decode(CREATE_TOPICS, 4, frame)
    assert [t.error_code for t in created.topics] == [0, 0], created


def _decode(api: Api, version: int, frame: bytes) -> Struct:
    view = memoryview(frame)
    flexible_header = api.is_flexible(version) and api is not API_VERSIONS
    _, pos = codec.decode_response_header(view, flexible_header)
    return codec.decode(api, version, view[pos:], is_request=False)


def _answer(node: Clients, api: Api, version: int, body: dict[str, Any], *,
            admin: bool = False, client_id: str | None = "codec-test") -> Struct | None:
    """The node's decoded answer to one request; fails on a handler bug."""
    client, errors = (node.admin if admin else node.anonymous), node.errors
    before = len(errors.records)
    frame, still_open = client.exchange(request_payload(api, version, body, 7, client_id))
    assert len(errors.records) == before, (
        f"{api.name} v{version} {body!r:.2000} (client id {client_id!r:.40}) hit a handler"
        " bug:\n" + errors.report())
    if frame is None:
        # No answer: only an acks=0 produce (whose failure closes, Kafka's way) may do that.
        assert api is PRODUCE and body["acks"] == 0, (
            f"{api.name} v{version} got no answer (connection open: {still_open})")
        return None
    return _decode(api, version, frame)


# ---------------------------------------------------------------------------------------------
# Handler-built responses


@pytest.mark.parametrize(("api", "version"), VERSIONS)
@settings(max_examples=int(os.environ.get("HX", "12")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_every_handler_response_encodes(
    node: Clients, api: Api, version: int, data: st.DataObject
) -> None:
    body = data.draw(_struct_of(api.request, version, request=True), label="request")
    # Anonymous clients meet the ClusterAction refusals; the operator reaches the handlers of
    # the broker-to-broker APIs (and replica fetches) themselves.
    admin = data.draw(st.booleans(), label="as the cluster's admin")
    client_id = data.draw(st.sampled_from((*CLIENT_IDS, LONGEST)), label="client id")
    _answer(node, api, version, body, admin=admin, client_id=client_id)


@pytest.mark.parametrize("version", [10, 11])
def test_metadata_null_topic_name_before_v12_is_an_invalid_request(
    node: Clients, version: int
) -> None:
    """v10-11 carry a topic id field but do not serve lookups by id (Kafka refuses them with
    INVALID_REQUEST): the null name used to be echoed into the response's non-nullable name,
    and the encoder's assertion closed the connection instead."""
    topic_id = uuid.uuid4()
    answer = _answer(node, METADATA, version, {"topics": [
        {"topic_id": topic_id, "name": None}, {"topic_id": uuid.UUID(int=0), "name": "fuzz"}]})
    assert answer is not None
    assert [(t.name, t.error_code) for t in answer.topics] == [
        ("", ErrorCode.INVALID_REQUEST), ("fuzz", ErrorCode.INVALID_REQUEST)]


def test_error_message_quoting_a_longest_string_is_shortened_to_fit(node: Clients) -> None:
    """A config name of 32767 bytes is legal on the wire; the message that quotes it did not
    fit a non-compact string, so encoding failed and the connection closed instead."""
    body = {"topics": [{"name": "quoted", "num_partitions": 1, "replication_factor": 1,
                        "configs": [{"name": LONGEST, "value": "1"}]}], "timeout_ms": 10_000}
    answer = _answer(node, CREATE_TOPICS, 1, body)
    assert answer is not None
    result = answer.topics[0]
    assert result.error_code == ErrorCode.INVALID_CONFIG
    assert len(result.error_message.encode()) == 0x7FFF
    assert result.error_message.endswith("L...")


def test_member_id_from_a_longest_client_id_fits(node: Clients) -> None:
    """The member id starts with the client id: from a 32767-byte client id it did not fit
    JoinGroup v5's response (nor DescribeGroups'), which closed the connection instead."""
    join = {"group_id": "long-client", "session_timeout_ms": 500, "rebalance_timeout_ms": 100,
            "member_id": "", "group_instance_id": None, "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b""}]}
    answer = _answer(node, JOIN_GROUP, 5, join, client_id=LONGEST)
    assert answer is not None
    assert answer.error_code == ErrorCode.MEMBER_ID_REQUIRED
    assert answer.member_id.startswith("LLL") and len(answer.member_id) < 2000
    joined = _answer(node, JOIN_GROUP, 5, {**join, "member_id": answer.member_id},
                     client_id=LONGEST)
    assert joined is not None and joined.error_code == 0, joined
    described = _answer(node, DESCRIBE_GROUPS, 4, {"groups": ["long-client"]})
    assert described is not None
    assert [m.client_id for m in described.groups[0].members] == [LONGEST]


# ---------------------------------------------------------------------------------------------
# The encoder's own errors


def test_a_value_that_does_not_fit_names_its_field() -> None:
    with pytest.raises(EncodeError, match=r"^Metadata v11 response topics\[1\]\.name: None in "
                                          r"a non-nullable string$"):
        codec.encode(METADATA, 11, {"topics": [{"name": "a"}, {"name": None}]})
    with pytest.raises(EncodeError, match=r"topics\[0\]\.partitions\[0\]\.leader_id: .*"
                                          r"2147483648"):
        codec.encode(METADATA, 11, {"topics": [{"name": "a", "partitions": [
            {"partition_index": 0, "leader_id": 2**31}]}]})
    with pytest.raises(EncodeError, match=r"response topics\[0\]\.name: a string of 32768 "):
        codec.encode(CREATE_TOPICS, 4, {"topics": [{"name": "n" * 0x8000}]})


@pytest.mark.parametrize("version", [1, 4])
def test_only_error_messages_are_shortened(version: int) -> None:
    message = "\u00e9" * 20_000  # 40,000 bytes of UTF-8: a cut must not split a character
    raw = codec.encode_bytes(CREATE_TOPICS, version, {"topics": [
        {"name": "t", "error_code": 1, "error_message": message}]})
    decoded = codec.decode(CREATE_TOPICS, version, raw, is_request=False).topics[0]
    assert len(decoded.error_message.encode()) <= 0x7FFF
    assert decoded.error_message.endswith("\u00e9...")
