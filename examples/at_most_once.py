"""At-most-once consumer: commit a batch's offsets *before* processing it.

    python examples/at_most_once.py --bootstrap-server 127.0.0.1:9092 \
        --topic events --group amo --output processed.txt

If the process dies after the commit and before the batch is fully processed, the rest of the
batch is never delivered again (the group's position is already past it): records may be
lost, but none is processed twice. See examples/README.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="at-most-once consumer (commit, then process)")
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
              "enable.auto.commit": False,        # we commit explicitly, before the work
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
                # 1. Commit: the group's position moves past the whole batch.
                last = {(m.topic(), m.partition()): m.offset() for m in batch}
                consumer.commit(offsets=[TopicPartition(t, p, o + 1)
                                         for (t, p), o in last.items()], asynchronous=False)
                # 2. Process. Killed here, the rest of the batch is lost.
                for m in batch:
                    process(m, out, args.delay)
    finally:
        consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
