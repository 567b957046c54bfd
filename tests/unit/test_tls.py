"""TLS listeners: principal mapping rules (Kafka's SslPrincipalMapper), the ssl.* config, the
SSLContext built from it, the principal a real handshake yields, and file regions over TLS."""

from __future__ import annotations

import functools
import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from raftlog.config import ConfigError, ServerConfig
from raftlog.config.tls import TlsSettings
from raftlog.protocol.schemas import API_VERSIONS
from raftlog.security.principal import PrincipalMapper, PrincipalMappingError, subject_dn
from raftlog.server import tls as tls_module
from raftlog.server.listener import ListenerLimits, RequestContext, serve_listener
from raftlog.server.tls import build_server_context, build_tls_listener, send_copying
from tests.integration.tls_certs import Certs, make_certs

# --- ssl.principal.mapping.rules ----------------------------------------------------------------

# Kafka's own example (SslPrincipalMapperTest.testCommaWithWhitespace and friends).
KAFKA_RULES = ("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,"
               "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,"
               "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L,"
               "DEFAULT")


@pytest.mark.parametrize(("dn", "name"), [
    ("CN=Duke,OU=ServiceUsers,O=Org,C=US", "Duke"),
    ("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US", "duke@sme"),
    ("cn=duke,ou=sme,dc=mycp,dc=com", "duke"),
    ("cN=duke,OU=JavaSoft,O=Sun Microsystems", "duke"),
    ("OU=JavaSoft,O=Sun Microsystems,C=US", "OU=JavaSoft,O=Sun Microsystems,C=US"),
])
def test_kafka_example_rules(dn: str, name: str) -> None:
    assert PrincipalMapper(KAFKA_RULES).name_of(dn) == name


def test_default_keeps_the_dn_and_upper_case_flag() -> None:
    assert PrincipalMapper().name_of("CN=alice,OU=eng,O=acme") == "CN=alice,OU=eng,O=acme"
    assert PrincipalMapper("RULE:^CN=([^,]*),.*$/$1/U").name_of("CN=alice,O=acme") == "ALICE"


def test_first_matching_rule_wins_and_no_match_refuses() -> None:
    mapper = PrincipalMapper("RULE:^CN=(.*),O=acme$/acme-$1/, RULE:^CN=(.*)$/$1/")
    assert mapper.name_of("CN=bob,O=acme") == "acme-bob"
    assert mapper.name_of("CN=bob") == "bob"
    with pytest.raises(PrincipalMappingError, match="no rule"):
        mapper.name_of("O=acme")  # a pattern must match the whole DN


def test_escaped_slash_and_literal_replacement() -> None:
    mapper = PrincipalMapper(r"RULE:^CN=([^,]*),OU=a\/b$/team\/$1/")
    assert mapper.name_of("CN=carol,OU=a/b") == "team/carol"


@pytest.mark.parametrize("rules", ["", "NOPE", "RULE:abc", "RULE:a/b/X", "DEFAULT,garbage",
                                   "RULE:(/x/"])
def test_invalid_rules_are_refused(rules: str) -> None:
    with pytest.raises(PrincipalMappingError):
        PrincipalMapper(rules)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def test_subject_dn_is_rfc2253_most_specific_first(certs: Certs) -> None:
    der = ssl.PEM_cert_to_DER_cert(certs.client_cert.read_text())
    assert subject_dn(der) == "CN=alice,OU=eng,O=acme"


# --- ssl.* config -------------------------------------------------------------------------------

