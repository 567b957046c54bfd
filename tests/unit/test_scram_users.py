"""SCRAM users: the AlterUserScram record and its state machine rules, the APIs 50/51 planning
(raftlog.broker.scram_apis), PLAIN's JAAS users (raftlog.config.sasl) and the node's SASL
server for users (raftlog.security.sasl_server) driven through a Session."""

from __future__ import annotations

import hashlib
import os
from types import SimpleNamespace
from typing import Any

import pytest

from raftlog.broker.scram_apis import (
    USERS_PER_REQUEST_MAX,
    derive_credential,
    describe_body,
    plan_alterations,
)
from raftlog.config import ConfigError
from raftlog.config.sasl import parse_plain_jaas, parse_sasl_settings
from raftlog.metadata import errors
from raftlog.metadata.image import ScramCredentialImage
from raftlog.metadata.records import AlterUserScram, Command, decode_command, encode_command
from raftlog.metadata.state import MetadataStateMachine
from raftlog.protocol.errors import ErrorCode
from raftlog.security.sasl_server import SaslAuthenticator
from raftlog.security.scram import ScramClient, ScramCredential, salted_password
from raftlog.security.session import ADMIN_USER, ClusterCredentials, SaslState, Session

SHA256, SHA512 = "SCRAM-SHA-256", "SCRAM-SHA-512"


def _credential(mechanism: str = SHA256, password: bytes = b"pw", iterations: int = 4096
                ) -> ScramCredentialImage:
    salt = b"0123456789abcdef"
    return derive_credential(mechanism, salt, salted_password(mechanism, password, salt,
                                                              iterations), iterations)


def _apply(machine: MetadataStateMachine, record: AlterUserScram) -> int:
    offset = machine.image.version + 1
    return machine.apply(Command(record, 0, f"r{offset}"), offset).error_code


def test_derived_keys_are_rfc5802s() -> None:
    salt = os.urandom(16)
    for mechanism in (SHA256, SHA512):
        expected = ScramCredential.from_password(mechanism, b"pencil", salt, 4096)
        got = derive_credential(mechanism, salt,
                                salted_password(mechanism, b"pencil", salt, 4096), 4096)
        assert (got.stored_key, got.server_key) == (expected.stored_key, expected.server_key)


def test_record_round_trips_and_applies_set_replace_delete() -> None:
    record = AlterUserScram("alice", (_credential(SHA256), _credential(SHA512)), ())
    assert decode_command(encode_command(Command(record, 1, "x"))).record == record
    machine = MetadataStateMachine()
    assert _apply(machine, record) == errors.NONE
    assert sorted(machine.image.scram_users["alice"]) == [SHA256, SHA512]
    newer = _credential(SHA512, b"other", 8192)
    assert _apply(machine, AlterUserScram("alice", (newer,), (SHA256,))) == errors.NONE
    assert dict(machine.image.scram_users["alice"]) == {SHA512: newer}
    assert _apply(machine, AlterUserScram("alice", (), (SHA512,))) == errors.NONE
    assert "alice" not in machine.image.scram_users
    # A snapshot carries the users; a restored machine has the same image.
    assert _apply(machine, record) == errors.NONE
    restored = MetadataStateMachine.from_snapshot(machine.snapshot())
    assert restored.image == machine.image


