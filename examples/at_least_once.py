"""At-least-once consumer: process a batch, *then* commit its offsets.

    python examples/at_least_once.py --bootstrap-server 127.0.0.1:9092 \
        --topic events --group alo --output processed.txt

If the process dies after processing part of a batch and before the commit, the restarted
consumer resumes from the last committed offset and processes those records again: records
may be processed twice, but none is lost. See examples/README.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="at-least-once consumer (process, then commit)")
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
    return parser.parse_args()


def process(message: Any, out: Any, delay: float) -> None:
    """The application's work: a slow append of the value to a file, one line per record."""
    time.sleep(delay)
    out.write(message.value().decode() + "\n")
    out.flush()  # now in the kernel: survives a SIGKILL of this process


def main() -> int:
    from confluent_kafka import Consumer, TopicPartition

    args = parse_args()
    config = {"bootstrap.servers": args.bootstrap_server, "group.id": args.group,
              "enable.auto.commit": False,        # we commit explicitly, after the work
              "auto.offset.reset": "earliest",    # a new group starts at the beginning
              "session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
    if args.instance_id:
        config["group.instance.id"] = args.instance_id
    consumer = Consumer(config)
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
                # 1. Process. Killed here, the processed part of the batch comes back.
                for m in batch:
                    process(m, out, args.delay)
                # 2. Commit: the group's position moves past the whole batch.
                last = {(m.topic(), m.partition()): m.offset() for m in batch}
                consumer.commit(offsets=[TopicPartition(t, p, o + 1)
                                         for (t, p), o in last.items()], asynchronous=False)
    finally:
        consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