BASE = {"node.id": "1",
        "listeners": "SSL://127.0.0.1:9094,PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093",
        "listener.security.protocol.map": "SSL:SSL,PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "ssl.keystore.location": "/keys/server.pem"}


def test_ssl_listener_settings_and_per_listener_overrides(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    config = ServerConfig.from_properties({
        **BASE, "ssl.client.auth": "requested", "ssl.truststore.location": "/keys/ca.pem",
        "listener.name.ssl.ssl.client.auth": "required",
        "listener.name.ssl.ssl.enabled.protocols": "TLSv1.3",
        "ssl.cipher.suites": "ECDHE-ECDSA-AES128-GCM-SHA256",
        "ssl.principal.mapping.rules": "RULE:^CN=(.*?),.*$/$1/L,DEFAULT"})
    settings = config.tls_of("SSL")
    assert settings is not None and config.tls_of("PLAINTEXT") is None
    assert settings.client_auth == "required" and settings.protocols == ("TLSv1.3",)
    assert settings.keystore_location == "/keys/server.pem"
    assert settings.cipher_suites == ("ECDHE-ECDSA-AES128-GCM-SHA256",)
    assert config.protocol_of("SSL") == "SSL" and config.protocol_of("PLAINTEXT") == "PLAINTEXT"
    # Node-to-node traffic stays on PLAINTEXT even though SSL is listed first.
    assert config.inter_broker_listener_name == "PLAINTEXT"
    assert "unknown property" not in caplog.text


@pytest.mark.parametrize(("extra", "property_name", "words"), [
    ({"ssl.keystore.type": "JKS"}, "ssl.keystore.type", "PEM only"),
    ({"listener.name.ssl.ssl.truststore.type": "PKCS12"},
     "listener.name.ssl.ssl.truststore.type", "PEM only"),
    ({"ssl.keystore.location": ""}, "ssl.keystore.location", "needs its key"),
    ({"ssl.keystore.certificate.chain": "x", "ssl.keystore.key": "y"},
     "ssl.keystore.location", "not both"),
    ({"ssl.client.auth": "required"}, "ssl.client.auth", "truststore"),
    ({"ssl.client.auth": "sometimes"}, "ssl.client.auth", "none, requested or required"),
    ({"ssl.enabled.protocols": "TLSv1.1"}, "ssl.enabled.protocols", "TLSv1.2"),
    ({"ssl.principal.mapping.rules": "RULE:x"}, "ssl.principal.mapping.rules", "invalid"),
    ({"listener.security.protocol.map": "SSL:SSL,PLAINTEXT:PLAINTEXT,"
                                        "CONTROLLER:SASL_SSL"},
     "listener.security.protocol.map", "Raft transport"),
    ({"listener.security.protocol.map": "SSL:TLS,PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"},
     "listener.security.protocol.map", "no security protocol"),
    ({"listener.security.protocol.map": "SSL:SSL,PLAINTEXT:PLAINTEXT,CONTROLLER:SSL"},
     "listener.security.protocol.map", "Raft transport"),
    ({"inter.broker.listener.name": "SSL", "security.inter.broker.protocol": "SSL"},
     "security.inter.broker.protocol", "not both"),
    ({"security.inter.broker.protocol": "SASL_SSL"},
     "security.inter.broker.protocol", "no advertised listener"),
    ({"ssl.endpoint.identification.algorithm": "dns"},
     "ssl.endpoint.identification.algorithm", "https"),
])
def test_bad_tls_config_names_the_property(extra: dict[str, str], property_name: str,
                                           words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        ServerConfig.from_properties({**BASE, **extra})
    assert caught.value.property_name == property_name
    assert words in str(caught.value)


def test_single_node_may_serve_only_ssl() -> None:
    config = ServerConfig.from_properties({
        "node.id": "1", "listeners": "SSL://127.0.0.1:9094,CONTROLLER://127.0.0.1:9093",
        "listener.security.protocol.map": "SSL:SSL,CONTROLLER:PLAINTEXT",
        "ssl.keystore.location": "/k.pem"})
    assert config.inter_broker_listener_name == "SSL"


def test_context_from_files_inline_pem_and_a_wrong_password(tmp_path: Path) -> None:
    certs = make_certs(tmp_path, b"pw")
    context = build_server_context(TlsSettings(
        "SSL", keystore_location=str(certs.server), key_password="pw",
        truststore_location=str(certs.ca), client_auth="required", protocols=("TLSv1.3",)))
    assert context.verify_mode is ssl.CERT_REQUIRED
    assert context.minimum_version is ssl.TLSVersion.TLSv1_3
    inline = build_server_context(TlsSettings(
        "SSL", keystore_chain=certs.server_cert.read_text(),
        keystore_key=certs.server_key.read_text(), key_password="pw",
        truststore_certificates=certs.ca.read_text(), client_auth="requested"))
    assert inline.verify_mode is ssl.CERT_OPTIONAL
    with pytest.raises(ConfigError, match=r"ssl\.key\.password"):
        build_server_context(TlsSettings("SSL", keystore_location=str(certs.server),
                                         key_password="wrong"))
    with pytest.raises(ConfigError, match=r"ssl\.truststore\.location"):
        build_server_context(TlsSettings("SSL", keystore_location=str(certs.server),
                                         key_password="pw",
                                         truststore_location=str(tmp_path / "missing.pem")))


# --- a real handshake: the session's principal ------------------------------------------------


@pytest.mark.parametrize(("rules", "principal"), [
    ("DEFAULT", "User:CN=alice,OU=eng,O=acme"),
    ("RULE:^CN=([^,]*),.*$/$1/U", "User:ALICE"),
])
async def test_client_certificate_becomes_the_session_principal(
        certs: Certs, rules: str, principal: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="raftlog.server.listener")
    tls = build_tls_listener(TlsSettings(
        "SSL", keystore_location=str(certs.server), truststore_location=str(certs.ca),
        client_auth="required", principal_rules=rules))
    seen: list[str] = []

    def api_versions(ctx: RequestContext) -> dict[str, object]:
        seen.append(f"{ctx.session.principal}@{ctx.session.listener}")
        return {"error_code": 0, "api_keys": [], "throttle_time_ms": 0}

    limits = ListenerLimits(request_bytes_max=1 << 20, idle_ms_max=10_000)
    client = ssl.create_default_context(cafile=str(certs.ca))
    client.load_cert_chain(str(certs.client_cert), str(certs.client_key))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(functools.partial(
            serve_listener, "127.0.0.1", 0, {API_VERSIONS.key: api_versions}, limits, None,
            listener="SSL", tls=tls))
        stream = await trio.open_ssl_over_tcp_stream("127.0.0.1", port, ssl_context=client,
                                                     https_compatible=True)
        with trio.fail_after(10):
            # ApiVersions v0, correlation 7, client id "t".
            frame = b"\x00\x12\x00\x00\x00\x00\x00\x07\x00\x01t"
            await stream.send_all(len(frame).to_bytes(4, "big") + frame)
            answer = await stream.receive_some(64)
        await stream.aclose()
        nursery.cancel_scope.cancel()
    assert answer[4:8] == b"\x00\x00\x00\x07"
    assert seen == [f"{principal}@SSL"]
    assert f"authenticated by its certificate as {principal}" in caplog.text


async def test_a_handshake_that_never_comes_is_timed_out(
        certs: Certs, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(tls_module, "HANDSHAKE_TIMEOUT_S", 0.2)
    tls = build_tls_listener(TlsSettings("SSL", keystore_location=str(certs.server)))
    limits = ListenerLimits(request_bytes_max=1 << 20, idle_ms_max=10_000)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(functools.partial(
            serve_listener, "127.0.0.1", 0, {}, limits, None, listener="SSL", tls=tls))
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        with trio.fail_after(5):
            assert await stream.receive_some(10) == b""  # closed by the server
        await stream.aclose()
        nursery.cancel_scope.cancel()
    assert "no handshake within 0.2 s" in caplog.text


# --- file regions over TLS ----------------------------------------------------------------------


@dataclass
class _Region:
    fd: int
    position: int
    size_bytes: int


class _Recorder(trio.abc.SendStream):
    def __init__(self) -> None:
        self.sends: list[bytes] = []

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.sends.append(bytes(data))

    async def wait_send_all_might_not_block(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


async def test_regions_are_copied_through_one_bounded_buffer(tmp_path: Path) -> None:
    data = os.urandom(tls_module.COPY_BUFFER_BYTES * 2 + 12345)
    path = tmp_path / "segment.log"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        recorder = _Recorder()
        head, tail = b"h" * 1000, memoryview(b"t" * (tls_module.COPY_BUFFER_BYTES + 7))
        await send_copying(recorder, [head, _Region(fd, 100, len(data) - 200), b"mid",
                                      _Region(fd, 0, 50), tail])
        sent = b"".join(recorder.sends)
        assert sent == head + data[100:-100] + b"mid" + data[:50] + bytes(tail)
        assert max(len(s) for s in recorder.sends) == tls_module.COPY_BUFFER_BYTES
        assert len(recorder.sends) == -(-len(sent) // tls_module.COPY_BUFFER_BYTES)
        with pytest.raises(EOFError):  # a region past the end of its file (truncated segment)
            await send_copying(recorder, [_Region(fd, len(data) - 10, 20)])
    finally:
        os.close(fd)


def test_registration_names_the_inter_broker_listener_protocol() -> None:
    from typing import Any, cast

    from raftlog.broker.lifecycle import BrokerLifecycle

    def registered(properties: dict[str, str]) -> dict[str, Any]:
        config = ServerConfig.from_properties(properties)
        lifecycle = BrokerLifecycle(config, cast(Any, None), cast(Any, None),
                                    advertised=("127.0.0.1", 9094))
        listener: dict[str, Any] = lifecycle._registration_body()["listeners"][0]
        return listener

    only_ssl = registered({
        "node.id": "1", "listeners": "SSL://127.0.0.1:9094,CONTROLLER://127.0.0.1:9093",
        "listener.security.protocol.map": "SSL:SSL,CONTROLLER:PLAINTEXT",
        "ssl.keystore.location": "/k.pem"})
    assert (only_ssl["name"], only_ssl["security_protocol"]) == ("SSL", 1)
    both = registered(BASE)
    assert (both["name"], both["security_protocol"]) == ("PLAINTEXT", 0)