@pytest.mark.parametrize(("record", "code"), [
    (AlterUserScram("", (_credential(),), ()), errors.UNACCEPTABLE_CREDENTIAL),
    (AlterUserScram("__raftlog-admin", (_credential(),), ()), errors.UNACCEPTABLE_CREDENTIAL),
    (AlterUserScram("a", (_credential(iterations=4096),), ()), errors.NONE),
    (AlterUserScram("a", (ScramCredentialImage(SHA256, b"s", b"k" * 32, b"k" * 32, 4095),), ()),
     errors.UNACCEPTABLE_CREDENTIAL),
    (AlterUserScram("a", (ScramCredentialImage(SHA256, b"s", b"k" * 32, b"k" * 32, 16385),), ()),
     errors.UNACCEPTABLE_CREDENTIAL),
    (AlterUserScram("a", (ScramCredentialImage(SHA256, b"s", b"k" * 64, b"k" * 64, 4096),), ()),
     errors.UNACCEPTABLE_CREDENTIAL),
    (AlterUserScram("a", (ScramCredentialImage("SCRAM-MD5", b"s", b"k", b"k", 4096),), ()),
     errors.UNSUPPORTED_SASL_MECHANISM),
    (AlterUserScram("a", (), (SHA256,)), errors.RESOURCE_NOT_FOUND),
    (AlterUserScram("a", (_credential(),), (SHA256,)), errors.INVALID_REQUEST),
    (AlterUserScram("a", (), ()), errors.INVALID_REQUEST),
])
def test_state_machine_checks_credentials_in_log_order(record: AlterUserScram, code: int
                                                       ) -> None:
    machine = MetadataStateMachine()
    assert _apply(machine, record) == code
    if code != errors.NONE:
        assert machine.image.scram_users == {}


def _upsertion(name: str, mechanism: int = 1, iterations: int = 4096,
               salted: bytes | None = None) -> dict[str, Any]:
    size = 32 if mechanism == 1 else 64
    return {"name": name, "mechanism": mechanism, "iterations": iterations, "salt": b"salt",
            "salted_password": salted if salted is not None else bytes(size)}


def _request(deletions: list[dict[str, Any]], upsertions: list[dict[str, Any]]) -> Any:
    def ns(d: dict[str, Any]) -> SimpleNamespace:
        return SimpleNamespace(**d)

    return SimpleNamespace(deletions=[ns(d) for d in deletions],
                           upsertions=[ns(u) for u in upsertions])


def test_alter_plan_changes_at_most_the_cap_of_users_per_request() -> None:
    """Each user is a metadata commit: one huge request must not become thousands of them."""
    machine = MetadataStateMachine()
    names = [f"user{i:04d}" for i in range(USERS_PER_REQUEST_MAX + 3)]
    refused, records = plan_alterations(machine.image,
                                        _request([], [_upsertion(name) for name in names]))
    assert [r.user for r in records] == names[:USERS_PER_REQUEST_MAX]
    assert refused == {name: (ErrorCode.POLICY_VIOLATION,
                              f"At most {USERS_PER_REQUEST_MAX} users per request")
                       for name in names[USERS_PER_REQUEST_MAX:]}


