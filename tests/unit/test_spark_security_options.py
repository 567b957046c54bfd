"""The Spark connector turns the Java security names Spark's Kafka source takes into
librdkafka's (pure: no Spark, no network)."""

from __future__ import annotations

import pytest

from spark_connector.errors import RaftLogOptionError
from spark_connector.options import parse_source_options
from spark_connector.security import librdkafka_properties

JAAS = ('org.apache.kafka.common.security.scram.ScramLoginModule required'
        ' username="alice" password="a\\"b";')


def test_java_security_options_become_librdkafka_properties() -> None:
    source = parse_source_options({
        "kafka.bootstrap.servers": "h:1", "subscribe": "t",
        "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": JAAS, "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": "/ca.pem", "kafka.ssl.keystore.type": "PEM",
        "kafka.ssl.keystore.location": "/me.pem", "kafka.ssl.key.password": "pw",
        "kafka.ssl.endpoint.identification.algorithm": ""})
    assert dict(source.client.extra) == {
        "security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "alice", "sasl.password": 'a"b', "ssl.ca.location": "/ca.pem",
        "ssl.certificate.location": "/me.pem", "ssl.key.location": "/me.pem",
        "ssl.key.password": "pw", "ssl.endpoint.identification.algorithm": "none"}


def test_librdkafka_names_pass_through_and_java_stores_are_refused() -> None:
    rdkafka = {"security.protocol": "SSL", "ssl.ca.location": "/ca.pem",
               "sasl.username": "u"}
    assert librdkafka_properties(rdkafka) == rdkafka
    p12 = {"ssl.keystore.type": "PKCS12", "ssl.keystore.location": "/k.p12",
           "ssl.keystore.password": "x"}
    assert librdkafka_properties(p12) == {"ssl.keystore.location": "/k.p12",
                                          "ssl.keystore.password": "x"}
    with pytest.raises(RaftLogOptionError, match="truststore"):
        librdkafka_properties({"ssl.truststore.location": "/t.jks"
                               , "ssl.truststore.type": "JKS"})
    with pytest.raises(RaftLogOptionError, match="keystore"):
        librdkafka_properties({"ssl.keystore.location": "/k.jks", "ssl.keystore.type": "JKS"})
    with pytest.raises(RaftLogOptionError, match="jaas"):
        librdkafka_properties({"sasl.jaas.config": "com.example.Krb5 required;"})
