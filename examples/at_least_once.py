"""At-least-once consumer: process a batch, *then* commit its offsets.

    python examples/at_least_once.py --bootstrap-server 127.0.0.1:9092 \
        --topic events --group alo --output processed.txt

If the process dies after processing part of a batch and before the commit, the restarted
consumer resumes from the last committed offset and processes those records again: records
may be processed twice, but none is lost. See examples/README.md.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import IO, Any

import consumer_loop


def main() -> int:
    from confluent_kafka import Consumer

    args = consumer_loop.parser("at-least-once consumer (process, then commit)").parse_args()

    def handle(consumer: Any, batch: Sequence[Any], out: IO[str]) -> None:
        # 1. Process. Killed here, the processed part of the batch comes back.
        for message in batch:
            consumer_loop.process(message, out, args.delay)
        # 2. Commit: the group's position moves past the whole batch.
        consumer_loop.commit(consumer, batch)

    consumer_loop.run(args, Consumer(consumer_loop.consumer_config(args)), handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
