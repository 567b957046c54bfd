"""The raftlog half of the benchmark: a real `python -m raftlog server` node driven by
confluent-kafka (librdkafka), with Kafka's default durability (acks=all is acked after fsync).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from _support import PhaseResult, ServerProcess, free_port, measure_cpu
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

TOPIC = "bench"
REPO_ROOT = Path(__file__).resolve().parent.parent
PRODUCE_TIMEOUT_S = 120.0
CONSUME_TIMEOUT_S = 120.0
CONSUME_BATCH = 10_000

PRODUCER_CONFIG: dict[str, Any] = {
    "acks": "all",
    "enable.idempotence": False,
    "linger.ms": 5,
    "batch.size": 1_000_000,
    "compression.type": "none",
    # Let the whole run sit in librdkafka's queue: we time first produce() -> flush() return.
    "queue.buffering.max.messages": 2_000_000,
    "queue.buffering.max.kbytes": 2_097_151,
    "delivery.report.only.error": True,
}
CONSUMER_CONFIG: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": False,
    "fetch.max.bytes": 64 * 1024 * 1024,
    "max.partition.fetch.bytes": 16 * 1024 * 1024,
    "receive.message.max.bytes": 64 * 1024 * 1024 + 4096,
    "queued.max.messages.kbytes": 512 * 1024,
    "fetch.wait.max.ms": 100,
}


class RaftlogNode:
    """One raftlog node with a fresh data directory under `workdir`. With ``ssl`` it also
    serves an SSL listener (throwaway CA and server certificate) and the clients use it."""

    def __init__(self, workdir: Path, ssl: bool = False) -> None:
        self.workdir = workdir
        self.system = "raftlog-ssl" if ssl else "raftlog"
        port = free_port()
        controller_port = free_port()
        ssl_port = free_port()
        # The SSL listener first: it is bound before the PLAINTEXT one the start-up waits for.
        tls_listener = f"SSL://127.0.0.1:{ssl_port}," if ssl else ""
        properties = {
            "node.id": "1",
            "process.roles": "broker,controller",
            "listeners": f"{tls_listener}PLAINTEXT://127.0.0.1:{port},"
                         f"CONTROLLER://127.0.0.1:{controller_port}",
            "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
            "controller.listener.names": "CONTROLLER",
            "log.dirs": str(workdir / "data"),
            "num.partitions": "1",
            "raft.secret": "bench-secret",
        }
        self.client_config: dict[str, Any] = {"bootstrap.servers": f"127.0.0.1:{port}"}
        if ssl:
            sys.path.insert(0, str(REPO_ROOT))
            from tests.integration.tls_certs import make_certs

            certs = make_certs(workdir / "certs")
            properties.update({
                "listener.security.protocol.map":
                    "SSL:SSL,PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                "ssl.keystore.location": str(certs.server)})
            self.client_config = {"bootstrap.servers": f"127.0.0.1:{ssl_port}",
                                  "security.protocol": "SSL",
                                  "ssl.ca.location": str(certs.ca)}
        config = workdir / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
        self.server = ServerProcess(
            "raftlog", [sys.executable, "-m", "raftlog", "--log-level", "WARNING", "server",
                        "--config", str(config)],
            port, workdir / "server.log", cwd=REPO_ROOT,
        )

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def start(self) -> float:
        return self.server.start()

    def stop(self) -> int | None:
        return self.server.stop()

    def create_topic(self, timeout_s: float = 20.0) -> None:
        """Create the 1-partition topic and wait until its leader shows in the metadata."""
        admin = AdminClient(self.client_config)
        admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(timeout=timeout_s)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            topic = admin.list_topics(TOPIC, timeout=5).topics.get(TOPIC)
            if topic is not None and topic.error is None and 0 in topic.partitions \
                    and topic.partitions[0].leader >= 0:
                return
            time.sleep(0.05)
        raise RuntimeError(f"topic {TOPIC!r} has no leader after {timeout_s} s")


def produce(node: RaftlogNode, repeat: int, records: int, payload: bytes) -> PhaseResult:
    """Produce `records` copies of `payload`; timed from the first produce() to flush()."""
    errors: list[str] = []

    def on_error(error: Any, _message: Any) -> None:
        if error is not None:
            errors.append(str(error))

    producer = Producer({**node.client_config, **PRODUCER_CONFIG,
                         "on_delivery": on_error})
    producer.list_topics(TOPIC, timeout=10)  # connect and learn the leader before the clock
    send = producer.produce
    poll = producer.poll
    buffer_full = 0
    with measure_cpu(node.server.pid) as meter:
        started = time.perf_counter()
        for i in range(records):
            while True:
                try:
                    send(TOPIC, payload)
                    break
                except BufferError:
                    buffer_full += 1
                    poll(0.01)
            if i & 4095 == 0:
                poll(0)
        enqueued = time.perf_counter() - started  # client-side cost of the produce() calls
        left = producer.flush(PRODUCE_TIMEOUT_S)
        seconds = time.perf_counter() - started
    assert meter.usage is not None
    ok = left == 0 and not errors
    note = "" if ok else f"{left} undelivered, {len(errors)} errors (first: " \
        f"{errors[0] if errors else '-'})"
    return PhaseResult(node.system, "produce", repeat, records - left - len(errors),
                       (records - left - len(errors)) * len(payload), seconds, meter.usage,
                       ok=ok, note=note, extra={"buffer_full_retries": buffer_full,
                              "enqueue_seconds": enqueued})


def consume(node: RaftlogNode, repeat: int, records: int, record_bytes: int) -> PhaseResult:
    """Read all `records` back from offset 0 with assign(); timed from assign() to the last."""
    consumer = Consumer({**node.client_config, "group.id": f"bench-{repeat}",
                         **CONSUMER_CONFIG})
    consumer.list_topics(TOPIC, timeout=10)
    count = 0
    payload_bytes = 0
    errors = 0
    last_offset = -1
    bad_size = 0
    try:
        with measure_cpu(node.server.pid) as meter:
            started = time.perf_counter()
            consumer.assign([TopicPartition(TOPIC, 0, 0)])
            deadline = time.monotonic() + CONSUME_TIMEOUT_S
            while count < records and time.monotonic() < deadline:
                for message in consumer.consume(num_messages=CONSUME_BATCH, timeout=1.0):
                    if message.error() is not None:
                        errors += 1
                        continue
                    size = len(message.value() or b"")
                    bad_size += size != record_bytes
                    payload_bytes += size
                    count += 1
                    last_offset = message.offset() or 0
            seconds = time.perf_counter() - started
    except KafkaException as exc:
        raise RuntimeError(f"raftlog consume failed: {exc}") from exc
    finally:
        consumer.close()
    assert meter.usage is not None
    ok = count == records and last_offset == records - 1 and bad_size == 0
    note = "" if ok else f"read {count}/{records}, last offset {last_offset}, " \
        f"{errors} errors, {bad_size} wrong sizes"
    return PhaseResult(node.system, "consume", repeat, count, payload_bytes, seconds,
                       meter.usage, ok=ok, note=note, extra={"errors": errors})
