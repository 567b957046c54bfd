"""The Spark source on a SASL_SSL listener with the options Spark's Kafka source takes
(Java's names: ``kafka.security.protocol``, ``kafka.sasl.mechanism``,
``kafka.sasl.jaas.config``, ``kafka.ssl.truststore.location``/``type``), turned into
librdkafka's by the connector. One node, one short batch read."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

pytest.importorskip("pyspark", reason="the Spark connector tests need pyspark (the [spark] extra)")

from pyspark.sql import SparkSession

from tests.integration.conftest import BrokerProcess, free_port
from tests.integration.spark_support import create_topic, produce, spark_session
from tests.integration.tls_certs import Certs, make_certs

SCRAM_JAAS = ('org.apache.kafka.common.security.scram.ScramLoginModule required'
              ' username="alice" password="alice-secret";')


@pytest.fixture(scope="session")
def spark() -> SparkSession:
    return spark_session()


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, int,
                                                                        Certs]]:
    workdir = tmp_path_factory.mktemp("spark-sasl-ssl")
    certs = make_certs(workdir / "certs")
    process = BrokerProcess(workdir)
    secure_port = free_port()
    process.extra_properties = {
        "listeners": f"PLAINTEXT://127.0.0.1:{process.port},SASL_SSL://127.0.0.1:{secure_port},"
                     f"CONTROLLER://127.0.0.1:{process.controller_port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,"
                                          "CONTROLLER:PLAINTEXT",
        "ssl.keystore.location": str(certs.server), "ssl.truststore.location": str(certs.ca)}
    formatted = subprocess.run(
        [sys.executable, "-m", "raftlog", "format", "--config", str(process.write_config()),
         "--add-scram", "SCRAM-SHA-512=[name=alice,password=alice-secret]"],
        capture_output=True, text=True, timeout=60, check=False, cwd=workdir)
    assert formatted.returncode == 0, formatted.stderr
    process.start()
    try:
        yield process, secure_port, certs
    finally:
        process.stop()


def test_batch_read_over_sasl_ssl_with_java_option_names(
        spark: SparkSession, secured: tuple[BrokerProcess, int, Certs]) -> None:
    broker, secure_port, certs = secured
    create_topic(broker.bootstrap, "secured", 2)
    produce(broker.bootstrap, "secured", ({"value": f"v{i}".encode()} for i in range(50)))
    rows = (spark.read.format("raftlog")
            .option("kafka.bootstrap.servers", f"127.0.0.1:{secure_port}")
            .option("kafka.security.protocol", "SASL_SSL")
            .option("kafka.sasl.mechanism", "SCRAM-SHA-512")
            .option("kafka.sasl.jaas.config", SCRAM_JAAS)
            .option("kafka.ssl.truststore.type", "PEM")
            .option("kafka.ssl.truststore.location", str(certs.ca))
            .option("subscribe", "secured").option("startingOffsets", "earliest")
            .load().selectExpr("CAST(value AS STRING) AS value").collect())
    assert sorted(r.value for r in rows) == sorted(f"v{i}" for i in range(50))
