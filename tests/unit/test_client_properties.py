"""Client properties for the tools' ``--command-config``: librdkafka's and Kafka's names give
the same settings, a Java JAAS line gives the login, bad values name the property; the TLS
contexts built from them (client and node-to-node) verify what they should."""

from __future__ import annotations

import dataclasses
import ssl
from pathlib import Path

import pytest

from raftlog.client.connection import ClusterLogin, UserLogin
from raftlog.client.tls import client_context, node_client_context
from raftlog.config import ConfigError, ServerConfig
from raftlog.config.client_properties import ClientTlsSettings, parse_client_properties
from raftlog.tools.command_config import security_of
from tests.integration.tls_certs import make_certs

SCRAM_JAAS = ('org.apache.kafka.common.security.scram.ScramLoginModule required'
              ' username="alice" password="a \\"quoted\\" secret";')


def test_librdkafka_and_java_names_agree() -> None:
    rdkafka = parse_client_properties({
        "security.protocol": "sasl_ssl", "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "alice", "sasl.password": 'a "quoted" secret',
        "ssl.ca.location": "/ca.pem", "ssl.certificate.location": "/c.pem",
        "ssl.key.location": "/k.pem", "ssl.key.password": "pw", "client.id": "ignored"})
    java = parse_client_properties({
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": SCRAM_JAAS, "ssl.truststore.location": "/ca.pem",
        "ssl.truststore.type": "PEM", "ssl.keystore.type": "PEM",
        "ssl.certificate.location": "/c.pem", "ssl.key.location": "/k.pem",
        "ssl.key.password": "pw"})
    assert rdkafka == java
    assert rdkafka.tls == ClientTlsSettings("/ca.pem", "/c.pem", "/k.pem", "pw")
    login = security_of(dataclasses.replace(rdkafka, tls=None)).login
    assert login == UserLogin("SCRAM-SHA-512", "alice", 'a "quoted" secret')


def test_plain_jaas_implies_the_mechanism_and_secret_means_the_admin() -> None:
    plain = parse_client_properties({
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule'
                            ' required username="bob" password="b";'})
    assert (plain.mechanism, plain.username, plain.password, plain.tls) == (
        "PLAIN", "bob", "b", None)
    admin = security_of(parse_client_properties({"raft.secret": "s"}))
    assert isinstance(admin.login, ClusterLogin) and admin.tls is None
    assert security_of(parse_client_properties({})).login is None


@pytest.mark.parametrize(("props", "name"), [
    ({"security.protocol": "TLS"}, "security.protocol"),
    ({"security.protocol": "SASL_SSL"}, "sasl.mechanism"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}, "sasl.username"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI", "sasl.username": "u",
      "sasl.password": "p"}, "sasl.mechanism"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
      "sasl.jaas.config": SCRAM_JAAS}, "sasl.jaas.config"),
    ({"sasl.jaas.config": "com.example.Login required;"}, "sasl.jaas.config"),
    ({"security.protocol": "SSL", "ssl.keystore.type": "JKS"}, "ssl.keystore.type"),
    ({"security.protocol": "SSL", "ssl.key.location": "/k"}, "ssl.key.location"),
    ({"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "x"},
     "ssl.endpoint.identification.algorithm"),
])
def test_bad_client_properties_name_the_property(props: dict[str, str], name: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_client_properties(props)
    assert caught.value.property_name == name


def test_contexts_verify_the_server_and_present_the_client_certificate(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    context = client_context(ClientTlsSettings(str(certs.ca), str(certs.client_cert),
                                               str(certs.client_key)))
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    unchecked = client_context(ClientTlsSettings(
        str(certs.ca), check_hostname=False, verify=False))
    assert unchecked.verify_mode == ssl.CERT_NONE
    with pytest.raises(ConfigError, match=r"ssl\.ca\.location"):
        client_context(ClientTlsSettings(str(tmp_path / "missing.pem")))
    config = ServerConfig.from_properties({
        "node.id": "1", "listeners": "SSL://127.0.0.1:9094,CONTROLLER://127.0.0.1:9093",
        "listener.security.protocol.map": "SSL:SSL,CONTROLLER:PLAINTEXT",
        "controller.quorum.voters": "1@127.0.0.1:9093,2@127.0.0.1:9193",
        "ssl.keystore.location": str(certs.server), "ssl.truststore.location": str(certs.ca),
        "listener.name.ssl.ssl.endpoint.identification.algorithm": "", "raft.secret": "s"})
    assert config.inter_broker_listener_name == "SSL"
    settings = config.tls_of("SSL")
    assert settings is not None and settings.endpoint_identification == ""
    node = node_client_context(settings)
    assert node.verify_mode == ssl.CERT_REQUIRED and not node.check_hostname
