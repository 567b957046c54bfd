"""What the delivery-semantics examples share: their options, the consumer configuration,
the "work" done per record and the batch loop. Each example (at_most_once.py,
at_least_once.py, exactly_once.py) only decides what happens to a batch, and in which order.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import IO, Any

# One batch of records → what the example does with it (commit and process, in its order).
BatchHandler = Callable[[Any, Sequence[Any], IO[str]], None]


def parser(description: str) -> argparse.ArgumentParser:
    """The options every example takes (an example may add its own)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--bootstrap-server", default="127.0.0.1:9092")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--output", required=True, help="file the processed values go to")
    parser.add_argument("--batch", type=int, default=20, help="records per poll and commit")
    parser.add_argument("--delay", type=float, default=0.005, help="seconds of work per record")
    parser.add_argument("--idle-exit", type=float, default=3.0,
                        help="exit after this long with partitions assigned but no record")
    parser.add_argument("--instance-id", help="group.instance.id (static membership): a "
                        "restarted consumer takes its old place without a rebalance")
    return parser


def consumer_config(args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "bootstrap.servers": args.bootstrap_server, "group.id": args.group,
        "enable.auto.commit": False,        # every example commits explicitly
        "auto.offset.reset": "earliest",    # a new group starts at the beginning
        "session.timeout.ms": 6000, "heartbeat.interval.ms": 500, **extra}
    if args.instance_id:
        config["group.instance.id"] = args.instance_id
    return config


def process(message: Any, out: IO[str], delay: float) -> None:
    """The application's work: a slow append of the value to a file, one line per record."""
    if delay > 0:
        time.sleep(delay)
    out.write(message.value().decode() + "\n")
    out.flush()  # now in the kernel: survives a SIGKILL of this process


def next_offsets(batch: Sequence[Any]) -> list[Any]:
    """The positions after ``batch``, one per partition: what a commit for it stores."""
    from confluent_kafka import TopicPartition

    last = {(m.topic(), m.partition()): m.offset() for m in batch}
    return [TopicPartition(t, p, o + 1) for (t, p), o in last.items()]


def commit(consumer: Any, batch: Sequence[Any]) -> None:
    """A synchronous commit: when it returns, the group's position is past ``batch``."""
    consumer.commit(offsets=next_offsets(batch), asynchronous=False)


def run(args: argparse.Namespace, consumer: Any, handle: BatchHandler) -> None:
    """Consumes ``args.topic`` in batches and hands each to ``handle`` until the topic has
    been idle for ``args.idle_exit`` seconds (while partitions are assigned)."""
    consumer.subscribe([args.topic])
    idle_since = time.monotonic()
    try:
        with open(args.output, "a") as out:
            while time.monotonic() - idle_since < args.idle_exit:
                batch = [m for m in consumer.consume(args.batch, timeout=0.5) if not m.error()]
                if not batch:
                    if not consumer.assignment():
                        idle_since = time.monotonic()  # still joining the group
                    continue
                idle_since = time.monotonic()
                handle(consumer, batch, out)
    finally:
        consumer.close()
