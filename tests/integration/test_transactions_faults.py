"""Atomicity under faults on a real 3-node cluster (issue 4 acceptance): 200 transactions,
each writing to all 4 partitions of an RF 3 topic, alternately committed and aborted by a
confluent-kafka transactional producer, while the transaction coordinator and partition
leaders are SIGKILLed and restarted, one node at a time.

The producer handles errors as confluent-kafka documents: a retriable error repeats the call,
an abortable one (``txn_requires_abort``) aborts the transaction, a fatal one makes a new
producer (whose ``init_transactions`` fences the old one and finishes or aborts what it left).
Every transaction meant to abort never sent EndTxn(commit), so it is definitely aborted; one
meant to commit is definitely committed when ``commit_transaction`` returned, definitely
aborted when it was aborted afterwards, and otherwise indeterminate.

Afterwards a read_committed consumer must see every committed transaction completely, no
record of an aborted one, every indeterminate one all or nothing, and nothing twice; a
read_uncommitted consumer must see every record whose delivery was acknowledged, committed
or aborted."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio

from raftlog.client.connection import KafkaConnection
from raftlog.protocol.internal_topics import coordinator_partition
from raftlog.protocol.schemas import LIST_OFFSETS
from raftlog.txn.coordinator_service import TXN_TOPIC, TxnSettings
from tests.integration.cluster_harness import Cluster, ClusterNode, cluster3, wait_until
from tests.integration.helpers import read_values_to_end, unique_topic
from tests.integration.test_cluster_failover import create_topic

__all__ = ["cluster3"]

confluent_kafka = pytest.importorskip("confluent_kafka")

TRANSACTIONS = 200
PARTITIONS = 4
RECORDS_PER_PARTITION = 2
TXN_ID = "atomic-faults"
# Progress (transactions begun) at which each kill happens; the producer waits for a kill that
# is late, so every kill lands while transactions are running.
KILL_AT = (25, 65, 105, 145)
CALL_TIMEOUT_S = 30.0
RUN_TIMEOUT_S = 240.0


@dataclass
class Outcomes:
    committed: set[int] = field(default_factory=set)
    aborted: set[int] = field(default_factory=set)
    indeterminate: set[int] = field(default_factory=set)
    delivered: set[bytes] = field(default_factory=set)
    new_producers: int = 0
    errors: Counter[str] = field(default_factory=Counter)


def _values(txn: int) -> list[tuple[int, bytes]]:
    return [(p, b"t%03d-p%d-r%d" % (txn, p, r))
            for p in range(PARTITIONS) for r in range(RECORDS_PER_PARTITION)]


class FaultInjector(threading.Thread):
    """Kills (SIGKILL) and restarts one node per ``KILL_AT`` step: the coordinator of the
    transactional id, then partition leaders, alternating; before each kill the cluster must
    be whole again (every ISR full), so no two nodes are ever down together."""

    def __init__(self, cluster: Cluster, topic: str, progress: list[int], seed: int) -> None:
        super().__init__(name="fault-injector", daemon=True)
        self.cluster = cluster
        self.topic = topic
        self.progress = progress
        self.rng = random.Random(seed)
        self.kills: list[tuple[str, int]] = []
        self.kill_times: list[float] = []  # seconds into the run, for the failure message
        self.started = time.monotonic()
        self.failure: BaseException | None = None
        self.stop = threading.Event()
        self.txn_index = coordinator_partition(TXN_ID, TxnSettings().num_partitions)

    def run(self) -> None:
        try:
            for step, at in enumerate(KILL_AT):
                while self.progress[0] < at:
                    if self.stop.wait(0.02):
                        return
                self._wait_whole()
                role, victim = self._victim(step)
                node = self.cluster.nodes[victim]
                node.kill()
                self.kills.append((role, victim))
                self.kill_times.append(round(time.monotonic() - self.started, 1))
                time.sleep(self.rng.uniform(0.3, 1.5))
                node.start()
                node.wait_listening()
            self._wait_whole()
        except BaseException as exc:  # reported by the test thread
            self.failure = exc

    def _victim(self, step: int) -> tuple[str, int]:
        if step % 2 == 0:
            return "coordinator", self.cluster.partition(TXN_TOPIC, self.txn_index).leader_id
        coordinator = self.cluster.partition(TXN_TOPIC, self.txn_index).leader_id
        leaders = [p.leader_id for p in self.cluster.metadata(self.topic).topics[0].partitions]
        others = sorted({leader for leader in leaders if leader not in (-1, coordinator)})
        return "partition leader", self.rng.choice(others or leaders)

    def _wait_whole(self) -> None:
        def whole() -> bool:
            try:
                parts = [*self.cluster.metadata(self.topic).topics[0].partitions,
                         self.cluster.partition(TXN_TOPIC, self.txn_index)]
            except AssertionError:
                return False
            return all(p.leader_id >= 0 and len(p.isr_nodes) == 3 for p in parts)

        wait_until(whole, 90, "every ISR to be full again", interval_s=0.2)


class TransactionalWriter:
    """The producer side, with confluent-kafka's documented error handling."""

    def __init__(self, bootstrap: str, topic: str, outcomes: Outcomes) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.outcomes = outcomes
        self.producer: Any = None

    def _new_producer(self) -> None:
        if self.producer is not None:
            self.producer.flush(0)
        self.outcomes.new_producers += 1
        self.producer = confluent_kafka.Producer({
            "bootstrap.servers": self.bootstrap, "transactional.id": TXN_ID,
            "transaction.timeout.ms": 30_000, "message.timeout.ms": 25_000,
            "linger.ms": 2, "log_level": 2, "topic.metadata.refresh.interval.ms": 1000,
            "retry.backoff.ms": 50})
        deadline = time.monotonic() + RUN_TIMEOUT_S / 2
        while True:
            try:
                self.producer.init_transactions(CALL_TIMEOUT_S)
                return
            except confluent_kafka.KafkaException as exc:
                error = exc.args[0]
                self.outcomes.errors[f"init:{error.name()}"] += 1
                if error.fatal() or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)  # retriable (e.g. a timeout while the coordinator moves)

    def _on_delivery(self, error: Any, message: Any) -> None:
        if error is None:
            self.outcomes.delivered.add(message.value())

    def run_one(self, txn: int) -> None:
        """One transaction; records its outcome."""
        commit = txn % 2 == 0
        if self.producer is None:
            self._new_producer()
        try:
            self.producer.begin_transaction()
            for partition, value in _values(txn):
                self._produce(partition, value)
            if commit:
                self._commit(txn)
            else:
                self.producer.flush(CALL_TIMEOUT_S)
                self._abort(txn)
        except confluent_kafka.KafkaException as exc:
            self._failed(txn, commit, exc.args[0])

    def _produce(self, partition: int, value: bytes) -> None:
        while True:
            try:
                self.producer.produce(self.topic, value=value, partition=partition,
                                      on_delivery=self._on_delivery)
                return
            except BufferError:
                self.producer.poll(0.1)

    def _commit(self, txn: int) -> None:
        while True:
            try:
                self.producer.commit_transaction(CALL_TIMEOUT_S)
                self.outcomes.committed.add(txn)
                return
            except confluent_kafka.KafkaException as exc:
                error = exc.args[0]
                if error.retriable() and not error.txn_requires_abort() and not error.fatal():
                    self.outcomes.errors[f"commit-retry:{error.name()}"] += 1
                    continue  # the documented retry: commit_transaction again
                raise

    def _abort(self, txn: int) -> None:
        while True:
            try:
                self.producer.abort_transaction(CALL_TIMEOUT_S)
                self.outcomes.aborted.add(txn)
                return
            except confluent_kafka.KafkaException as exc:
                error = exc.args[0]
                if error.retriable() and not error.fatal():
                    self.outcomes.errors[f"abort-retry:{error.name()}"] += 1
                    continue
                raise

    def _failed(self, txn: int, commit: bool, error: Any) -> None:
        self.outcomes.errors[f"{'commit' if commit else 'abort'}:{error.name()}"] += 1
        if not error.fatal() and error.txn_requires_abort():
            try:
                self._abort(txn)
                return
            except confluent_kafka.KafkaException as exc:
                error = exc.args[0]
                self.outcomes.errors[f"abort-after-failure:{error.name()}"] += 1
        # Fatal (or the abort failed): a new producer fences this one. A transaction meant to
        # abort never asked to commit, so it cannot become visible; one meant to commit may
        # have reached PrepareCommit before the failure.
        (self.outcomes.indeterminate if commit else self.outcomes.aborted).add(txn)
        self.producer = None


