"""Client quotas in the metadata log (AlterClientQuota: record, apply, snapshots), the
DescribeClientQuotas/AlterClientQuotas handlers' rules, and the listener side of throttling
(throttle_time_ms, the mute after the response, the delayed response for old clients)."""

from __future__ import annotations

import dataclasses
from typing import Any

import cbor2
import pytest
import trio
import trio.testing

from raftlog.broker.quota_apis import describe_body, plan_entry
from raftlog.metadata import errors
from raftlog.metadata.image import MetadataImage
from raftlog.metadata.records import AlterClientQuota, Command, decode_record, encode_record
from raftlog.metadata.state import MetadataStateMachine
from raftlog.protocol import codec
from raftlog.protocol.codec import Api, Struct
from raftlog.protocol.schemas_quota import ALTER_CLIENT_QUOTAS, DESCRIBE_CLIENT_QUOTAS
from raftlog.security.session import KafkaPrincipal, SaslState, Session
from raftlog.server.quotas import QuotaEnforcer, fetched_bytes

P, C, R = "producer_byte_rate", "consumer_byte_rate", "request_percentage"


def _apply(machine: MetadataStateMachine, record: AlterClientQuota) -> int:
    offset = machine.image.version + 1
    return machine.apply(Command(record, 0, f"r{offset}"), offset).error_code


def _quotas(image: MetadataImage) -> dict[Any, dict[str, float]]:
    return {q.entity: dict(q.values) for q in image.client_quotas}


def test_record_round_trip_and_apply() -> None:
    record = AlterClientQuota((("client-id", "app"), ("user", None)), ((P, 1024.0),), ())
    assert decode_record(encode_record(record)) == record
    machine = MetadataStateMachine()
    assert _apply(machine, record) == errors.NONE
    assert _apply(machine, AlterClientQuota((("user", "bob"),), ((R, 12.5), (C, 2048.0)),
                                            ())) == errors.NONE
    assert _apply(machine, AlterClientQuota((("client-id", "app"), ("user", None)), (),
                                            (P, C))) == errors.NONE  # C is not set: ignored
    assert _quotas(machine.image) == {(("user", "bob"),): {R: 12.5, C: 2048.0}}
    # A snapshot keeps them; it is written in format 4.
    snapshot = machine.snapshot()
    assert cbor2.loads(snapshot)["format"] == 4
    assert MetadataStateMachine.from_snapshot(snapshot).image == machine.image


def test_entities_are_kept_sorted() -> None:
    machine = MetadataStateMachine()
    for entity in [(("user", "b"),), (("client-id", "x"),), (("user", None),),
                   (("client-id", None), ("user", "a"))]:
        assert _apply(machine, AlterClientQuota(entity, ((P, 1.0),), ())) == errors.NONE
    assert [q.entity for q in machine.image.client_quotas] == [
        (("client-id", None), ("user", "a")), (("client-id", "x"),), (("user", None),),
        (("user", "b"),)]


def test_older_snapshots_read_as_without_quotas() -> None:
    machine = MetadataStateMachine()
    plain = cbor2.loads(machine.snapshot())
    del plain["state"]["image"]["client_quotas"]
    plain["format"] = 2
    old = MetadataStateMachine.from_snapshot(cbor2.dumps(plain, canonical=True))
    assert old.image.client_quotas == ()


@pytest.mark.parametrize(("entity", "set_values", "remove", "message"), [
    ((), ((P, 1.0),), (), "Invalid empty client quota entity"),
    ((("user", "a"), ("user", "b")), ((P, 1.0),), (), "Duplicate entity type"),
    ((("ip", "1.2.3.4"),), ((P, 1.0),), (), "IP quotas"),
    ((("group", "g"),), ((P, 1.0),), (), "Unhandled client quota entity type: group"),
    ((("user", "a"),), (("controller_mutation_rate", 1.0),), (), "Invalid configuration key"),
    ((("user", "a"),), ((P, 1.5),), (), "must be a Long value"),
    ((("user", "a"),), ((P, 0.0),), (), "must be greater than 0"),
    ((("user", "a"),), ((R, -1.0),), (), "must be greater than 0"),
    ((("user", "a"),), ((R, float("inf")),), (), "must be greater than 0"),
    ((("user", "a"),), ((P, 1.0),), (P,), "appears twice"),
    ((("user", "a"),), (), ("bogus",), "Invalid configuration key bogus"),
    ((("user", "a"),), (), (), "changes nothing"),
    ((("user", "a"), ("client-id", "c")), ((P, 1.0),), (), "out of order"),
])
def test_apply_refuses_what_kafka_refuses(entity: Any, set_values: Any, remove: Any,
                                          message: str) -> None:
    machine = MetadataStateMachine()
    offset = 1
    result = machine.apply(Command(AlterClientQuota(entity, set_values, remove), 0, "x"),
                           offset)
    assert result.error_code == errors.INVALID_REQUEST
    assert message in (result.message or "")
    assert machine.image.client_quotas == ()


