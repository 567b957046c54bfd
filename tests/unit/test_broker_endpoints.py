"""Every listener registered per broker: RegisterBroker version 1 carries the endpoints (a
version-0 record and a format-2 image still decode, as brokers without endpoints), the state
machine checks them, and Metadata/FindCoordinator answers are rewritten per listener (a broker
lacking the listener is left out, as Kafka does)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from raftlog.metadata import _codec
from raftlog.metadata.image import (
    BrokerEndpoint,
    BrokerImage,
    MetadataImage,
    frozen_mapping,
    image_from_bytes,
)
from raftlog.metadata.records import RegisterBroker, decode_record, encode_record
from raftlog.metadata.testing import MachineDriver
from raftlog.protocol.errors import ErrorCode
from raftlog.server.advertise import listener_addresses, rewrite_coordinator, rewrite_metadata

ENDPOINTS = (BrokerEndpoint("EXTERNAL", "ext.example", 9094, "SASL_SSL"),
             BrokerEndpoint("INTERNAL", "10.0.0.1", 9092, "SSL"))


def test_register_broker_v1_round_trips_and_v0_reads_without_endpoints() -> None:
    record = RegisterBroker(1, "10.0.0.1", 9092, None, "inc", ENDPOINTS)
    assert decode_record(encode_record(record)) == record
    v0 = _codec.dumps({"t": 1, "v": 0, "node_id": 1, "host": "h", "port": 1, "rack": None,
                       "incarnation_id": "i"})
    assert decode_record(v0) == RegisterBroker(1, "h", 1, None, "i", ())


def test_format_2_image_reads_brokers_without_endpoints() -> None:
    broker = BrokerImage(1, "h", 9092, None, "i", False, 0, 0)
    plain = _codec.to_plain(MetadataImage(version=0, brokers=frozen_mapping({1: broker})))
    assert isinstance(plain, dict)
    plain["brokers"] = {1: {k: v for k, v in plain["brokers"][1].items() if k != "endpoints"}}
    old = _codec.dumps({"kind": "raftlog.metadata.image", "format": 2, "image": plain})
    image = image_from_bytes(old)
    assert image.brokers[1].endpoints == ()
    assert image.brokers[1].endpoint("ANYTHING") == ("h", 9092)


def test_state_machine_keeps_and_checks_endpoints() -> None:
    driver = MachineDriver()
    assert driver.apply(RegisterBroker(1, "10.0.0.1", 9092, None, "inc", ENDPOINTS)).ok
    broker = driver.machine.image.brokers[1]
    assert broker.endpoint("external") == ("ext.example", 9094)
    assert broker.endpoint("OTHER") is None
    # The same incarnation again with other endpoints updates them (not the epoch); with the
    # same, a no-op; another inter-broker address is refused.
    again = driver.apply(RegisterBroker(1, "10.0.0.1", 9092, None, "inc", ENDPOINTS[:1]))
    assert again.ok and again.value == broker.epoch
    assert driver.machine.image.brokers[1].endpoint("INTERNAL") is None
    assert driver.apply(RegisterBroker(1, "10.0.0.1", 9092, None, "inc", ENDPOINTS[:1])).ok
    assert not driver.apply(RegisterBroker(1, "10.0.0.9", 9092, None, "inc", ENDPOINTS)).ok
    for bad in (
        (ENDPOINTS[0], ENDPOINTS[0]),
        (dataclasses.replace(ENDPOINTS[0], port=0),),
        (dataclasses.replace(ENDPOINTS[0], security_protocol="TLS"),),
        (dataclasses.replace(ENDPOINTS[0], name="lower"),),
        (dataclasses.replace(ENDPOINTS[0], host=""),),
    ):
        assert not driver.apply(RegisterBroker(2, "h", 1, None, "i2", bad)).ok


def _image() -> MetadataImage:
    brokers = {
        1: BrokerImage(1, "10.0.0.1", 9092, None, "a", False, 0, 0, ENDPOINTS),
        2: BrokerImage(2, "10.0.0.2", 9092, None, "b", False, 1, 1, (
            BrokerEndpoint("INTERNAL", "10.0.0.2", 9092, "SSL"),)),
        3: BrokerImage(3, "10.0.0.3", 9092, None, "c", False, 2, 2),  # registered before v1
    }
    return MetadataImage(version=2, brokers=frozen_mapping(brokers))


def _metadata() -> dict[str, Any]:
    return {"brokers": [{"node_id": n, "host": f"10.0.0.{n}", "port": 9092, "rack": None}
                        for n in (1, 2, 3)],
            "topics": [{"name": "t", "error_code": 0, "partitions": [
                {"partition_index": 0, "error_code": 0, "leader_id": 2},
                {"partition_index": 1, "error_code": 0, "leader_id": 1}]}]}


@pytest.mark.parametrize(("own", "node_id"), [(("me.example", 19094), 1), (None, 9)])
def test_metadata_gives_each_broker_its_endpoint_on_the_listener(
        own: tuple[str, int] | None, node_id: int) -> None:
    image = _image()
    address_of = listener_addresses("EXTERNAL", node_id, lambda: image,
                                    lambda: own or ("unused", 1))
    body = _metadata()
    rewrite_metadata(body, address_of)
    by_id = {b["node_id"]: (b["host"], b["port"]) for b in body["brokers"]}
    # Node 2 lacks EXTERNAL: left out, and its partition has no leader on this listener.
    assert by_id == {1: own or ("ext.example", 9094), 3: ("10.0.0.3", 9092)}
    partitions = body["topics"][0]["partitions"]
    assert (partitions[0]["error_code"], partitions[0]["leader_id"]) == (
        ErrorCode.LEADER_NOT_AVAILABLE, -1)
    assert (partitions[1]["error_code"], partitions[1]["leader_id"]) == (0, 1)


def test_coordinator_lacking_the_listener_is_not_available() -> None:
    image = _image()
    address_of = listener_addresses("EXTERNAL", 9, lambda: image, lambda: ("x", 1))
    body: dict[str, Any] = {"error_code": 0, "node_id": 1, "host": "10.0.0.1", "port": 9092,
                            "coordinators": [
                                {"key": "g", "error_code": 0, "node_id": 2, "host": "10.0.0.2",
                                 "port": 9092}]}
    rewrite_coordinator(body, address_of)
    assert (body["host"], body["port"]) == ("ext.example", 9094)
    assert body["coordinators"][0]["error_code"] == ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert body["coordinators"][0]["node_id"] == -1
