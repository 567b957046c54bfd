"""`raftlog demo`: start a local node, create a topic, stream page views through it with the
unchanged confluent-kafka client, read them back, restart the node, check nothing was lost,
and stop cleanly: a single-node smoke test that needs neither Spark nor Java. The README's main
command, `make demo`, is the 3-node Spark pipeline in spark_connector/demo.py.
"""

from __future__ import annotations

import json
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

PAGES = ["/", "/pricing", "/docs", "/blog", "/signup", "/login", "/docs/quickstart", "/about"]
TOPIC = "pageviews"
PARTITIONS = 3
START_TIMEOUT_S = 20.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class LocalNode:
    """A `raftlog server` child process on loopback with a temporary data directory."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = _free_port()
        controller_port = _free_port()
        self.config = workdir / "server.properties"
        self.config.write_text(
            "node.id=1\nprocess.roles=broker,controller\n"
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{controller_port}\n"
            f"controller.quorum.voters=1@127.0.0.1:{controller_port}\n"
            "controller.listener.names=CONTROLLER\n"
            f"log.dirs={workdir / 'data'}\nraft.secret=demo-secret\n"
        )
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> float:
        started = time.monotonic()
        log = (self.workdir / "server.log").open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "raftlog", "server", "--config", str(self.config)],
            stdout=log, stderr=subprocess.STDOUT,
        )
        while time.monotonic() - started < START_TIMEOUT_S:
            if self.process.poll() is not None:
                raise RuntimeError("the node exited; see " + str(self.workdir / "server.log"))
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return time.monotonic() - started
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("the node did not start in time")

    def stop(self) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=15)


def _event(rng: random.Random, now_ms: int) -> tuple[bytes, bytes]:
    user = f"user-{rng.randrange(500)}"
    page = rng.choices(PAGES, weights=[30, 8, 20, 10, 5, 12, 10, 5])[0]
    event = {"user": user, "page": page, "ts": now_ms}
    return user.encode(), json.dumps(event).encode()


def _produce(bootstrap: str, count: int) -> tuple[float, Counter[str]]:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                         "enable.idempotence": False})
    rng = random.Random(42)
    pages: Counter[str] = Counter()
    failures: list[Any] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(error)

    started = time.monotonic()
    for _ in range(count):
        key, value = _event(rng, int(time.time() * 1000))
        pages[json.loads(value)["page"]] += 1
        producer.produce(TOPIC, value, key, on_delivery=delivered)
        producer.poll(0)
    producer.flush(30)
    if failures:
        raise RuntimeError(f"{len(failures)} deliveries failed: {failures[0]}")
    return time.monotonic() - started, pages


def _consume(bootstrap: str, expected: int) -> tuple[float, Counter[int], Counter[str]]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "demo",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    per_partition: Counter[int] = Counter()
    pages: Counter[str] = Counter()
    started = time.monotonic()
    deadline = started + 60
    while sum(per_partition.values()) < expected and time.monotonic() < deadline:
        for message in consumer.consume(1000, timeout=1.0):
            if message.error():
                continue
            per_partition[message.partition() or 0] += 1
            pages[json.loads(message.value() or b"{}")["page"]] += 1
    consumer.close()
    return time.monotonic() - started, per_partition, pages


def _create_topic(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])
    futures[TOPIC].result(timeout=15)


def run_demo(records: int) -> int:
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        print("the demo drives raftlog with confluent-kafka: pip install confluent-kafka")
        return 2
    with tempfile.TemporaryDirectory(prefix="raftlog-demo-") as tmp:
        node = LocalNode(Path(tmp))
        print(f"starting a raftlog node on {node.bootstrap} (data in {tmp}) ...")
        print(f"  node ready in {node.start():.2f} s")
        _create_topic(node.bootstrap)
        print(f"created topic '{TOPIC}' with {PARTITIONS} partitions")
        seconds, produced_pages = _produce(node.bootstrap, records)
        print(f"produced {records} page views with confluent-kafka (acks=all, fsynced) in "
              f"{seconds:.2f} s: {records / seconds:,.0f} records/s")
        seconds, per_partition, pages = _consume(node.bootstrap, records)
        print(f"consumed {sum(per_partition.values())} records in {seconds:.2f} s; per partition:"
              f" {dict(sorted(per_partition.items()))}")
        print("top pages:")
        for page, views in pages.most_common(5):
            print(f"  {page:<20} {views:>6}")
        assert pages == produced_pages, "consumed counts differ from produced counts"
        print("restarting the node to show the log survives ...")
        node.stop()
        node.start()
        _, after_restart, _ = _consume(node.bootstrap, records)
        print(f"after restart: {sum(after_restart.values())} records still there")
        code = node.stop()
        print(f"node stopped cleanly (exit code {code})")
        ok = sum(after_restart.values()) == records and code == 0
        print("demo OK" if ok else "demo FAILED")
        return 0 if ok else 1
