"""``raftlog transactions list|describe|abort`` (Kafka's ``kafka-transactions.sh``).

* ``list``: ListTransactions (66) to every broker (each answers for the coordinator
  partitions it leads); ``--state``, ``--producer-id`` and ``--duration-ms`` filter.
* ``describe --transactional-id ID``: DescribeTransactions (65) at the id's coordinator.
  ``describe --topic T --partition P``: DescribeProducers (61) at the partition's leader —
  the producers it knows, with the start offset of an open transaction.
* ``abort``: ends a hanging transaction (one that holds a partition's last stable offset).
  ``--transactional-id ID``, or ``--topic T --partition P [--start-offset O]``: the producer
  with an open transaction there is found with DescribeProducers, its transactional id with
  ListTransactions. The coordinator then aborts it: an InitProducerId for the id bumps the
  epoch (fencing the producer), moves the transaction to PrepareAbort and writes the ABORT
  markers; it is retried until the coordinator answers that the abort completed. A producer
  the coordinator does not know (its state was lost) gets an ABORT marker written at the
  partition's leader directly (WriteTxnMarkers, as Kafka's ``abort`` does).

``abort`` changes what other clients own, so it authenticates as the cluster admin: it needs
``--command-config FILE`` (Kafka's option) naming ``raft.secret`` or ``raft.secret.file``;
a WriteTxnMarkers from anyone else is refused (CLUSTER_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import trio

from raftlog.client.connection import ClusterLogin, KafkaClientError, KafkaConnection
from raftlog.config import ConfigError
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import FIND_COORDINATOR, INIT_PRODUCER_ID
from raftlog.protocol.schemas_txn import (
    DESCRIBE_PRODUCERS,
    DESCRIBE_TRANSACTIONS,
    LIST_TRANSACTIONS,
    WRITE_TXN_MARKERS,
)
from raftlog.tools import command_config
from raftlog.tools.console import Cluster

__all__ = ["add_parser", "run", "transactions_command"]

ACTIONS = ("list", "describe", "abort")
RETRIABLE = (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_NOT_AVAILABLE,
             ErrorCode.NOT_COORDINATOR, ErrorCode.CONCURRENT_TRANSACTIONS)


def add_parser(commands: Any) -> None:
    """Adds the ``transactions`` subcommand to ``raftlog``'s subparsers."""
    parser = commands.add_parser(
        "transactions", help="list, describe or abort transactions (hanging ones included)")
    parser.add_argument("action", choices=ACTIONS)
    parser.add_argument("--bootstrap-server", default="127.0.0.1:9092")
    parser.add_argument("--transactional-id")
    parser.add_argument("--topic")
    parser.add_argument("--partition", type=int)
    parser.add_argument("--start-offset", type=int, help="abort: the open transaction's "
                        "first offset (as DescribeProducers shows it)")
    parser.add_argument("--state", action="append", default=[], help="list: state filter")
    parser.add_argument("--producer-id", type=int, action="append", default=[])
    parser.add_argument("--duration-ms", type=int, default=-1,
                        help="list: only transactions open for longer than this")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds")
    command_config.add_argument(parser)


