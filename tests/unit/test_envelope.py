"""KIP-590 forwarding: Envelope wrap/unwrap, and "an Envelope is never forwarded again"."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from raftlog.broker.apis import KafkaApis
from raftlog.broker.controller_apis import ControllerApis
from raftlog.broker.lifecycle import call_in_process
from raftlog.config import ServerConfig
from raftlog.controller.service import ControllerService, settings_from_config
from raftlog.metadata.state import MetadataStateMachine
from raftlog.partition.manager import PartitionManager
from raftlog.protocol import codec, envelope
from raftlog.protocol.codec import Api, Struct
from raftlog.protocol.envelope import EnvelopeError
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import ENVELOPE, INCREMENTAL_ALTER_CONFIGS, METADATA
from raftlog.quorum.local import LocalNode, LocalQuorum
from raftlog.server.listener import RequestContext
from tests.unit.test_controller_service import SwitchableQuorum, free_port, server_config

VERSION = 1
BYTES_MAX = 1 << 20
TOPIC_RESOURCE = 2


def _alter_body(names: tuple[str, ...] = ("t",)) -> dict[str, Any]:
    return {"resources": [{"resource_type": TOPIC_RESOURCE, "resource_name": name, "configs": [
        {"name": "retention.ms", "config_operation": 0, "value": "1000"}]} for name in names],
        "validate_only": False}


def _as_received(api: Api, version: int, body: Mapping[str, Any], *, is_request: bool) -> Struct:
    """``body`` as a peer decodes it off the wire."""
    raw = codec.encode_bytes(api, version, body, is_request=is_request)
    return codec.decode(api, version, raw, is_request=is_request)


def _wrapped(api: Api = INCREMENTAL_ALTER_CONFIGS, body: Mapping[str, Any] | None = None,
             **overrides: Any) -> Struct:
    args: dict[str, Any] = {"correlation_id": 7, "client_id": "raftlog-broker-1",
                            "client_host": bytes([10, 0, 0, 9]), "request_bytes_max": BYTES_MAX}
    args.update(overrides)
    wrapped = envelope.wrap_request(api, VERSION, _alter_body() if body is None else body, **args)
    return _as_received(ENVELOPE, 0, wrapped, is_request=True)


# -- wrap / open / seal / unwrap ----------------------------------------------------------------


def test_a_request_and_its_response_survive_the_envelope() -> None:
    inner = envelope.open_request(_wrapped(), request_bytes_max=BYTES_MAX)
    assert inner.api is INCREMENTAL_ALTER_CONFIGS
    assert (inner.header.api_version, inner.header.correlation_id, inner.header.client_id) == (
        VERSION, 7, "raftlog-broker-1")
    assert inner.client_host == "10.0.0.9"
    assert inner.body.to_dict() == _as_received(
        INCREMENTAL_ALTER_CONFIGS, VERSION, _alter_body(), is_request=True).to_dict()

    answer = {"throttle_time_ms": 0, "responses": [
        {"error_code": 0, "error_message": None, "resource_type": TOPIC_RESOURCE,
         "resource_name": "t"}]}
    sealed = _as_received(ENVELOPE, 0, envelope.seal_response(inner, answer), is_request=False)
    unwrapped = envelope.unwrap_response(INCREMENTAL_ALTER_CONFIGS, VERSION, 7, sealed)
    assert unwrapped.to_dict() == answer
    with pytest.raises(EnvelopeError):  # an answer to another request
        envelope.unwrap_response(INCREMENTAL_ALTER_CONFIGS, VERSION, 8, sealed)


def test_a_refused_envelope_unwraps_to_its_error_code() -> None:
    refused = _as_received(ENVELOPE, 0, envelope.refusal(ErrorCode.NOT_CONTROLLER),
                           is_request=False)
    with pytest.raises(EnvelopeError) as raised:
        envelope.unwrap_response(INCREMENTAL_ALTER_CONFIGS, VERSION, 7, refused)
    assert raised.value.error_code == ErrorCode.NOT_CONTROLLER


@pytest.mark.parametrize("api,body", [
    (METADATA, {"topics": None, "allow_auto_topic_creation": False}),
    # An envelope is never nested (so never forwarded twice).
    (ENVELOPE, {"request_data": b"x", "request_principal": None,
                "client_host_address": bytes(4)}),
])
def test_only_forwardable_apis_are_opened(api: Api, body: dict[str, Any]) -> None:
    version = 0 if api is ENVELOPE else VERSION
    header = codec.RequestHeader(api.key, version, 1, "c")
    data = codec.encode_request_header(header, api.is_flexible(version)) + codec.encode_bytes(
        api, version, body, is_request=True)
    wrapped = _as_received(ENVELOPE, 0, {"request_data": data, "request_principal": None,
                                         "client_host_address": bytes(4)}, is_request=True)
    with pytest.raises(EnvelopeError) as raised:
        envelope.open_request(wrapped, request_bytes_max=BYTES_MAX)
    assert raised.value.error_code == ErrorCode.INVALID_REQUEST
    assert "not eligible for forwarding" in str(raised.value)


def test_the_inner_request_size_is_bounded_on_both_sides() -> None:
    big = _alter_body(tuple(f"topic-{i}" for i in range(50)))
    size = len(_wrapped(body=big).request_data)
    with pytest.raises(EnvelopeError) as raised:
        _wrapped(body=big, request_bytes_max=size - 1)
    assert raised.value.error_code == ErrorCode.INVALID_REQUEST
    with pytest.raises(EnvelopeError) as raised:
        envelope.open_request(_wrapped(body=big), request_bytes_max=size - 1)
    assert raised.value.error_code == ErrorCode.INVALID_REQUEST
    assert envelope.open_request(_wrapped(body=big), request_bytes_max=size).api.key == \
        INCREMENTAL_ALTER_CONFIGS.key


def test_malformed_inner_requests_and_addresses_are_invalid_requests() -> None:
    for wrapped in (_wrapped(client_host=b"\x01\x02\x03"),
                    _as_received(ENVELOPE, 0, {"request_data": b"\x00\x2c",
                                               "request_principal": None,
                                               "client_host_address": bytes(4)},
                                 is_request=True)):
        with pytest.raises(EnvelopeError) as raised:
            envelope.open_request(wrapped, request_bytes_max=BYTES_MAX)
        assert raised.value.error_code == ErrorCode.INVALID_REQUEST


def test_client_address_of_peer_names() -> None:
    assert envelope.client_address("127.0.0.1:9092") == bytes([127, 0, 0, 1])
    assert envelope.client_address("::1:9092") == bytes(15) + b"\x01"
    assert envelope.client_address("in-process") == envelope.UNKNOWN_CLIENT_ADDRESS


# -- the handlers: forwarding side and controller side -----------------------------------------


@dataclass
class Forwarder:
    """``ControllerChannel.call`` delivering in-process to ``target`` (the controller)."""

    target: ControllerApis | None = None
    calls: list[tuple[Api, dict[str, Any]]] = field(default_factory=list)

    async def __call__(self, api: Api, body: Mapping[str, Any], *, version: int,
                       timeout_s: float, is_not_controller: Callable[[Struct], bool]) -> Struct:
        self.calls.append((api, dict(body)))
        assert self.target is not None, "forwarded although it must not be"
        response = await call_in_process(self.target.handlers()[api.key], api, version, body)
        assert not is_not_controller(response)
        return response


@dataclass
class Nodes:
    follower: ControllerApis  # not the controller: forwards
    controller: ControllerApis
    forwarder: Forwarder


@pytest.fixture
async def nodes(tmp_path: Path) -> AsyncIterator[Nodes]:
    port = free_port()
    config: ServerConfig = server_config(tmp_path, 1, port, free_port())
    async with LocalQuorum(tmp_path / "meta", MetadataStateMachine(),
                           node=LocalNode(1, "127.0.0.1", port)) as local:
        follower_view, controller_view = SwitchableQuorum(local), SwitchableQuorum(local)
        follower_view.ready = False
        manager = PartitionManager(tmp_path / "data", 1)
        forwarder = Forwarder()
        apis = []
        for view, forward in ((follower_view, forwarder), (controller_view, None)):
            kafka_apis = KafkaApis(config, view, manager)
            service = ControllerService(view, settings_from_config(config))
            apis.append(ControllerApis(config, view, service, kafka_apis,
                                       forward=forward))
        forwarder.target = apis[1]
        yield Nodes(apis[0], apis[1], forwarder)
        manager.close()


async def _run(handler: Callable[[RequestContext], Any], api: Api, version: int,
               body: Mapping[str, Any], client_id: str) -> Struct:
    request = _as_received(api, version, body, is_request=True)
    header = codec.RequestHeader(api.key, version, 11, client_id)
    result = handler(RequestContext(api, header, request, "127.0.0.1:40000"))
    if not isinstance(result, dict):
        result = await result()
    assert result is not None
    return _as_received(api, version, result, is_request=False)


async def test_a_broker_like_client_id_is_forwarded_in_an_envelope(nodes: Nodes) -> None:
    """The client id means nothing: only an Envelope counts as forwarded. The controller
    answers the inner request with the same handler (a duplicate resource: INVALID_REQUEST)."""
    body = _alter_body(("t", "t"))
    response = await _run(nodes.follower.incremental_alter_configs, INCREMENTAL_ALTER_CONFIGS,
                          VERSION, body, "raftlog-broker-1")
    assert [api for api, _ in nodes.forwarder.calls] == [ENVELOPE]
    assert [r.error_code for r in response.responses] == [ErrorCode.INVALID_REQUEST] * 2
    inner = envelope.open_request(_as_received(ENVELOPE, 0, nodes.forwarder.calls[0][1],
                                               is_request=True), request_bytes_max=BYTES_MAX)
    assert (inner.header.client_id, inner.header.correlation_id) == ("raftlog-broker-1", 11)


async def test_an_envelope_is_never_forwarded_again(nodes: Nodes) -> None:
    nodes.forwarder.target = None  # any forward fails the test
    wrapped = _wrapped().to_dict()
    response = await _run(nodes.follower.envelope, ENVELOPE, 0, wrapped, "raftlog-broker-2")
    assert response.error_code == ErrorCode.NOT_CONTROLLER
    assert response.response_data is None
    # Nor is the inner request, should the node lose the controllership after opening it.
    forwarded = nodes.follower._forwarded_handlers()[INCREMENTAL_ALTER_CONFIGS.key]
    inner = await _run(forwarded, INCREMENTAL_ALTER_CONFIGS, VERSION, _alter_body(), "x")
    assert [r.error_code for r in inner.responses] == [ErrorCode.NOT_CONTROLLER]
    assert nodes.forwarder.calls == []


async def test_the_controller_refuses_an_envelope_it_cannot_open(nodes: Nodes) -> None:
    nested = _as_received(ENVELOPE, 0, {
        "request_data": codec.encode_request_header(codec.RequestHeader(ENVELOPE.key, 0, 1, "c"),
                                                    True) + b"\x00",
        "request_principal": None, "client_host_address": bytes(4)}, is_request=True)
    response = await _run(nodes.controller.envelope, ENVELOPE, 0, nested.to_dict(), "c")
    assert (response.error_code, response.response_data) == (ErrorCode.INVALID_REQUEST, None)
