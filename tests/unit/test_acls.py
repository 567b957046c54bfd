"""ACLs: the StandardAuthorizer core (raftlog.security.acl, .authorizer) with Hypothesis, the
CreateAcls/DeleteAcls records and their apply, the snapshot format migration, the API
planning (raftlog.broker.acl_apis), the per-API guards (raftlog.broker.acl_guards*) and the
authorizer properties (raftlog.config.authorizer)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftlog.broker.acl_apis import (
    CREATIONS_PER_REQUEST_MAX,
    describe_body,
    plan_creations,
)
from raftlog.broker.acl_guards import guard_handlers
from raftlog.broker.acl_guards_coordinators import GUARDS, build_authorizer, guards
from raftlog.config import ConfigError
from raftlog.config.authorizer import AuthorizerSettings, parse_authorizer_settings
from raftlog.metadata import _codec, errors
from raftlog.metadata.image import AclBindingImage, MetadataImage
from raftlog.metadata.records import Command, CreateAcls, DeleteAcls
from raftlog.metadata.state import MetadataStateMachine
from raftlog.protocol import codec
from raftlog.protocol.api_table import APIS_BY_KEY
from raftlog.protocol.codec import Struct
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import METADATA, PRODUCE
from raftlog.protocol.schemas_group import JOIN_GROUP
from raftlog.protocol.schemas_security import CREATE_ACLS, DESCRIBE_ACLS
from raftlog.security.acl import (
    AclFilter,
    AclOperation,
    AclPermission,
    AclResourceType,
    PatternType,
    filter_matches,
)
from raftlog.security.authorizer import StandardAuthorizer
from raftlog.security.session import ADMIN_USER, KafkaPrincipal, SaslState, Session
from raftlog.server.authz import Refusals
from raftlog.server.listener import Body, RequestContext

T, G, C, X = (AclResourceType.TOPIC, AclResourceType.GROUP, AclResourceType.CLUSTER,
              AclResourceType.TRANSACTIONAL_ID)
ALLOW, DENY = AclPermission.ALLOW, AclPermission.DENY
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
Op = AclOperation


def acl(rtype: int, name: str, op: int, permission: int = ALLOW, principal: str = "User:alice",
        host: str = "*", pattern: int = LIT, acl_id: str | None = None) -> AclBindingImage:
    key = acl_id or f"{rtype}-{name}-{pattern}-{principal}-{host}-{op}-{permission}"
    return AclBindingImage(key, rtype, name, pattern, principal, host, op, permission)


def authorizer(*bindings: AclBindingImage, super_users: tuple[str, ...] = (),
               allow_everyone: bool = False) -> StandardAuthorizer:
    table: Mapping[str, AclBindingImage] = {b.acl_id: b for b in bindings}
    return StandardAuthorizer(lambda: (1, table), super_users, allow_everyone)


def session(user: str = "alice", host: str = "10.0.0.1") -> Session:
    return Session(f"{host}:5000", KafkaPrincipal("User", user),
                   sasl_state=SaslState.AUTHENTICATED)


# -- the authorizer core -----------------------------------------------------------------------


def test_implication_rules() -> None:
    for granted in (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER, Op.ALL):
        assert authorizer(acl(T, "t", granted)).authorize(session(), Op.DESCRIBE, T, "t")
    assert not authorizer(acl(T, "t", Op.CREATE)).authorize(session(), Op.DESCRIBE, T, "t")
    assert authorizer(acl(T, "t", Op.ALTER_CONFIGS)).authorize(
        session(), Op.DESCRIBE_CONFIGS, T, "t")
    assert not authorizer(acl(T, "t", Op.DESCRIBE_CONFIGS)).authorize(
        session(), Op.ALTER_CONFIGS, T, "t")
    # DENY does not imply: a denied Read leaves Describe to the ALLOWs.
    both = authorizer(acl(T, "t", Op.READ, DENY), acl(T, "t", Op.DESCRIBE))
    assert both.authorize(session(), Op.DESCRIBE, T, "t")
    assert not both.authorize(session(), Op.READ, T, "t")


def test_literal_prefixed_wildcard_and_hosts() -> None:
    auth = authorizer(acl(T, "pay-", Op.READ, pattern=PRE), acl(G, "*", Op.READ),
                      acl(T, "exact", Op.WRITE, host="10.0.0.1"))
    me = session()
    assert auth.authorize(me, Op.READ, T, "pay-orders")
    assert not auth.authorize(me, Op.READ, T, "pay")  # shorter than the prefix
    assert auth.authorize(me, Op.READ, G, "any-group")
    assert auth.authorize(me, Op.WRITE, T, "exact")
    assert not auth.authorize(session(host="10.0.0.2"), Op.WRITE, T, "exact")
    assert not auth.authorize(session("bob"), Op.READ, G, "any-group")
    assert not auth.authorize(me, Op.WRITE, T, "exactly")  # literal is not a prefix


def test_super_users_cluster_members_and_no_acl_rule() -> None:
    auth = authorizer(super_users=("User:root",))
    assert auth.authorize(session("root"), Op.ALTER, C)
    assert not auth.authorize(session(), Op.DESCRIBE, T, "t")
    member = session(ADMIN_USER)
    assert auth.authorize(member, Op.CLUSTER_ACTION, C)
    anonymous = Session("1.2.3.4:5", KafkaPrincipal("User", ADMIN_USER))  # not authenticated
    assert not auth.authorize(anonymous, Op.CLUSTER_ACTION, C)
    open_auth = authorizer(acl(T, "named", Op.READ, principal="User:bob"), allow_everyone=True)
    assert open_auth.authorize(session(), Op.WRITE, T, "unnamed")
    assert not open_auth.authorize(session(), Op.READ, T, "named")  # named: ACLs decide


def test_cache_follows_the_acl_version() -> None:
    table: dict[str, AclBindingImage] = {}
    version = [0]
    auth = StandardAuthorizer(lambda: (version[0], table))
    assert not auth.authorize(session(), Op.READ, T, "t")
    grant = acl(T, "t", Op.READ)
    table[grant.acl_id] = grant
    assert not auth.authorize(session(), Op.READ, T, "t")  # cached for version 0
    version[0] = 1
    assert auth.authorize(session(), Op.READ, T, "t")


def test_authorize_any_of_a_type() -> None:
    auth = authorizer(acl(T, "a-", Op.WRITE, pattern=PRE), acl(T, "a-x", Op.WRITE, DENY))
    assert auth.authorize_any(session(), Op.WRITE, T)
    covered = authorizer(acl(T, "a-", Op.WRITE, pattern=PRE), acl(T, "a", Op.ALL, DENY,
                                                                  pattern=PRE))
    assert not covered.authorize_any(session(), Op.WRITE, T)
    assert not authorizer(acl(T, "*", Op.WRITE, DENY)).authorize_any(session(), Op.WRITE, T)


NAMES = st.sampled_from(["a", "ab", "abc", "b", "*"])
BINDINGS = st.builds(
    acl, st.sampled_from([T, G]), NAMES,
    st.sampled_from([o for o in Op if o not in (Op.UNKNOWN, Op.ANY)]),
    st.sampled_from([ALLOW, DENY]), st.sampled_from(["User:alice", "User:bob", "User:*"]),
    st.sampled_from(["*", "10.0.0.1", "10.0.0.2"]), st.sampled_from([LIT, PRE]))
REQUESTS = st.tuples(st.sampled_from([T, G]), st.sampled_from(["a", "ab", "abc", "b", "c"]),
                     st.sampled_from([o for o in Op if o not in (Op.UNKNOWN, Op.ANY, Op.ALL)]))


def _covers(b: AclBindingImage, rtype: int, name: str) -> bool:
    if b.resource_type != rtype:
        return False
    return name.startswith(b.resource_name) if b.pattern_type == PRE else (
        b.resource_name in ("*", name))


@given(st.lists(BINDINGS, max_size=8), REQUESTS)
def test_deny_always_wins(bindings: list[AclBindingImage], request: tuple[int, str, Op]) -> None:
    rtype, name, op = request
    auth = authorizer(*bindings)
    me = session()
    decided = auth.authorize(me, op, AclResourceType(rtype), name)
    denied = any(_covers(b, rtype, name) and b.permission == DENY
                 and b.principal in ("User:alice", "User:*") and b.host in ("*", "10.0.0.1")
                 and b.operation in (op, Op.ALL) for b in bindings)
    if denied:
        assert not decided
    # Adding a matching DENY always refuses; adding an unrelated principal's binding never
    # changes the answer.
    stricter = authorizer(*bindings, acl(rtype, name, Op.ALL, DENY, principal="User:*"))
    assert not stricter.authorize(me, op, AclResourceType(rtype), name)
    other = authorizer(*bindings, acl(rtype, name, op, ALLOW, principal="User:zed"))
    if any(_covers(b, rtype, name) for b in bindings):
        assert other.authorize(me, op, AclResourceType(rtype), name) == decided


@given(st.lists(BINDINGS, max_size=8), REQUESTS)
def test_allowed_only_through_a_matching_allow(bindings: list[AclBindingImage],
                                               request: tuple[int, str, Op]) -> None:
    rtype, name, op = request
    if authorizer(*bindings).authorize(session(), op, AclResourceType(rtype), name):
        assert any(_covers(b, rtype, name) and b.permission == ALLOW for b in bindings)


@given(st.lists(BINDINGS, max_size=6), NAMES)
def test_match_filter_selects_what_applies_to_the_name(bindings: list[AclBindingImage],
                                                       name: str) -> None:
    match = AclFilter(T, name, PatternType.MATCH)
    literal = AclFilter(T, name, PatternType.LITERAL)
    for b in bindings:
        assert filter_matches(match, b) == (b.resource_type == T and (
            name.startswith(b.resource_name) if b.pattern_type == PRE
            else b.resource_name in ("*", name)))
        assert filter_matches(literal, b) == (b.resource_type == T and b.pattern_type == LIT
                                              and b.resource_name == name)
        assert filter_matches(AclFilter(), b)  # null fields and ANY match everything


# -- records, apply, snapshots -----------------------------------------------------------------


def _apply(machine: MetadataStateMachine, record: CreateAcls | DeleteAcls) -> int:
    offset = machine.image.version + 1
    return machine.apply(Command(record, 0, f"r{offset}"), offset).error_code


def test_create_and_delete_apply_atomically() -> None:
    machine = MetadataStateMachine()
    a, b = acl(T, "t", Op.READ, acl_id="a"), acl(G, "g", Op.READ, acl_id="b")
    assert _apply(machine, CreateAcls((a, b))) == errors.NONE
    assert set(machine.image.acls) == {"a", "b"}
    version = machine.image.acl_version
    # The same rule under a new id is not stored twice; nothing new keeps the version.
    assert _apply(machine, CreateAcls((dataclasses.replace(a, acl_id="c"),))) == errors.NONE
    assert set(machine.image.acls) == {"a", "b"} and machine.image.acl_version == version
    bad = acl(C, "not-the-cluster", Op.ALTER, acl_id="d")
    assert _apply(machine, CreateAcls((acl(T, "u", Op.READ, acl_id="e"), bad))) == (
        errors.INVALID_REQUEST)
    assert "e" not in machine.image.acls  # all or nothing
    assert _apply(machine, DeleteAcls(("a", "gone"))) == errors.NONE
    assert set(machine.image.acls) == {"b"} and machine.image.acl_version > version


def test_snapshot_round_trip_and_old_format_reads_without_acls() -> None:
    machine = MetadataStateMachine()
    _apply(machine, CreateAcls((acl(T, "t", Op.READ, acl_id="a"),)))
    again = MetadataStateMachine.from_snapshot(machine.snapshot())
    assert again.image == machine.image
    plain = _codec.loads(machine.snapshot())
    assert isinstance(plain, dict) and plain["format"] == 4
    del plain["state"]["image"]["acls"]
    del plain["state"]["image"]["acl_version"]
    old = MetadataStateMachine.from_snapshot(_codec.dumps({**plain, "format": 2}))
    assert old.image.acls == {} and old.image.acl_version == -1
    with pytest.raises(_codec.CodecError):  # formats 3 and later must have them
        MetadataStateMachine.from_snapshot(_codec.dumps(plain))


# -- the API planning --------------------------------------------------------------------------


def _struct(api: Any, version: int, body: Body) -> Struct:
    raw = codec.encode_bytes(api, version, body, is_request=True)
    return codec.decode(api, version, raw, is_request=True)


def _creation(**changes: Any) -> Body:
    return {"resource_type": T, "resource_name": "t", "resource_pattern_type": LIT,
            "principal": "User:alice", "host": "*", "operation": Op.READ,
            "permission_type": ALLOW, **changes}


def test_plan_creations_checks_each_binding_and_caps_the_request() -> None:
    creations = [_creation(), _creation(principal="alice"), _creation(resource_pattern_type=2),
                 _creation(resource_type=C, resource_name="kafka-cluster", operation=Op.ALTER)]
    results, bindings = plan_creations(_struct(CREATE_ACLS, 1, {"creations": creations}), 1)
    assert [code for code, _ in results] == [0, errors.INVALID_REQUEST,
                                             errors.INVALID_REQUEST, 0]
    assert len(bindings) == 2 and len({b.acl_id for b in bindings}) == 2
    many = [_creation(resource_name=f"t{i}") for i in range(CREATIONS_PER_REQUEST_MAX + 2)]
    results, bindings = plan_creations(_struct(CREATE_ACLS, 2, {"creations": many}), 2)
    assert len(bindings) == CREATIONS_PER_REQUEST_MAX
    assert [code for code, _ in results[-2:]] == [ErrorCode.POLICY_VIOLATION] * 2


def test_describe_groups_by_resource_and_filters() -> None:
    table = {b.acl_id: b for b in (acl(T, "t", Op.READ), acl(T, "t", Op.WRITE),
                                   acl(T, "t-", Op.READ, pattern=PRE), acl(G, "g", Op.READ))}
    image = MetadataImage(version=5, acls=table, acl_version=5)
    request = {"resource_type_filter": T, "resource_name_filter": "t-x",
               "pattern_type_filter": PatternType.MATCH, "principal_filter": None,
               "host_filter": None, "operation": Op.ANY, "permission_type": AclPermission.ANY}
    body = describe_body(image, _struct(DESCRIBE_ACLS, 1, request), 1)
    assert [(r["resource_name"], r["pattern_type"]) for r in body["resources"]] == [("t-", PRE)]
    every = describe_body(image, _struct(DESCRIBE_ACLS, 1, {
        **request, "resource_type_filter": AclResourceType.ANY, "resource_name_filter": None,
        "pattern_type_filter": PatternType.ANY}), 1)
    assert sum(len(r["acls"]) for r in every["resources"]) == 4
    v0 = describe_body(image, _struct(DESCRIBE_ACLS, 0, {**request, "resource_name_filter": "t"}),
                       0)
    assert [len(r["acls"]) for r in v0["resources"]] == [2]  # literal only
    invalid = describe_body(image, _struct(DESCRIBE_ACLS, 1, {**request, "operation": 0}), 1)
    assert invalid["error_code"] == errors.INVALID_REQUEST


# -- the guards --------------------------------------------------------------------------------


def test_every_api_has_a_guard_or_is_listed_open() -> None:
    assert set(APIS_BY_KEY) <= set(GUARDS), set(APIS_BY_KEY) - set(GUARDS)


def _ctx(api: Any, version: int, body: Body, user: str = "alice") -> RequestContext:
    header = codec.RequestHeader(api.key, version, 1, "test")
    return RequestContext(api, header, _struct(api, version, body), "10.0.0.1:5000",
                          session(user))


def _guarded(image: MetadataImage, key: int, answer: Body) -> Any:
    auth = build_authorizer(AuthorizerSettings(True, ("User:root",)), lambda: image)
    seen: list[RequestContext] = []

    def handler(ctx: RequestContext) -> Body:
        seen.append(ctx)
        return dict(answer)

    table = guard_handlers({key: handler}, guards(), auth, Refusals(), lambda: image)
    return table[key], seen


def test_produce_keeps_allowed_topics_and_refuses_the_others() -> None:
    image = MetadataImage(version=1, acls={"a": acl(T, "ok", Op.WRITE, acl_id="a")},
                          acl_version=1)
    handler, seen = _guarded(image, PRODUCE.key, {"responses": [], "throttle_time_ms": 0})
    body = {"transactional_id": None, "acks": -1, "timeout_ms": 1000, "topic_data": [
        {"name": name, "partition_data": [{"index": 0, "records": b""}]}
        for name in ("ok", "no")]}
    answer = handler(_ctx(PRODUCE, 8, body))
    assert [t.name for t in seen[0].body.topic_data] == ["ok"]
    assert answer["responses"] == [{"name": "no", "partition_responses": [
        {"index": 0, "error_code": ErrorCode.TOPIC_AUTHORIZATION_FAILED, "base_offset": -1,
         "log_append_time_ms": -1, "log_start_offset": -1, "record_errors": [],
         "error_message": None}]}]
    handler(_ctx(PRODUCE, 8, body, user="root"))  # a super user: unchanged
    assert len(seen[1].body.topic_data) == 2


def test_metadata_hides_unrequested_and_refuses_requested_topics() -> None:
    image = MetadataImage(version=1, acls={"a": acl(T, "seen", Op.DESCRIBE, acl_id="a")},
                          acl_version=1)
    listed = {"topics": [{"error_code": 0, "name": n, "partitions": []}
                         for n in ("seen", "hidden")]}
    handler, seen = _guarded(image, METADATA.key, listed)
    every = handler(_ctx(METADATA, 9, {"topics": None, "allow_auto_topic_creation": True}))
    assert [t["name"] for t in every["topics"]] == ["seen"]
    asked = handler(_ctx(METADATA, 9, {"topics": [{"name": "hidden"}, {"name": "new"}],
                                       "allow_auto_topic_creation": True}))
    assert seen[-1].body.topics == ()  # neither described nor auto-created
    assert {t["name"]: t["error_code"] for t in asked["topics"] if t["error_code"]} == {
        "hidden": ErrorCode.TOPIC_AUTHORIZATION_FAILED,
        "new": ErrorCode.TOPIC_AUTHORIZATION_FAILED}


def test_group_apis_need_read_on_the_group() -> None:
    handler, seen = _guarded(MetadataImage(), JOIN_GROUP.key, {"error_code": 0})
    answer = handler(_ctx(JOIN_GROUP, 5, {
        "group_id": "g", "session_timeout_ms": 10000, "rebalance_timeout_ms": 10000,
        "member_id": "", "group_instance_id": None, "protocol_type": "consumer",
        "protocols": []}))
    assert answer["error_code"] == ErrorCode.GROUP_AUTHORIZATION_FAILED and not seen


def test_without_an_authorizer_handlers_are_unchanged() -> None:
    auth = build_authorizer(AuthorizerSettings(), MetadataImage)

    def handler(ctx: RequestContext) -> Body:
        return {}

    assert guard_handlers({0: handler}, guards(), auth, Refusals(), MetadataImage)[0] is handler


# -- properties --------------------------------------------------------------------------------


def test_authorizer_properties() -> None:
    settings = parse_authorizer_settings({
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:admin; User:ops", "allow.everyone.if.no.acl.found": "true"})
    assert settings == AuthorizerSettings(True, ("User:admin", "User:ops"), True)
    assert parse_authorizer_settings({
        "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer"}).enabled
    assert parse_authorizer_settings({}) == AuthorizerSettings()
    with pytest.raises(ConfigError):
        parse_authorizer_settings({"authorizer.class.name": "com.example.MyAuthorizer"})
    with pytest.raises(ConfigError):
        parse_authorizer_settings({"super.users": "admin"})