def run(args: argparse.Namespace) -> int:
    """Entry point from :mod:`raftlog.cli`."""
    try:
        return trio.run(transactions_command, args)
    except (KafkaClientError, OSError, ConfigError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1


async def transactions_command(args: argparse.Namespace) -> int:
    security = command_config.from_args(args)
    if args.action == "abort" and not isinstance(security.login, ClusterLogin):
        print("Error: abort needs the cluster secret: --command-config FILE with"
              " raft.secret.file=... (it acts as the cluster admin)", file=sys.stderr)
        return 2
    cluster = await Cluster.connect(args.bootstrap_server, security)
    try:
        if args.action == "list":
            return await _list(cluster, args.state, args.producer_id, args.duration_ms)
        if args.action == "describe":
            if args.transactional_id:
                return await _describe(cluster, args.transactional_id, args.timeout)
            if args.topic is not None and args.partition is not None:
                return await _describe_producers(cluster, args.topic, args.partition)
            print("Error: describe needs --transactional-id, or --topic and --partition",
                  file=sys.stderr)
            return 2
        return await _abort(cluster, args)
    finally:
        await cluster.aclose()


async def list_transactions(cluster: Cluster, states: list[str] | None = None,
                            producer_ids: list[int] | None = None, duration_ms: int = -1
                            ) -> list[tuple[str, int, int, str]]:
    """(transactional id, coordinator, producer id, state) from every broker."""
    await cluster.metadata([])
    out = []
    for node_id in sorted(cluster.brokers):
        connection = await cluster.leader_connection(node_id)
        response = await connection.request(LIST_TRANSACTIONS, {
            "state_filters": states or [], "producer_id_filters": producer_ids or [],
            "duration_filter": duration_ms})
        if response.error_code:
            print(f"node {node_id}: {ErrorCode(response.error_code).name}", file=sys.stderr)
        for txn in response.transaction_states:
            out.append((txn.transactional_id, node_id, txn.producer_id, txn.transaction_state))
    return out


async def _list(cluster: Cluster, states: list[str], producer_ids: list[int],
                duration_ms: int) -> int:
    rows = await list_transactions(cluster, states, producer_ids, duration_ms)
    print(f"{'TransactionalId':<40} {'Coordinator':>11} {'ProducerId':>12}  State")
    for txn_id, node_id, producer_id, state in sorted(rows):
        print(f"{txn_id:<40} {node_id:>11} {producer_id:>12}  {state}")
    return 0


async def _coordinator(cluster: Cluster, txn_id: str, timeout_s: float) -> KafkaConnection:
    with trio.fail_after(timeout_s):
        while True:
            found = await cluster.bootstrap.request(FIND_COORDINATOR,
                                                    {"key": txn_id, "key_type": 1})
            if found.error_code == 0:
                await cluster.metadata([])
                return await cluster.leader_connection(found.node_id)
            if found.error_code not in RETRIABLE:
                raise KafkaClientError(f"FindCoordinator({txn_id!r}): "
                                       f"{ErrorCode(found.error_code).name}")
            await trio.sleep(0.2)


async def describe_transaction(cluster: Cluster, txn_id: str, timeout_s: float) -> Any:
    with trio.fail_after(timeout_s):
        while True:
            connection = await _coordinator(cluster, txn_id, timeout_s)
            response = await connection.request(DESCRIBE_TRANSACTIONS,
                                                {"transactional_ids": [txn_id]})
            state = response.transaction_states[0]
            if state.error_code not in RETRIABLE:
                return state
            await trio.sleep(0.2)


async def _describe(cluster: Cluster, txn_id: str, timeout_s: float) -> int:
    state = await describe_transaction(cluster, txn_id, timeout_s)
    if state.error_code:
        print(f"Error: {txn_id!r}: {_error_name(state.error_code)}", file=sys.stderr)
        return 1
    partitions = ",".join(f"{t.topic}-{p}" for t in state.topics for p in t.partitions)
    print(f"TransactionalId: {txn_id}\nState: {state.transaction_state}\n"
          f"ProducerId: {state.producer_id}\nProducerEpoch: {state.producer_epoch}\n"
          f"TransactionTimeoutMs: {state.transaction_timeout_ms}\n"
          f"TransactionStartTimeMs: {state.transaction_start_time_ms}\n"
          f"Partitions: {partitions}")
    return 0


async def describe_producers(cluster: Cluster, topic: str, partition: int) -> list[Any]:
    leaders = await cluster.partition_leaders(topic)
    if partition not in leaders:
        raise KafkaClientError(f"{topic} has no partition {partition}")
    connection = await cluster.leader_connection(leaders[partition])
    response = await connection.request(DESCRIBE_PRODUCERS, {"topics": [
        {"name": topic, "partition_indexes": [partition]}]})
    result = response.topics[0].partitions[0]
    if result.error_code:
        raise KafkaClientError(f"DescribeProducers {topic}-{partition}: "
                               f"{ErrorCode(result.error_code).name}")
    return list(result.active_producers)


async def _describe_producers(cluster: Cluster, topic: str, partition: int) -> int:
    producers = await describe_producers(cluster, topic, partition)
    print(f"{'ProducerId':>12} {'Epoch':>6} {'LastSequence':>13} {'CoordinatorEpoch':>17} "
          f"{'CurrentTxnStartOffset':>22}")
    for p in producers:
        print(f"{p.producer_id:>12} {p.producer_epoch:>6} {p.last_sequence:>13} "
              f"{p.coordinator_epoch:>17} {p.current_txn_start_offset:>22}")
    return 0


async def abort_transactional_id(cluster: Cluster, txn_id: str, timeout_s: float) -> int:
    """Have the coordinator abort ``txn_id``'s open transaction: InitProducerId bumps the
    epoch and writes the ABORT markers; retried until the abort is complete."""
    state = await describe_transaction(cluster, txn_id, timeout_s)
    if state.error_code:
        print(f"Error: {txn_id!r}: {_error_name(state.error_code)}", file=sys.stderr)
        return 1
    if state.transaction_state not in ("Ongoing", "PrepareAbort"):
        print(f"{txn_id!r} is {state.transaction_state}: no open transaction to abort")
        return 0
    timeout_ms = state.transaction_timeout_ms
    with trio.fail_after(timeout_s):
        while True:
            connection = await _coordinator(cluster, txn_id, timeout_s)
            response = await connection.request(INIT_PRODUCER_ID, {
                "transactional_id": txn_id, "transaction_timeout_ms": timeout_ms,
                "producer_id": -1, "producer_epoch": -1})
            if response.error_code == 0:
                print(f"aborted the transaction of {txn_id!r} (producer {state.producer_id}, "
                      f"epoch {state.producer_epoch}); the producer is fenced "
                      f"(epoch now {response.producer_epoch})")
                return 0
            if response.error_code not in RETRIABLE:
                print(f"Error: InitProducerId({txn_id!r}): "
                      f"{ErrorCode(response.error_code).name}", file=sys.stderr)
                return 1
            await trio.sleep(0.2)


async def _abort(cluster: Cluster, args: argparse.Namespace) -> int:
    if args.transactional_id:
        return await abort_transactional_id(cluster, args.transactional_id, args.timeout)
    if args.topic is None or args.partition is None:
        print("Error: abort needs --transactional-id, or --topic and --partition",
              file=sys.stderr)
        return 2
    producers = [p for p in await describe_producers(cluster, args.topic, args.partition)
                 if p.current_txn_start_offset >= 0 and
                 (args.start_offset is None or p.current_txn_start_offset == args.start_offset)]
    if not producers:
        print(f"no open transaction on {args.topic}-{args.partition}")
        return 0 if args.start_offset is None else 1
    status = 0
    for producer in producers:
        found = await list_transactions(cluster, producer_ids=[producer.producer_id])
        if found:
            for txn_id, *_ in found:
                status |= await abort_transactional_id(cluster, txn_id, args.timeout)
            continue
        status |= await _abort_unknown(cluster, args.topic, args.partition, producer)
    return status


async def _abort_unknown(cluster: Cluster, topic: str, partition: int, producer: Any) -> int:
    """No coordinator knows the producer: write the ABORT marker at the leader directly."""
    leaders = await cluster.partition_leaders(topic)
    connection = await cluster.leader_connection(leaders[partition])
    response = await connection.request(WRITE_TXN_MARKERS, {"markers": [{
        "producer_id": producer.producer_id, "producer_epoch": producer.producer_epoch,
        "transaction_result": False, "coordinator_epoch": producer.coordinator_epoch,
        "topics": [{"name": topic, "partition_indexes": [partition]}]}]}, version=1)
    code = response.markers[0].topics[0].partitions[0].error_code
    if code:
        print(f"Error: ABORT marker for producer {producer.producer_id}: "
              f"{ErrorCode(code).name}", file=sys.stderr)
        return 1
    print(f"wrote an ABORT marker for producer {producer.producer_id} on {topic}-{partition}")
    return 0


def _error_name(code: int) -> str:
    if code == 105:
        return "TRANSACTIONAL_ID_NOT_FOUND"
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)