def _request(api: Api, body: dict[str, Any], version: int = 1) -> Struct:
    raw = codec.encode_bytes(api, version, body, is_request=True)
    return codec.decode(api, version, raw, is_request=True)


def _image() -> MetadataImage:
    machine = MetadataStateMachine()
    for entity, value in [
        ((("user", "alice"),), 1.0), ((("user", None),), 2.0),
        ((("client-id", "app"),), 3.0), ((("client-id", None),), 4.0),
        ((("client-id", "app"), ("user", "alice")), 5.0),
        ((("client-id", None), ("user", None)), 6.0),
    ]:
        assert _apply(machine, AlterClientQuota(entity, ((P, value),), ())) == errors.NONE
    return machine.image


def _describe(components: list[tuple[str, int, str | None]], strict: bool) -> Any:
    body = describe_body(_image(), _request(DESCRIBE_CLIENT_QUOTAS, {
        "components": [{"entity_type": t, "match_type": m, "match": n}
                       for t, m, n in components], "strict": strict}))
    if body["error_code"]:
        return body["error_code"], body["error_message"]
    return sorted(int(e["values"][0]["value"]) for e in body["entries"])


@pytest.mark.parametrize(("components", "strict", "expected"), [
    ([], False, [1, 2, 3, 4, 5, 6]),
    ([], True, []),
    ([("user", 0, "alice")], False, [1, 5]),
    ([("user", 0, "alice")], True, [1]),
    ([("user", 1, None)], False, [2, 6]),
    ([("user", 1, None)], True, [2]),
    ([("user", 2, None)], False, [1, 2, 5, 6]),  # ANY: a name or the default
    ([("user", 2, None)], True, [1, 2]),
    ([("client-id", 2, None), ("user", 2, None)], True, [5, 6]),
    ([("client-id", 0, "app"), ("user", 0, "alice")], True, [5]),
    ([("client-id", 1, None)], True, [4]),
    ([("user", 0, "nobody")], False, []),
])
def test_describe_filters_like_kafka(components: Any, strict: bool, expected: Any) -> None:
    assert _describe(components, strict) == expected


@pytest.mark.parametrize(("components", "code", "message"), [
    ([("user", 0, None)], errors.INVALID_REQUEST, "MATCH_TYPE_EXACT"),
    ([("user", 1, "x")], errors.INVALID_REQUEST, "MATCH_TYPE_DEFAULT"),
    ([("user", 2, "x")], errors.INVALID_REQUEST, "MATCH_TYPE_SPECIFIED"),
    ([("user", 2, None), ("user", 1, None)], errors.INVALID_REQUEST, "more than once"),
    ([("", 2, None)], errors.INVALID_REQUEST, "empty entity type"),
    ([("topic", 2, None)], 35, "Unsupported entity type topic"),
    ([("user", 7, None)], 35, "Unknown match type 7"),
    ([("ip", 2, None), ("user", 2, None)], errors.INVALID_REQUEST, "IP filter"),
])
def test_describe_refuses_bad_filters(components: Any, code: int, message: str) -> None:
    got_code, got_message = _describe(components, False)
    assert got_code == code and message in got_message


def _entry(entity: list[tuple[str, str | None]], ops: list[tuple[str, float, bool]]) -> Struct:
    request = _request(ALTER_CLIENT_QUOTAS, {"entries": [{
        "entity": [{"entity_type": t, "entity_name": n} for t, n in entity],
        "ops": [{"key": k, "value": v, "remove": r} for k, v, r in ops]}],
        "validate_only": False}, version=0)
    return request.entries[0]


def test_plan_entry_builds_the_record_or_kafkas_error() -> None:
    plan = plan_entry(_entry([("user", "a"), ("client-id", None)],
                             [(P, 1024, False), (R, 0, True)]))
    assert plan == AlterClientQuota((("client-id", None), ("user", "a")), ((P, 1024.0),), (R,))
    assert plan_entry(_entry([("user", "a")], [("bogus", 1, False)])) == (
        errors.INVALID_REQUEST, "Invalid configuration key bogus")
    assert plan_entry(_entry([("user", "a")], [(C, 1, False), (C, 2, False)]))[0] == (  # type: ignore[index]
        errors.INVALID_REQUEST)
    assert plan_entry(_entry([], [(C, 1, False)]))[0] == errors.INVALID_REQUEST  # type: ignore[index]


