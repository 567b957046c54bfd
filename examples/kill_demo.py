"""Kill a consumer midway and count how often each record was processed.

    python examples/kill_demo.py [--records 2000]

Starts a local raftlog node (``raftlog.tools.demo.LocalNode``), produces N records, then for each
strategy (at_most_once.py, at_least_once.py, exactly_once.py) runs the example as a
subprocess, SIGKILLs it once part of the records are processed, restarts it until it has
drained the topic, and prints how many records were processed 0, 1 and 2+ times (for
exactly-once: how many times each input's result is in the output topic, read_committed).
See examples/README.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent
STRATEGIES = {"at-most-once": EXAMPLES / "at_most_once.py",
              "at-least-once": EXAMPLES / "at_least_once.py",
              "exactly-once": EXAMPLES / "exactly_once.py"}
PARTITIONS = 3
RUN_TIMEOUT_S = 60.0


@dataclass
class Outcome:
    """How often each produced record was processed by one strategy."""

    strategy: str
    records: int
    killed_after: int            # lines in the output when the SIGKILL was sent
    times: Counter[str]          # value -> number of times processed
    # exactly-once only: value -> processing attempts (the side-effect file, outside Kafka)
    attempts: Counter[str] | None = None

    @property
    def never(self) -> int:
        return self.records - len(self.times)

    @property
    def once(self) -> int:
        return sum(1 for n in self.times.values() if n == 1)

    @property
    def more(self) -> int:
        return sum(1 for n in self.times.values() if n >= 2)

    def summary(self) -> str:
        line = (f"{self.strategy:<14} killed after {self.killed_after:>5} lines; processed "
                f"0 times: {self.never:>5}   1 time: {self.once:>5}   2+ times: {self.more:>5}")
        if self.attempts is not None:
            repeated = sum(1 for n in self.attempts.values() if n >= 2)
            line += f"   (results in the output topic; {repeated} inputs were attempted twice)"
        return line


def value(i: int) -> str:
    return f"rec-{i:06d}"


def create_and_produce(bootstrap: str, topic: str, records: int) -> None:
    from confluent_kafka import Producer

    _create_topic(bootstrap, topic)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(records):
        producer.produce(topic, value(i).encode(), key=str(i).encode())
        producer.poll(0)
    if producer.flush(30):
        raise RuntimeError("some records were not delivered")


def read_committed_values(bootstrap: str, topic: str, timeout_s: float = 60.0) -> list[str]:
    """Every value of ``topic`` a read_committed consumer sees (aborted records never)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "kill-demo-reader",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "enable.partition.eof": True})
    values: list[str] = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(at_end) < PARTITIONS:
            if time.monotonic() > deadline:
                raise RuntimeError(f"could not read {topic} to its end")
            for message in consumer.consume(1000, timeout=0.5):
                error = message.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(f"reading {topic}: {error}")
                    at_end.add(int(message.partition() or 0))
                    continue
                at_end.discard(int(message.partition() or 0))
                values.append((message.value() or b"").decode())
    finally:
        consumer.close()
    return values


def _create_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(timeout=15)


def _lines(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def run_strategy(bootstrap: str, topic: str, strategy: str, records: int, workdir: Path,
                 *, kill_fraction: float = 0.4, batch: int = 20, delay: float = 0.005,
                 idle_exit: float = 2.0) -> Outcome:
    """Runs one example, SIGKILLs it once about ``kill_fraction`` of the records are processed,
    restarts it (same group, same ``group.instance.id``) and waits until it drains."""
    group = f"{strategy}-{uuid.uuid4().hex[:6]}"
    output = workdir / f"{group}.txt"
    command = [sys.executable, str(STRATEGIES[strategy]), "--bootstrap-server", bootstrap,
               "--topic", topic, "--group", group, "--output", str(output),
               "--batch", str(batch), "--delay", str(delay), "--idle-exit", str(idle_exit),
               "--instance-id", f"{group}-consumer"]
    results_topic = f"{topic}-{group}-results"
    if strategy == "exactly-once":
        _create_topic(bootstrap, results_topic)
        command += ["--output-topic", results_topic]
    # Kill in the middle of a batch (between its commit and its last record's processing).
    kill_at = int(records * kill_fraction) // batch * batch + batch // 2
    first = subprocess.Popen(command)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while _lines(output) < kill_at:
            if first.poll() is not None:
                raise RuntimeError(f"{strategy} exited (code {first.returncode}) before the kill")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{strategy} processed only {_lines(output)} records")
            time.sleep(0.001)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    killed_after = _lines(output)
    subprocess.run(command, timeout=RUN_TIMEOUT_S, check=True)
    attempts = Counter(line for line in output.read_text().splitlines() if line)
    if strategy != "exactly-once":
        return Outcome(strategy, records, killed_after, attempts)
    results = Counter(v.removeprefix("result-")
                      for v in read_committed_values(bootstrap, results_topic))
    return Outcome(strategy, records, killed_after, results, attempts)


def demo(bootstrap: str, records: int, workdir: Path) -> list[Outcome]:
    """Produces ``records`` to a new topic, then runs and kills each strategy in turn."""
    topic = f"kill-demo-{uuid.uuid4().hex[:6]}"
    create_and_produce(bootstrap, topic, records)
    return [run_strategy(bootstrap, topic, name, records, workdir) for name in STRATEGIES]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2000)
    args = parser.parse_args()
    sys.path.insert(0, str(EXAMPLES.parent))  # run from a checkout without installing
    from raftlog.tools.demo import LocalNode

    with tempfile.TemporaryDirectory(prefix="raftlog-kill-demo-") as tmp:
        node = LocalNode(Path(tmp))
        print(f"starting a raftlog node on {node.bootstrap} ...")
        node.start()
        try:
            print(f"producing {args.records} records; each consumer is SIGKILLed midway "
                  "and restarted")
            for outcome in demo(node.bootstrap, args.records, Path(tmp)):
                print(outcome.summary())
        finally:
            node.stop()
    print("at-most-once may lose records but never repeats one; at-least-once may repeat "
          "records but never loses one; exactly-once puts each result in the output topic "
          "once (its side effects outside Kafka are still at-least-once).")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
