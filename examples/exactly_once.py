"""Exactly-once consume-transform-produce: the outputs of a batch and the group's offsets after
it are committed in one Kafka transaction.

    python examples/exactly_once.py --bootstrap-server 127.0.0.1:9092 \
        --topic events --output-topic results --group eos --output attempts.txt

For every input record the consumer produces one result record to ``--output-topic`` inside
a transaction, hands the batch's next offsets to the same transaction
(``send_offsets_to_transaction``) and commits it. Killed midway, the open transaction is
aborted (by the restarted producer's ``init_transactions``, which fences the old one through
the same ``transactional.id``, or after ``transaction.timeout.ms``): its results vanish for
``read_committed`` readers and its offsets were never committed, so the restarted consumer
redoes exactly that batch. Each input appears in the output topic exactly once.

``--output`` still gets one line per processing *attempt*: a side effect outside Kafka is not
part of the transaction, so that file shows the redone batch twice — exactly-once covers what
the transaction writes, nothing else. See examples/README.md.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import IO, Any

import consumer_loop

TRANSACTION_TIMEOUT_S = 30.0


def transform(value: bytes) -> bytes:
    """The application's result for one input."""
    return b"result-" + value


def main() -> int:
    from confluent_kafka import Consumer, Producer

    parser = consumer_loop.parser("exactly-once consume-transform-produce (transactions)")
    parser.add_argument("--output-topic", required=True, help="topic the results go to")
    parser.add_argument("--transactional-id",
                        help="stable per consumer instance (default: GROUP-INSTANCE_ID)")
    args = parser.parse_args()
    producer = Producer({
        "bootstrap.servers": args.bootstrap_server,
        # The same id after a restart fences the killed process and aborts its transaction.
        "transactional.id": args.transactional_id or f"{args.group}-{args.instance_id or 0}",
        "transaction.timeout.ms": int(TRANSACTION_TIMEOUT_S * 1000)})
    producer.init_transactions(TRANSACTION_TIMEOUT_S)
    # read_committed: never consume another transaction's aborted (or still open) records.
    consumer = Consumer(consumer_loop.consumer_config(args, **{
        "isolation.level": "read_committed"}))

    def handle(consumer: Any, batch: Sequence[Any], out: IO[str]) -> None:
        producer.begin_transaction()
        for message in batch:
            consumer_loop.process(message, out, args.delay)  # an attempt, outside Kafka
            producer.produce(args.output_topic, key=message.key(),
                             value=transform(message.value()))
        # The offsets after the batch, committed with the results or not at all.
        producer.send_offsets_to_transaction(consumer_loop.next_offsets(batch),
                                             consumer.consumer_group_metadata(),
                                             TRANSACTION_TIMEOUT_S)
        # Killed before this returns: results and offsets are aborted together.
        producer.commit_transaction(TRANSACTION_TIMEOUT_S)

    consumer_loop.run(args, consumer, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