# -- The listener side -----------------------------------------------------------------------


@dataclasses.dataclass
class _Slot:
    name: str
    version: int
    body: dict[str, Any] | None
    size: int = 0
    client_id: str | None = "app"
    respond: bool = True
    start: int = 0
    local: int = 0


def _enforcer(quotas: dict[Any, dict[str, float]], now: list[float]) -> QuotaEnforcer:
    image = _image()
    machine = MetadataStateMachine()
    for entity, values in quotas.items():
        _apply(machine, AlterClientQuota(entity, tuple(values.items()), ()))
    image = machine.image
    return QuotaEnforcer(lambda: image, clock=lambda: now[0])


async def _handled(connection: Any, slot: _Slot) -> None:
    """What the listener does: the reader after the handler, the writer once it is ready."""
    connection.dispatched(slot)
    await connection.account(slot)


def test_produce_over_quota_gets_throttle_time_and_the_connection_is_muted() -> None:
    async def main() -> None:
        now = [0.0]
        enforcer = _enforcer({(("client-id", "app"),): {P: 100.0}}, now)
        connection = enforcer.connection(Session("peer"))
        body = {"throttle_time_ms": 0, "responses": []}
        await _handled(connection, _Slot("Produce", 9, body, size=1000))
        assert body["throttle_time_ms"] == 0
        body = {"throttle_time_ms": 0, "responses": []}
        throttled = _Slot("Produce", 9, body, size=2000)
        connection.dispatched(throttled)
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            # The next request waits for the throttled one's response, then for its throttle.
            nursery.start_soon(connection.wait_unmuted)
            await trio.sleep(5)
            await connection.account(throttled)
            assert body["throttle_time_ms"] == 20_000  # sent at once: the client backs off
            connection.sent()
        assert trio.current_time() - start == pytest.approx(25.0)
        assert enforcer.stats.throttle_ms[P].count == 1
        # Another client id has no quota; a cluster member is never throttled.
        other = {"throttle_time_ms": 0}
        await _handled(connection, _Slot("Produce", 9, other, size=10**6, client_id="x"))
        admin = Session("peer", principal=KafkaPrincipal("User", "__raftlog-admin"),
                        sasl_state=SaslState.AUTHENTICATED)
        member = {"throttle_time_ms": 0}
        await _handled(enforcer.connection(admin), _Slot("Produce", 9, member, size=10**6))
        assert other["throttle_time_ms"] == member["throttle_time_ms"] == 0

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_old_produce_versions_get_the_response_late_and_acks_0_mutes() -> None:
    async def main() -> None:
        now = [0.0]
        enforcer = _enforcer({(("client-id", None),): {P: 100.0}}, now)
        connection = enforcer.connection(Session("peer"))
        start = trio.current_time()
        body = {"throttle_time_ms": 0}
        await _handled(connection, _Slot("Produce", 5, body, size=3000))  # before KIP-219
        assert trio.current_time() - start == pytest.approx(20.0)
        assert body["throttle_time_ms"] == 20_000
        # acks=0: no response, the connection is muted all the same.
        await _handled(connection, _Slot("Produce", 9, None, size=3000, respond=False))
        await connection.wait_unmuted()
        assert trio.current_time() - start > 40.0

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_consumer_fetch_bytes_and_request_time_are_recorded() -> None:
    async def main() -> None:
        now = [0.0]
        enforcer = _enforcer({(("user", None),): {C: 100.0, R: 1.0}}, now)
        connection = enforcer.connection(Session("peer"))
        body = {"throttle_time_ms": 0, "responses": [
            {"partitions": [{"records": b"x" * 3000}, {"records": None}]}]}
        assert fetched_bytes(body) == 3000
        await _handled(connection, _Slot("FetchConsumer", 12, body))
        assert body["throttle_time_ms"] == 20_000
        # A follower's fetch is not a consumer's: only its handler time counts.
        follower = {"throttle_time_ms": 0, "responses": body["responses"]}
        await _handled(connection, _Slot("FetchFollower", 12, follower))
        assert follower["throttle_time_ms"] == 0
        # 0.5 s of handler time is 50% of a thread over the 10 s window: 5%/s on a 1% quota.
        slow = {"throttle_time_ms": 0}
        await _handled(connection, _Slot("Metadata", 12, slow, start=0, local=500_000_000))
        assert slow["throttle_time_ms"] == 1000  # at most one window
        assert enforcer.stats.throttle_ms[R].count == 1

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