def test_transactions_stay_atomic_through_sigkills(cluster3: Cluster) -> None:
    topic = unique_topic("txn-atomic")
    create_topic(cluster3, topic, PARTITIONS)
    seed = random.randrange(1 << 30)
    outcomes = Outcomes()
    progress = [0]
    writer = TransactionalWriter(cluster3.bootstrap, topic, outcomes)
    writer._new_producer()  # creates __transaction_state before the injector looks for it
    injector = FaultInjector(cluster3, topic, progress, seed)
    injector.start()
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        for txn in range(TRANSACTIONS):
            progress[0] = txn
            # Wait for a kill that is due, so that every kill hits a running producer.
            while len(injector.kills) < sum(1 for at in KILL_AT if txn >= at + 15) and \
                    injector.is_alive():
                time.sleep(0.05)
            assert time.monotonic() < deadline, f"seed {seed}: stuck at transaction {txn}"
            writer.run_one(txn)
        progress[0] = TRANSACTIONS
        injector.join(120)
    finally:
        injector.stop.set()
        if writer.producer is not None:
            writer.producer.flush(10)
    assert injector.failure is None, injector.failure
    assert len(injector.kills) == len(KILL_AT), injector.kills
    assert any(role == "coordinator" for role, _ in injector.kills)

    _wait_stable(cluster3, topic)
    bootstrap = cluster3.live_bootstrap()
    committed_view = read_values_to_end(bootstrap, topic, PARTITIONS, "read_committed")
    uncommitted_view = read_values_to_end(bootstrap, topic, PARTITIONS, "read_uncommitted")

    run_s = time.monotonic() - injector.started
    summary = (f"seed {seed}: kills {injector.kills} at {injector.kill_times} s, "
               f"run {run_s:.1f} s, {len(outcomes.committed)} committed, "
               f"{len(outcomes.aborted)} aborted, {len(outcomes.indeterminate)} indeterminate, "
               f"{outcomes.new_producers} producers, errors {dict(outcomes.errors)}")
    print(summary)
    assert outcomes.committed | outcomes.aborted | outcomes.indeterminate == \
        set(range(TRANSACTIONS)), summary
    assert not outcomes.committed & outcomes.aborted, summary
    assert len(outcomes.committed) >= TRANSACTIONS // 4, summary  # the run did real work
    counts = Counter(committed_view)
    twice = [v for v, n in counts.items() if n > 1]
    assert not twice, f"{summary}: read twice: {twice[:5]}"
    seen = set(counts)
    for txn in range(TRANSACTIONS):
        values = {v for _, v in _values(txn)}
        visible = values & seen
        if txn in outcomes.committed:
            assert visible == values, f"{summary}: committed txn {txn} missing " \
                f"{sorted(values - visible)}"
        elif txn in outcomes.aborted:
            assert not visible, f"{summary}: aborted txn {txn} visible: {sorted(visible)}"
        else:
            assert visible in (set(), values), f"{summary}: txn {txn} partly visible"
    assert not seen - {v for t in range(TRANSACTIONS) for _, v in _values(t)}, summary
    # read_uncommitted: every acknowledged record, committed or aborted.
    everything = set(uncommitted_view)
    missing = outcomes.delivered - everything
    assert not missing, f"{summary}: acknowledged but not in the log: {sorted(missing)[:5]}"
    assert seen <= everything
    aborted_values = {v for t in outcomes.aborted for _, v in _values(t)}
    assert everything & aborted_values, f"{summary}: no aborted record in the log"


def _wait_stable(cluster: Cluster, topic: str) -> None:
    """Until every partition's last stable offset reached its high watermark (no open
    transaction: the last markers are in)."""

    async def gaps(described: Any) -> list[tuple[int, int, int]]:
        out = []
        for p in described:
            node: ClusterNode = cluster.nodes[p.leader_id]
            async with await KafkaConnection.connect(*node.address) as conn:
                offsets = []
                for isolation in (1, 0):
                    response = await conn.request(LIST_OFFSETS, {
                        "replica_id": -1, "isolation_level": isolation, "topics": [{
                            "name": topic, "partitions": [{
                                "partition_index": p.partition_index, "timestamp": -1}]}]})
                    part = response.topics[0].partitions[0]
                    assert part.error_code == 0, part
                    offsets.append(part.offset)
            out.append((p.partition_index, offsets[0], offsets[1]))
        return out

    def stable() -> bool:
        try:
            described = cluster.metadata(topic).topics[0].partitions
            return all(lso == hw for _, lso, hw in trio.run(gaps, described))
        except Exception:  # a leader moving or not answering yet: look again
            return False

    wait_until(stable, 60, "every LSO to reach the high watermark", interval_s=0.25)
