"""The SCRAM core and the session's SASL state machine (raftlog.security)."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftlog.security.authorizer import ClusterAuthorizer
from raftlog.security.scram import ScramClient, ScramCredential, ScramError, ScramServer
from raftlog.security.session import (
    ADMIN_USER,
    BROKER_EPOCH_EXTENSION,
    CLUSTER_MECHANISM,
    ClusterCredentials,
    Operation,
    ResourceType,
    SaslState,
    Session,
    broker_user,
)

SECRET = "a-cluster-secret"


def _exchange(server: ScramServer, client: ScramClient) -> bytes:
    server_first = server.first(client.first())
    server_final = server.final(client.final(server_first))
    client.verify(server_final)
    return server_final


def test_rfc7677_example_proof() -> None:
    """RFC 7677's SCRAM-SHA-256 example: user 'user', password 'pencil'."""
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    credential = ScramCredential.from_password("SCRAM-SHA-256", b"pencil", salt, 4096)
    client = ScramClient("SCRAM-SHA-256", "user", b"pencil")
    client._nonce = "rOprNGfwEbeRWgbNEkqO"
    assert client.first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    server_first = (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    final = client.final(server_first)
    assert final == (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                     b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    client.verify(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
    assert credential.iterations == 4096


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_round_trip_and_wrong_password(mechanism: str) -> None:
    credential = ScramCredential.from_password(mechanism, b"right", b"salt-salt-salt!!")

    def lookup(m: str, user: str) -> ScramCredential | None:
        return credential if (m, user) == (mechanism, "alice") else None

    server = ScramServer(mechanism, lookup, b"decoy")
    _exchange(server, ScramClient(mechanism, "alice", b"right"))
    with pytest.raises(ScramError, match="invalid credentials"):
        _exchange(ScramServer(mechanism, lookup, b"decoy"),
                  ScramClient(mechanism, "alice", b"wrong"))


def test_unknown_user_fails_like_a_wrong_password() -> None:
    """No user enumeration: a server-first message for an unknown user, same error at the
    same step, and the same salt every time for the same name."""
    def lookup(m: str, user: str) -> ScramCredential | None:
        return None

    firsts = []
    for _ in range(2):
        server = ScramServer("SCRAM-SHA-256", lookup, b"decoy")
        client = ScramClient("SCRAM-SHA-256", "mallory", b"guess")
        first = server.first(client.first())
        firsts.append(first.split(b",s=")[1])
        with pytest.raises(ScramError, match="invalid credentials"):
            server.final(client.final(first))
    assert firsts[0] == firsts[1]


def test_server_nonce_extends_the_clients_and_replay_fails() -> None:
    credentials = ClusterCredentials(SECRET)
    server = ScramServer(CLUSTER_MECHANISM, credentials.lookup, b"d")
    client = credentials.client(ADMIN_USER)
    first = server.first(client.first())
    assert first.startswith(b"r=" + client._nonce.encode())
    proof = client.final(first)
    server.final(proof)
    # The same proof against a new exchange (a new server nonce) fails.
    replay = ScramServer(CLUSTER_MECHANISM, credentials.lookup, b"d")
    replay.first(client.first())
    with pytest.raises(ScramError, match="nonce"):
        replay.final(proof)


def test_client_refuses_a_server_without_the_secret() -> None:
    impostor = ClusterCredentials("not-the-secret")
    server = ScramServer(CLUSTER_MECHANISM, impostor.lookup, b"d")
    client = ClusterCredentials(SECRET).client(ADMIN_USER)
    with pytest.raises(ScramError):
        _exchange(server, client)


def test_client_refuses_few_iterations() -> None:
    client = ScramClient("SCRAM-SHA-256", "u", b"p")
    client.first()
    with pytest.raises(ScramError, match="iterations"):
        client.final(f"r={client._nonce}x,s=c2FsdA==,i=1".encode())


@given(st.binary(max_size=300))
def test_garbage_never_raises_anything_but_scram_error(data: bytes) -> None:
    server = ScramServer(CLUSTER_MECHANISM, ClusterCredentials(SECRET).lookup, b"d")
    try:
        server.first(data)
        server.final(data)
    except ScramError:
        pass


def test_session_becomes_the_broker_with_its_epoch() -> None:
    credentials = ClusterCredentials(SECRET)
    session = Session("127.0.0.1:1")
    authorizer = ClusterAuthorizer()
    assert not authorizer.authorize(session, Operation.CLUSTER_ACTION, ResourceType.CLUSTER)
    assert session.handshake(CLUSTER_MECHANISM, credentials) == 0
    assert session.frame_bytes_max == 512 * 1024
    client = credentials.client(broker_user(3), {BROKER_EPOCH_EXTENSION: "42"})
    error, first, _ = session.authenticate(client.first())
    assert error == 0
    error, final, _ = session.authenticate(client.final(first))
    assert error == 0
    client.verify(final)
    assert session.authenticated and session.broker_id == 3 and session.broker_epoch == 42
    assert authorizer.authorize(session, Operation.CLUSTER_ACTION, ResourceType.CLUSTER)
    assert session.handshake(CLUSTER_MECHANISM, credentials) == 34  # ILLEGAL_SASL_STATE


def test_session_failed_authentication_allows_nothing_more() -> None:
    credentials = ClusterCredentials(SECRET)
    session = Session("127.0.0.1:1")
    assert session.handshake("PLAIN", credentials) == 33  # UNSUPPORTED_SASL_MECHANISM
    assert session.handshake(CLUSTER_MECHANISM, credentials) == 0
    assert not session.may_send(0, frozenset({17, 36}))  # nothing but SASL mid-exchange
    client = ClusterCredentials("wrong").client(ADMIN_USER)
    error, first, _ = session.authenticate(client.first())
    error, _, message = session.authenticate(client.final(first))
    assert error == 58 and message is not None
    assert session.sasl_state is SaslState.FAILED and not session.may_send(18, frozenset())
    assert session.principal.name == "ANONYMOUS"


def test_cluster_credentials_cost_one_derivation_whatever_the_user() -> None:
    """A stranger naming ever new broker ids must not make a node derive or keep anything new
    (each derivation is 4096 PBKDF2 rounds)."""
    credentials = ClusterCredentials(SECRET)
    first = credentials.lookup(CLUSTER_MECHANISM, broker_user(1))
    assert first is not None
    for node_id in range(2, 200):
        assert credentials.lookup(CLUSTER_MECHANISM, broker_user(node_id)) is first
    assert credentials.lookup(CLUSTER_MECHANISM, ADMIN_USER) is first
    assert credentials.lookup(CLUSTER_MECHANISM, "alice") is None
    assert credentials.lookup("SCRAM-SHA-512", ADMIN_USER) is None


def test_sasl_error_codes_are_kafkas() -> None:
    from raftlog.protocol.errors import ErrorCode
    from raftlog.security import session

    for name in ("UNSUPPORTED_SASL_MECHANISM", "ILLEGAL_SASL_STATE", "SASL_AUTHENTICATION_FAILED"):
        assert getattr(session, name) == ErrorCode[name]


def test_no_secret_no_mechanism() -> None:
    assert Session("p").handshake(CLUSTER_MECHANISM, None) == 33