def test_alter_plan_gives_kafkas_error_per_user() -> None:
    machine = MetadataStateMachine()
    _apply(machine, AlterUserScram("carol", (_credential(SHA512),), ()))
    request = _request(
        [{"name": "dave", "mechanism": 1}, {"name": "carol", "mechanism": 2},
         {"name": "erin", "mechanism": 1}],
        [_upsertion("alice"), _upsertion("bob", iterations=4095),
         _upsertion("frank", iterations=16385), _upsertion("", 1),
         _upsertion("gina", mechanism=3), _upsertion("erin", 1),
         _upsertion("hank", salted=b"short")])
    refused, records = plan_alterations(machine.image, request)
    assert refused == {
        "dave": (errors.RESOURCE_NOT_FOUND,
                 "Attempt to delete a user credential that does not exist"),
        "erin": (ErrorCode.DUPLICATE_RESOURCE,
                 "A user credential cannot be altered twice in the same request"),
        "bob": (errors.UNACCEPTABLE_CREDENTIAL, "Too few iterations (4095 < 4096)"),
        "frank": (errors.UNACCEPTABLE_CREDENTIAL, "Too many iterations (16385 > 16384)"),
        "": (errors.UNACCEPTABLE_CREDENTIAL, "Username must not be empty"),
        "gina": (errors.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism 3"),
        "hank": (errors.UNACCEPTABLE_CREDENTIAL, "A SCRAM-SHA-256 salted password has 32 bytes"),
    }
    assert [(r.user, r.deletions, [c.mechanism for c in r.upserts]) for r in records] == [
        ("carol", (SHA512,), []), ("alice", (), [SHA256])]
    salted = bytes(32)
    client_key = hashlib.sha256  # the stored key is H(HMAC(salted, "Client Key"))
    assert records[1].upserts[0].stored_key == client_key(
        __import__("hmac").new(salted, b"Client Key", "sha256").digest()).digest()


def test_describe_all_named_unknown_and_duplicate() -> None:
    machine = MetadataStateMachine()
    _apply(machine, AlterUserScram("bob", (_credential(SHA512, iterations=8192),), ()))
    _apply(machine, AlterUserScram("alice", (_credential(SHA256),), ()))
    every = describe_body(machine.image, None)
    assert [(r["user"], r["credential_infos"]) for r in every["results"]] == [
        ("alice", [{"mechanism": 1, "iterations": 4096}]),
        ("bob", [{"mechanism": 2, "iterations": 8192}])]
    assert describe_body(machine.image, []) == every
    named = describe_body(machine.image, ["bob", "zed", "alice", "alice"])["results"]
    assert [(r["user"], r["error_code"]) for r in named] == [
        ("bob", 0), ("zed", errors.RESOURCE_NOT_FOUND),
        ("alice", ErrorCode.DUPLICATE_RESOURCE)]
    assert "salt" not in repr(every) and "key" not in repr(every)


def test_old_snapshot_format_reads_as_an_image_without_users() -> None:
    from raftlog.metadata import _codec
    machine = MetadataStateMachine()
    _apply(machine, AlterUserScram("alice", (_credential(),), ()))
    plain = _codec.loads(machine.snapshot())
    assert isinstance(plain, dict)
    del plain["state"]["image"]["scram_users"]
    old = _codec.dumps({**plain, "format": 1})
    assert MetadataStateMachine.from_snapshot(old).image.scram_users == {}
    with pytest.raises(_codec.CodecError):  # format 2 must have them
        MetadataStateMachine.from_snapshot(_codec.dumps(plain))


# -- JAAS and settings -------------------------------------------------------------------------

PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"


def test_jaas_users() -> None:
    text = (f'{PLAIN_MODULE} required username="admin" password="admin-pw"\n'
            ' user_admin="admin-pw" user_alice="a \\"quoted\\" ; pw" user_bob=plain;')
    assert parse_plain_jaas("sasl.jaas.config", text) == {
        "admin": "admin-pw", "alice": 'a "quoted" ; pw', "bob": "plain"}


@pytest.mark.parametrize("text", [
    'org.apache.kafka.common.security.scram.ScramLoginModule required user_a="b";',
    f'{PLAIN_MODULE} user_a="b";',
    f'{PLAIN_MODULE} required user_a="b"',
    f'{PLAIN_MODULE} required user_a="b" &&;',
])
def test_bad_jaas_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_plain_jaas("sasl.jaas.config", text)


def test_sasl_settings_defaults_and_per_listener_users() -> None:
    default = parse_sasl_settings({})
    assert default.enabled_mechanisms == ("PLAIN", SHA256, SHA512)
    assert default.reauth_ms == 0
    settings = parse_sasl_settings({
        "sasl.enabled.mechanisms": "scram-sha-512,PLAIN",
        "sasl.jaas.config": f'{PLAIN_MODULE} required user_a="1";',
        "listener.name.sasl_plaintext.plain.sasl.jaas.config":
            f'{PLAIN_MODULE} required user_b="2";',
        "connections.max.reauth.ms": "60000"})
    assert settings.enabled_mechanisms == (SHA512, "PLAIN")
    assert settings.plain_users_of("SASL_PLAINTEXT") == {"b": "2"}
    assert settings.plain_users_of("OTHER") == {"a": "1"}
    assert settings.reauth_ms == 60000
    with pytest.raises(ConfigError, match="GSSAPI"):
        parse_sasl_settings({"sasl.enabled.mechanisms": "GSSAPI"})


# -- The SASL server through a Session ----------------------------------------------------------

def _authenticator(enabled: tuple[str, ...] = ("PLAIN", SHA256, SHA512),
                   cluster: ClusterCredentials | None = None) -> SaslAuthenticator:
    users = {(SHA512, "alice"): ScramCredential.from_password(SHA512, b"alice-pw", b"s" * 16)}
    return SaslAuthenticator(enabled, cluster, lambda m, u: users.get((m, u)),
                             {"bob": "bob-pw"}, 30_000)


def _scram_login(session: Session, server: SaslAuthenticator, mechanism: str, user: str,
                 password: bytes) -> tuple[int, str | None]:
    assert session.handshake(mechanism, server) == 0
    client = ScramClient(mechanism, user, password)
    error, first, message = session.authenticate(client.first())
    if error:
        return error, message
    error, final, message = session.authenticate(client.final(first))
    if not error:
        client.verify(final)
    return error, message


def test_scram_user_from_the_image_authenticates() -> None:
    session = Session("peer")
    assert _scram_login(session, _authenticator(), SHA512, "alice", b"alice-pw") == (0, None)
    assert session.authenticated and str(session.principal) == "User:alice"
    assert session.broker_id is None


@pytest.mark.parametrize(("user", "password"), [("alice", b"wrong"), ("nobody", b"x")])
def test_wrong_password_and_unknown_user_fail_alike(user: str, password: bytes) -> None:
    session = Session("peer")
    assert _scram_login(session, _authenticator(), SHA512, user, password) == (
        58, "Authentication failed during SCRAM-SHA-512 authentication")
    assert session.sasl_state is SaslState.FAILED


@pytest.mark.parametrize(("token", "ok"), [
    (b"\0bob\0bob-pw", True), (b"bob\0bob\0bob-pw", True), (b"\0bob\0bob-pX", False),
    (b"\0bob\0bob-pw2", False), (b"\0carl\0bob-pw", False), (b"eve\0bob\0bob-pw", False),
    (b"\0bob", False), (b"\0" + ADMIN_USER.encode() + b"\0x", False),
])
def test_plain(token: bytes, ok: bool) -> None:
    session = Session("peer")
    assert session.handshake("PLAIN", _authenticator()) == 0
    error, reply, message = session.authenticate(token)
    assert (error == 0) is ok
    if ok:
        assert str(session.principal) == "User:bob" and reply == b""
    else:
        assert (error, message) == (58, "Authentication failed during PLAIN authentication")


def test_mechanisms_not_enabled_are_unsupported() -> None:
    server = _authenticator(enabled=(SHA512,))
    assert server.mechanisms == [SHA512]
    assert Session("p").handshake("PLAIN", server) == 33
    assert Session("p").handshake(SHA256, server) == 33
    assert Session("p").handshake("GSSAPI", server) == 33


def test_cluster_members_log_in_even_when_sha256_is_not_enabled() -> None:
    cluster = ClusterCredentials("secret")
    server = _authenticator(enabled=("PLAIN",), cluster=cluster)
    assert server.mechanisms == ["PLAIN", SHA256]
    session = Session("p")
    assert session.handshake(SHA256, server) == 0
    client = cluster.client(ADMIN_USER)
    _, first, _ = session.authenticate(client.first())
    assert session.authenticate(client.final(first))[0] == 0
    assert str(session.principal) == f"User:{ADMIN_USER}"
    # ... but no user logs in with a mechanism that is not enabled.
    users = {(SHA256, "alice"): ScramCredential.from_password(SHA256, b"pw", b"s" * 16)}
    server = SaslAuthenticator(("PLAIN",), cluster, lambda m, u: users.get((m, u)))
    assert _scram_login(Session("p"), server, SHA256, "alice", b"pw")[0] == 58


def test_image_users_cannot_claim_a_cluster_name() -> None:
    fake = ScramCredential.from_password(SHA256, b"pw", b"s" * 16)
    server = SaslAuthenticator((SHA256,), ClusterCredentials("secret"), lambda m, u: fake)
    assert _scram_login(Session("p"), server, SHA256, ADMIN_USER, b"pw")[0] == 58


def test_sasl_listener_admits_only_the_exchange_until_authenticated() -> None:
    sasl_keys = frozenset({17, 36})
    session = Session("p", sasl_required=True)
    assert session.may_send(18, sasl_keys) and session.may_send(17, sasl_keys)
    assert not session.may_send(3, sasl_keys) and not session.may_send(50, sasl_keys)
    assert session.frame_bytes_max == 512 * 1024
    assert session.handshake("PLAIN", _authenticator()) == 0
    assert session.authenticate(b"\0bob\0bob-pw")[0] == 0
    assert session.may_send(3, sasl_keys) and session.frame_bytes_max is None
    plain = Session("p")
    assert plain.may_send(3, sasl_keys) and plain.frame_bytes_max is None


def test_reauthentication_keeps_the_principal() -> None:
    server = _authenticator()
    session = Session("p")
    assert _scram_login(session, server, SHA512, "alice", b"alice-pw") == (0, None)
    # Again as alice: fine. A different mechanism than the first: refused.
    assert _scram_login(session, server, SHA512, "alice", b"alice-pw") == (0, None)
    assert session.handshake("PLAIN", server) == 34
    # As someone else: the connection fails.
    assert session.handshake(SHA512, server) == 0
    session2 = Session("p")
    assert _scram_login(session2, server, SHA512, "alice", b"alice-pw") == (0, None)
    assert session2.handshake("PLAIN", server) == 34
    bob = Session("p")
    assert bob.handshake("PLAIN", server) == 0 and bob.authenticate(b"\0bob\0bob-pw")[0] == 0
    assert bob.handshake("PLAIN", server) == 0
    error, _, _ = bob.authenticate(b"\0alice\0bob-pw")
    assert error == 58 and bob.sasl_state is SaslState.FAILED
    bob2 = Session("p")
    bob2.handshake("PLAIN", server)
    bob2.authenticate(b"\0bob\0bob-pw")
    bob2.handshake("PLAIN", _authenticator_with_alice_plain())
    assert bob2.authenticate(b"\0alice\0a-pw") == (
        58, b"", "Cannot change principals during re-authentication")


def _authenticator_with_alice_plain() -> SaslAuthenticator:
    return SaslAuthenticator(("PLAIN",), None, lambda m, u: None, {"alice": "a-pw"}, 1000)


def test_no_reauthentication_without_a_session_lifetime() -> None:
    server = SaslAuthenticator(("PLAIN",), None, lambda m, u: None, {"bob": "pw"}, 0)
    session = Session("p")
    assert session.handshake("PLAIN", server) == 0 and session.authenticate(b"\0bob\0pw")[0] == 0
    assert session.handshake("PLAIN", server) == 34


def _server_and_first(client: ScramClient) -> tuple[Any, bytes]:
    from raftlog.security.scram import ScramServer

    credential = ScramCredential.from_password(SHA512, b"pw", b"s" * 16)
    server = ScramServer(SHA512, lambda m, u: credential, b"decoy")
    return server, server.first(client.first())


@pytest.mark.parametrize(("form", "accepted"), [
    ("full", True), ("old-librdkafka", True), ("client-only", False), ("doubled-server", False),
    ("other-prefix", False)])
def test_client_final_nonce_forms(form: str, accepted: bool) -> None:
    """RFC 5802's nonce, and old librdkafka's (client nonce + full nonce, librdkafka#4895):
    any other nonce fails, even with a proof computed over it."""
    import base64

    from raftlog.security.scram import ScramError

    client = ScramClient(SHA512, "alice", b"pw")
    server, first = _server_and_first(client)
    full = first.decode().split(",")[0][2:]
    cnonce = client._nonce
    nonce = {"full": full, "old-librdkafka": cnonce + full, "client-only": cnonce,
             "doubled-server": full + full, "other-prefix": "x" + full}[form]
    # A proof computed over the nonce sent and the server's real server-first (as librdkafka
    # does).
    name = "sha512"
    import hashlib
    import hmac as hmac_
    salted = salted_password(SHA512, b"pw", b"s" * 16, 4096)
    client_key = hmac_.new(salted, b"Client Key", name).digest()
    without_proof = f"c={base64.b64encode(b'n,,').decode()},r={nonce}"
    auth = f"n=alice,r={cnonce},{first.decode()},{without_proof}".encode()
    signature = hmac_.new(hashlib.new(name, client_key).digest(), auth, name).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    final = f"{without_proof},p={base64.b64encode(proof).decode()}".encode()
    if accepted:
        assert server.final(final).startswith(b"v=")
        assert server.legacy_nonce is (form == "old-librdkafka")
    else:
        with pytest.raises(ScramError, match="nonce"):
            server.final(final)


# -- SASL_PLAINTEXT listeners in the server config ---------------------------------------------

def test_sasl_plaintext_and_sasl_ssl_listeners_are_accepted() -> None:
    from raftlog.config import ServerConfig
    from raftlog.node import _check_sasl_listeners

    props = {"node.id": "1", "listeners": "SASL_PLAINTEXT://127.0.0.1:9094,"
             "CONTROLLER://127.0.0.1:9093",
             "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT"}
    config = ServerConfig.from_properties({**props, "raft.secret": "s"})
    assert config.sasl.sasl_listeners == ("SASL_PLAINTEXT",)
    assert config.inter_broker_listener_name == "SASL_PLAINTEXT"
    _check_sasl_listeners(config)
    with pytest.raises(ConfigError, match=r"needs raft\.secret"):
        _check_sasl_listeners(ServerConfig.from_properties(props))
    # Beside a PLAINTEXT listener (the nodes' own) a SASL listener needs no secret: the node
    # serves both, each with its protocol.
    both = ServerConfig.from_properties({
        "node.id": "1", "listeners": "PLAINTEXT://h:1,USERS://h:2,CONTROLLER://h:3",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,"
                                          "USERS:SASL_PLAINTEXT"})
    assert both.sasl.sasl_listeners == ("USERS",)
    assert both.inter_broker_listener_name == "PLAINTEXT"
    _check_sasl_listeners(both)
    # SASL_SSL: TLS settings per listener (Kafka's listener.name.<l>.ssl.*), SASL required,
    # mechanisms per listener.
    tls = ServerConfig.from_properties({
        "node.id": "1", "listeners": "X://h:1,P://h:4,CONTROLLER://h:2",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,X:SASL_SSL,P:SASL_PLAINTEXT",
        "listener.name.x.ssl.keystore.location": "/k.pem",
        "listener.name.x.sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "listener.name.p.plain.sasl.jaas.config": JAAS_BOB, "raft.secret": "s"})
    assert tls.sasl.sasl_listeners == ("X", "P")
    assert tls.protocol_of("X") == "SASL_SSL"
    settings = tls.tls_of("X")
    assert settings is not None and settings.keystore_location == "/k.pem"
    assert tls.tls_of("P") is None
    assert tls.sasl.mechanisms_of("X") == ("SCRAM-SHA-512",)
    assert tls.sasl.mechanisms_of("P") == ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
    assert tls.sasl.plain_users_of("P") == {"bob": "b"}
    with pytest.raises(ConfigError, match=r"ssl\.keystore\.location"):
        ServerConfig.from_properties({
            "node.id": "1", "listeners": "X://h:1,CONTROLLER://h:2",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,X:SASL_SSL"})
    with pytest.raises(ConfigError, match="not served"):
        ServerConfig.from_properties({
            "node.id": "1", "listeners": "X://h:1,CONTROLLER://h:2",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,X:SASL_PLAINTEXT",
            "listener.name.x.sasl.enabled.mechanisms": "GSSAPI"})


JAAS_BOB = ('org.apache.kafka.common.security.plain.PlainLoginModule required'
            ' user_bob="b";')


def test_session_expires_without_reauthentication() -> None:
    """KIP-368 on the server: SaslAuthenticate answers the lifetime; once it is over only a
    re-authentication is served (anything else closes the connection), which renews it."""
    import trio

    from raftlog.protocol.codec import RequestHeader
    from raftlog.protocol.schemas_security import SASL_AUTHENTICATE, SASL_HANDSHAKE
    from raftlog.server.listener import RequestContext
    from raftlog.server.sasl import SaslApis

    server = SaslAuthenticator(("PLAIN",), None, lambda m, u: None, {"bob": "pw"}, 30_000)
    apis = SaslApis(None, lambda session: server)
    session = Session("p")
    sasl_keys = frozenset({17, 36})

    def call(api: Any, body: dict[str, Any]) -> Any:
        header = RequestHeader(api.key, 1, 1, "c")
        return apis.handlers()[api.key](RequestContext(api, header, SimpleNamespace(**body),
                                                       "p", session))

    async def scenario() -> None:
        assert call(SASL_HANDSHAKE, {"mechanism": "PLAIN"})["error_code"] == 0
        answer = call(SASL_AUTHENTICATE, {"auth_bytes": b"\0bob\0pw"})
        assert (answer["error_code"], answer["session_lifetime_ms"]) == (0, 30_000)
        assert session.expires_at is not None
        assert abs(session.expires_at - (trio.current_time() + 30)) < 1
        assert session.may_send(3, sasl_keys)
        session.expires_at = trio.current_time() - 1  # the lifetime is over
        assert session.expired and not session.may_send(3, sasl_keys)
        assert session.may_send(17, sasl_keys)  # re-authentication is still served
        assert call(SASL_HANDSHAKE, {"mechanism": "PLAIN"})["error_code"] == 0
        assert call(SASL_AUTHENTICATE, {"auth_bytes": b"\0bob\0pw"})["error_code"] == 0
        assert not session.expired and session.may_send(3, sasl_keys)

    trio.run(scenario)


# -- Bootstrap users (raftlog format --add-scram) ----------------------------------------------

def test_bootstrap_users_apply_once_and_only_to_a_log_without_scram_changes(
        tmp_path: Any) -> None:
    from raftlog.controller.scram_bootstrap import (
        BootstrapError,
        parse_add_scram,
        read_bootstrap,
        write_bootstrap,
    )
    from raftlog.metadata.records import BootstrapScramUsers

    entries = [parse_add_scram("SCRAM-SHA-512=[name=admin,password=admin-pw]"),
               parse_add_scram("SCRAM-SHA-256=[name=admin,password=admin-pw,iterations=8192]"),
               parse_add_scram('SCRAM-SHA-256=[name=ops,password="ops-pw"]')]
    path = write_bootstrap(tmp_path, entries)
    assert path.stat().st_mode & 0o777 == 0o600
    assert "admin-pw" not in path.read_text()
    record = read_bootstrap(tmp_path)
    assert record is not None and [u.user for u in record.users] == ["admin", "ops"]
    assert read_bootstrap(tmp_path / "nothing") is None
    for bad in ("SCRAM-SHA-1=[name=a,password=b]", "SCRAM-SHA-256=[name=a]",
                "SCRAM-SHA-256=[name=a,password=b,iterations=100]",
                "SCRAM-SHA-256=[name=__raftlog-admin,password=b]",
                "SCRAM-SHA-256=[name=a,password=b,salt=c]"):
        with pytest.raises(BootstrapError):
            parse_add_scram(bad)

    fresh = MetadataStateMachine()
    assert fresh.apply(Command(record, 0, "b1"), 1).value == 2
    assert sorted(fresh.image.scram_users["admin"]) == [SHA256, SHA512]
    again = BootstrapScramUsers((AlterUserScram("late", (_credential(),), ()),))
    assert fresh.apply(Command(again, 0, "b2"), 2).value == 0  # a second bootstrap: no-op
    assert "late" not in fresh.image.scram_users
    # A cluster whose users were all deleted again never gets them back from a late file.
    used = MetadataStateMachine()
    _apply(used, AlterUserScram("x", (_credential(),), ()))
    _apply(used, AlterUserScram("x", (), (SHA256,)))
    assert used.image.scram_users == {} and used.image.scram_version == used.image.version
    assert used.apply(Command(record, 0, "b3"), used.image.version + 1).value == 0
    assert used.image.scram_users == {}
