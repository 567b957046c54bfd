"""At-most-once consumer: commit a batch's offsets *before* processing it.

    python examples/at_most_once.py --bootstrap-server 127.0.0.1:9092 \
        --topic events --group amo --output processed.txt

If the process dies after the commit and before the batch is fully processed, the rest of the
batch is never delivered again (the group's position is already past it): records may be
lost, but none is processed twice. See examples/README.md.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import IO, Any

import consumer_loop


def main() -> int:
    from confluent_kafka import Consumer

    args = consumer_loop.parser("at-most-once consumer (commit, then process)").parse_args()

    def handle(consumer: Any, batch: Sequence[Any], out: IO[str]) -> None:
        # 1. Commit: the group's position moves past the whole batch.
        consumer_loop.commit(consumer, batch)
        # 2. Process. Killed here, the rest of the batch is lost.
        for message in batch:
            consumer_loop.process(message, out, args.delay)

    consumer_loop.run(args, Consumer(consumer_loop.consumer_config(args)), handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
