"""Acceptance tests of the multi-node milestone: a real 3-node cluster (one ``raftlog server``
process per node, ``cluster_harness``) driven by unchanged Kafka clients.

1. An idempotent confluent-kafka producer (acks=all, RF=3, 3 partitions) streams while the
   leader of a partition is SIGKILLed, then the quorum leader, then both come back: every
   acknowledged record is read back exactly once, in order, at its acknowledged offset, and the
   three replicas of every partition are byte-identical on disk up to the high watermark.
2. SIGTERM to every node and a fresh start lose nothing: same records at the same offsets and
   the same ListOffsets answers.
3. A follower stopped with SIGSTOP leaves the ISR after ``replica.lag.time.max.ms`` (its broker
   session is long, so this is the leader's lag check, not fencing) and rejoins after SIGCONT.
4. kafka-python and aiokafka produce to and consume from the cluster, and find the new leader
   after the old one is SIGKILLed.
5. Exactly-once at the protocol level: an idempotent batch whose acks=all request timed out on the
   old leader, retried byte for byte into the new leader, is answered with its original offset
   and not written twice.

Every wait is bounded; the only timing assertion is the ISR-lag bound of test 3. The failover
times are printed (``pytest -s``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest
import trio

from raftlog.client.connection import KafkaConnection
from raftlog.partition.batch import (
    RECORD_BATCH_OVERHEAD,
    build_batch,
    check_batch,
    decode_records,
    parse_header,
)
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import INIT_PRODUCER_ID, PRODUCE
from tests.integration.cluster_harness import (
    Cluster,
    ClusterNode,
    cluster3,
    running_cluster,
    wait_for,
    wait_until,
)
from tests.integration.helpers import fetch_raw, unique_topic

__all__ = ["cluster3"]  # the fixture, imported for pytest

PARTITIONS = 3
REPLICATION_FACTOR = 3
FAILOVER_TIMEOUT_S = 20.0
RECOVERY_TIMEOUT_S = 60.0
CATCH_UP_TIMEOUT_S = 60.0
CONSUME_TIMEOUT_S = 60.0
FLUSH_TIMEOUT_S = 150.0
WATERMARKS_TIMEOUT_S = 30.0
ISR_LAG_MS = 1500
ISR_LAG_SLACK_S = 6.0  # the leader checks every lag/2; AlterPartition; metadata propagation


# -- observations --------------------------------------------------------------------------------


def fresh_metadata(cluster: Cluster, topic: str) -> Any | None:
    """The topic as the ready controller describes it (its image is the newest), else as the
    first live node that knows the topic does; None when nobody answers with it.

    A node that was just restarted answers Metadata before it has replayed the metadata log
    (UNKNOWN_TOPIC_OR_PARTITION, or an old ISR), so it is asked last.
    """
    controller = cluster.quorum_leader(timeout_s=2.0)
    nodes = sorted((n for n in cluster.nodes.values() if n.alive() and not n.paused),
                   key=lambda n: n.node_id != controller)
    for node in nodes:
        try:
            described = cluster.metadata(topic, node=node).topics[0]
        except AssertionError:
            continue
        if described.error_code in (0, 5) and described.partitions:
            return described
    return None


def partition_states(cluster: Cluster, topic: str) -> dict[int, Any]:
    described = wait_for(lambda: fresh_metadata(cluster, topic), 15, f"metadata of {topic}")
    return {p.partition_index: p for p in described.partitions}


def create_topic(cluster: Cluster, topic: str, partitions: int = PARTITIONS,
                 replication_factor: int = REPLICATION_FACTOR) -> None:
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": cluster.live_bootstrap(), "log_level": 2})
    futures = admin.create_topics([NewTopic(topic, partitions, replication_factor)],
                                  request_timeout=15)
    futures[topic].result(timeout=30)
    wait_until(lambda: full_isrs(cluster, topic, replication_factor), 20,
               f"{topic} to have leaders and full ISRs")


def full_isrs(cluster: Cluster, topic: str, size: int = REPLICATION_FACTOR) -> bool:
    described = fresh_metadata(cluster, topic)
    return described is not None and all(
        p.leader_id >= 0 and len(p.isr_nodes) == size for p in described.partitions)


def watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
    """(earliest, latest) per partition as ListOffsets answers a client (routed to leaders)."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    transient = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                 KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.REQUEST_TIMED_OUT,
                 KafkaError.OFFSET_NOT_AVAILABLE, KafkaError._TIMED_OUT, KafkaError._TRANSPORT,
                 KafkaError._ALL_BROKERS_DOWN}
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "raftlog-assign-only",
                         "enable.auto.commit": False, "log_level": 2})
    deadline = time.monotonic() + WATERMARKS_TIMEOUT_S
    try:
        out = {}
        for p in range(partitions):
            while True:  # librdkafka does not retry this query: a leader just moved, etc.
                try:
                    out[p] = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)
                    break
                except KafkaException as exc:
                    if exc.args[0].code() not in transient or time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        return out
    finally:
        consumer.close()


@dataclass(frozen=True)
class Consumed:
    partition: int
    offset: int
    value: bytes


def consume_all(bootstrap: str, topic: str, partitions: int) -> list[Consumed]:
    """Every record of every partition from offset 0 up to the high watermark."""
    from confluent_kafka import Consumer, TopicPartition

    ends = {p: high for p, (_, high) in watermarks(bootstrap, topic, partitions).items()}
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "raftlog-assign-only",
                         "enable.auto.commit": False, "auto.offset.reset": "error",
                         "log_level": 2})
    out: list[Consumed] = []
    positions = dict.fromkeys(range(partitions), 0)
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while any(positions[p] < ends[p] for p in positions):
            assert time.monotonic() < deadline, f"consumed to {positions}, ends {ends}"
            for message in consumer.consume(num_messages=1000, timeout=0.5):
                assert message.error() is None, message.error()
                partition, offset, value = message.partition(), message.offset(), \
                    message.value()
                assert partition is not None and offset is not None and value is not None
                out.append(Consumed(partition, offset, value))
                positions[partition] = offset + 1
    finally:
        consumer.close()
    return out


def replica_batches(node: ClusterNode, topic: str, partition: int) -> list[bytes]:
    """Every whole batch in a replica's segment files, in offset order, straight from disk."""
    directory = node.directory / "data" / f"{topic}-{partition}"
    batches: list[bytes] = []
    for segment in sorted(directory.glob("*.log")):
        data = segment.read_bytes()
        position = 0
        while len(data) - position >= RECORD_BATCH_OVERHEAD:
            header = parse_header(data, position)
            end = position + header.size_bytes
            if header.size_bytes < RECORD_BATCH_OVERHEAD or end > len(data):
                break  # a tail being written right now
            batches.append(data[position:end])
            position = end
    return batches


def below(batches: list[bytes], high_watermark: int) -> list[bytes]:
    return [b for b in batches if parse_header(b).base_offset < high_watermark]


def covers(batches: list[bytes], offset: int) -> bool:
    if offset == 0:
        return True
    return bool(batches) and parse_header(batches[-1]).next_offset >= offset


# -- the idempotent producer ---------------------------------------------------------------------


@dataclass
class Report:
    partition: int
    offset: int
    value: bytes
    at: float


@dataclass
class IdempotentProducer:
    """confluent-kafka with enable.idempotence=True and acks=all, producing numbered values
    round-robin over the partitions from a background thread; every delivery report kept."""

    bootstrap: str
    topic: str
    partitions: int
    # librdkafka's eos/topic/metadata debug log goes here, for a failure's post-mortem.
    debug_log: Path | None = None
    interval_s: float = 0.002
    acked: list[Report] = field(default_factory=list)
    failures: list[tuple[int, bytes, str]] = field(default_factory=list)
    client_errors: list[str] = field(default_factory=list)
    sent: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _abandon: threading.Event = field(default_factory=threading.Event)  # stop flushing
    _thread: threading.Thread | None = None
    _producer: Any = None
    _error: BaseException | None = None
    _log_handler: logging.Handler | None = None

    def __post_init__(self) -> None:
        from confluent_kafka import Producer

        config: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap, "enable.idempotence": True, "acks": "all",
            "linger.ms": 5, "message.timeout.ms": 180_000,
            # Short enough that requests to a dead or stalled leader time out and are retried
            # (into the new leader, where idempotence must drop the duplicate).
            "request.timeout.ms": 5000, "retry.backoff.ms": 100,
            "topic.metadata.refresh.interval.ms": 1000, "log_level": 2,
            "error_cb": lambda error: self.client_errors.append(str(error)),
        }
        if self.debug_log is not None:
            logger = logging.getLogger(f"librdkafka.{id(self)}")
            logger.propagate = False
            logger.setLevel(logging.DEBUG)
            self._log_handler = logging.FileHandler(self.debug_log)
            self._log_handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
            logger.addHandler(self._log_handler)
            config.update({"debug": "eos,topic,metadata", "log_level": 7, "logger": logger})
        self._producer = Producer(config)

    def _on_delivery(self, error: Any, message: Any) -> None:
        value = message.value()
        if error is not None:
            self.failures.append((message.partition(), value, str(error)))
            return
        self.acked.append(Report(message.partition(), message.offset(), value,
                                 time.monotonic()))

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._producer.produce(self.topic, value=b"v%08d" % self.sent,
                                       partition=self.sent % self.partitions,
                                       on_delivery=self._on_delivery)
                self.sent += 1
                self._producer.poll(0)
                time.sleep(self.interval_s)
            deadline = time.monotonic() + FLUSH_TIMEOUT_S
            while len(self._producer) and time.monotonic() < deadline \
                    and not self._abandon.is_set():
                self._producer.flush(0.5)
        except BaseException as exc:  # surfaced by stop()
            self._error = exc

    def start(self) -> IdempotentProducer:
        self._thread = threading.Thread(target=self._run, name="idempotent-producer",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop producing and wait for every outstanding delivery report."""
        self._stop.set()
        assert self._thread is not None
        self._thread.join(FLUSH_TIMEOUT_S + 20)
        if self._log_handler is not None:
            self._log_handler.close()
        assert not self._thread.is_alive(), "the producer thread did not finish flushing"
        if self._error is not None:
            raise self._error
        pending = len(self._producer)
        assert pending == 0, f"{pending} records never got a delivery report"

    def abandon(self) -> None:
        """Stop producing now, without waiting for outstanding delivery reports."""
        self._stop.set()
        self._abandon.set()
        if self._thread is not None:
            self._thread.join(10)

    def acked_since(self, moment: float) -> dict[int, int]:
        counts: dict[int, int] = defaultdict(int)
        for report in list(self.acked):
            if report.at > moment:
                counts[report.partition] += 1
        return counts

    def wait_progress(self, moment: float, per_partition: int, timeout_s: float,
                      what: str) -> float:
        """Until every partition has ``per_partition`` acks after ``moment``; the seconds
        from ``moment`` to the first ack of the slowest partition."""
        def done() -> bool:
            counts = self.acked_since(moment)
            return all(counts[p] >= per_partition for p in range(self.partitions))

        try:
            wait_until(done, timeout_s, what, interval_s=0.05)
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}: acks per partition since then {dict(self.acked_since(moment))}, "
                f"client errors {self.client_errors[-5:]}, librdkafka log {self.debug_log}"
            ) from None
        firsts: dict[int, float] = {}
        for report in list(self.acked):
            if report.at > moment:
                firsts.setdefault(report.partition, report.at)
        return max(firsts.values()) - moment


@pytest.fixture
def producer_factory() -> Iterator[list[IdempotentProducer]]:
    """Producers made in a test are stopped even when it fails."""
    made: list[IdempotentProducer] = []
    yield made
    for producer in made:
        producer.abandon()


def check_exactly_once(consumed: list[Consumed], acked: list[Report], sent: int,
                       partitions: int = PARTITIONS) -> None:
    """No value twice, every acknowledged value at its acknowledged (partition, offset),
    offsets 0..n-1 per partition, values in produce order per partition."""
    values = [record.value for record in consumed]
    duplicates = len(values) - len(set(values))
    assert duplicates == 0, f"{duplicates} duplicated records, e.g. " \
        f"{[v for v in set(values) if values.count(v) > 1][:3]}"
    where = {record.value: (record.partition, record.offset) for record in consumed}
    missing = [r for r in acked if r.value not in where]
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {missing[:3]}"
    moved = [(r, where[r.value]) for r in acked if where[r.value] != (r.partition, r.offset)]
    assert not moved, f"{len(moved)} records not at their acknowledged offset: {moved[:3]}"
    assert len(acked) == sent, f"{sent - len(acked)} records sent but never acknowledged"
    by_partition: dict[int, list[Consumed]] = defaultdict(list)
    for record in consumed:
        by_partition[record.partition].append(record)
    for partition, records in by_partition.items():
        assert [r.offset for r in records] == list(range(len(records))), partition
        numbers = [int(r.value[1:]) for r in records]
        assert all(n % partitions == partition for n in numbers)
        assert numbers == sorted(numbers), f"partition {partition} is out of produce order"


def explain_stall(cluster: Cluster, topic: str, producer: IdempotentProducer,
                  stall: AssertionError) -> NoReturn:
    """Producing stopped making progress: an idempotent producer stalls for good when the log
    lost records it had acknowledged (its next sequence number is then out of order), so look
    for that before reporting the stall itself."""
    producer.abandon()
    try:
        consumed = consume_all(cluster.live_bootstrap(), topic, producer.partitions)
    except AssertionError as exc:
        raise AssertionError(f"{stall}; reading the topic back failed too: {exc}") from None
    where = {r.value: (r.partition, r.offset) for r in consumed}
    lost = [r for r in producer.acked if where.get(r.value) != (r.partition, r.offset)]
    if lost:
        per_partition = {p: sum(1 for r in lost if r.partition == p)
                         for p in range(producer.partitions)}
        raise AssertionError(
            f"{len(lost)} acknowledged records are gone from the log (per partition "
            f"{per_partition}, e.g. {lost[:2]}), and then {stall}") from None
    raise stall


def wait_replicas_identical(cluster: Cluster, topic: str, partitions: int,
                            high_watermarks: Mapping[int, int]) -> None:
    """Every replica of every partition has the same batches, byte for byte, below the HW."""
    def compare() -> bool:
        for p in range(partitions):
            hw = high_watermarks[p]
            logs = {node_id: replica_batches(node, topic, p)
                    for node_id, node in cluster.nodes.items()}
            if not all(covers(batches, hw) for batches in logs.values()):
                return False
        return True

    wait_until(compare, CATCH_UP_TIMEOUT_S, "every replica to reach the high watermark",
               interval_s=0.25)
    for p in range(partitions):
        hw = high_watermarks[p]
        logs = {node_id: below(replica_batches(node, topic, p), hw)
                for node_id, node in cluster.nodes.items()}
        reference_id, reference = next(iter(logs.items()))
        assert reference, f"partition {p} is empty"
        expected = 0
        for raw in reference:  # CRC, structure and contiguity of the reference copy
            header = check_batch(raw)
            assert header.base_offset == expected, f"partition {p}: gap at {expected}"
            expected = header.next_offset
        assert expected >= hw
        for node_id, batches in logs.items():
            assert len(batches) == len(reference), (
                f"partition {p}: node {node_id} has {len(batches)} batches below HW {hw}, "
                f"node {reference_id} {len(reference)}")
            for raw, reference_raw in zip(batches, reference, strict=True):
                assert raw == reference_raw, (
                    f"partition {p}: node {node_id} differs from node {reference_id} in the "
                    f"batch at offset {parse_header(raw).base_offset}")


# -- 1 + 5: idempotent producer through a partition-leader and a quorum-leader SIGKILL -----------


def test_idempotent_producer_survives_leader_and_quorum_leader_sigkill_exactly_once(
    cluster3: Cluster, producer_factory: list[IdempotentProducer], tmp_path: Path,
) -> None:
    cluster = cluster3
    topic = unique_topic("acceptance")
    create_topic(cluster, topic)
    producer = IdempotentProducer(cluster.bootstrap, topic, PARTITIONS,
                                  debug_log=tmp_path / "librdkafka.log")
    producer_factory.append(producer)
    producer.start()
    producer.wait_progress(0.0, 100, 30, "the first acknowledgements")

    # A partition leader that is not the quorum leader: SIGKILL.
    controller = wait_for(cluster.quorum_leader, 15, "a ready controller")
    states = partition_states(cluster, topic)
    victim_partition = next(p for p, s in sorted(states.items()) if s.leader_id != controller)
    first_victim = states[victim_partition].leader_id
    old_epoch = states[victim_partition].leader_epoch
    cluster.nodes[first_victim].kill()
    killed_at = time.monotonic()
    elected = wait_for(
        lambda: ((s := partition_states(cluster, topic)[victim_partition]).leader_id
                 not in (-1, first_victim) and s) or None,
        FAILOVER_TIMEOUT_S, "a new leader for the partition")
    elected_s = time.monotonic() - killed_at
    assert elected.leader_epoch > old_epoch
    try:
        recovered_s = producer.wait_progress(killed_at, 50, RECOVERY_TIMEOUT_S,
                                             "producing to resume after the leader SIGKILL")
    except AssertionError as stall:
        explain_stall(cluster, topic, producer, stall)

    # Now the quorum leader (the majority is lost until a node comes back).
    second_victim = wait_for(cluster.quorum_leader, FAILOVER_TIMEOUT_S, "a ready controller")
    assert second_victim != first_victim
    cluster.nodes[second_victim].kill()
    second_killed_at = time.monotonic()
    time.sleep(1.0)  # let requests to the dead nodes time out and pile up as retries
    for node_id in (first_victim, second_victim):
        cluster.nodes[node_id].start()
    for node_id in (first_victim, second_victim):
        cluster.nodes[node_id].wait_listening()
    restarted_at = time.monotonic()
    new_controller = wait_for(cluster.quorum_leader, RECOVERY_TIMEOUT_S,
                              "a controller after the restart")
    controller_s = time.monotonic() - second_killed_at
    try:
        after_restart_s = producer.wait_progress(restarted_at, 50, RECOVERY_TIMEOUT_S,
                                                 "producing to resume after the restarts")
    except AssertionError as stall:
        explain_stall(cluster, topic, producer, stall)
    producer.stop()

    assert not producer.failures, f"{len(producer.failures)} delivery failures, e.g. " \
        f"{producer.failures[:3]}"
    wait_until(lambda: full_isrs(cluster, topic), CATCH_UP_TIMEOUT_S,
               "both restarted nodes to rejoin every ISR", interval_s=0.25)
    marks = watermarks(cluster.bootstrap, topic, PARTITIONS)
    consumed = consume_all(cluster.bootstrap, topic, PARTITIONS)
    check_exactly_once(consumed, producer.acked, producer.sent)
    assert sum(high for _, high in marks.values()) == len(consumed)
    wait_replicas_identical(cluster, topic, PARTITIONS,
                            {p: high for p, (_, high) in marks.items()})
    print(f"\n{producer.sent} records, all acknowledged exactly once; partition {victim_partition} "
          f"leader {first_victim} SIGKILLed: new leader {elected.leader_id} elected after "
          f"{elected_s:.2f} s, acks on every partition again after {recovered_s:.2f} s; "
          f"quorum leader {second_victim} SIGKILLed, both restarted after 1 s: controller "
          f"{new_controller} ready {controller_s:.2f} s after the kill, acks on every "
          f"partition {after_restart_s:.2f} s after the restart")


# -- 2: stop every node, start again -------------------------------------------------------------


def test_sigterm_all_and_restart_keeps_every_record_at_its_offset(
    cluster3: Cluster, producer_factory: list[IdempotentProducer],
) -> None:
    cluster = cluster3
    topic = unique_topic("restart-all")
    create_topic(cluster, topic)
    producer = IdempotentProducer(cluster.bootstrap, topic, PARTITIONS, interval_s=0.0005)
    producer_factory.append(producer)
    producer.start()
    producer.wait_progress(0.0, 700, 60, "records to be acknowledged")
    producer.stop()
    assert not producer.failures, producer.failures[:3]
    wait_until(lambda: full_isrs(cluster, topic), CATCH_UP_TIMEOUT_S, "full ISRs")
    before_marks = watermarks(cluster.bootstrap, topic, PARTITIONS)
    before = consume_all(cluster.bootstrap, topic, PARTITIONS)
    check_exactly_once(before, producer.acked, producer.sent)

    started = time.monotonic()
    cluster.stop_all()
    stopped_s = time.monotonic() - started
    assert all(node.process is not None and node.process.returncode == 0
               for node in cluster.nodes.values()), "a node did not exit cleanly on SIGTERM"
    cluster.start_all()
    cluster.wait_ready()
    ready_s = time.monotonic() - started - stopped_s
    wait_until(lambda: full_isrs(cluster, topic), CATCH_UP_TIMEOUT_S, "full ISRs again")
    assert watermarks(cluster.bootstrap, topic, PARTITIONS) == before_marks
    after = consume_all(cluster.bootstrap, topic, PARTITIONS)
    assert sorted(after, key=lambda r: (r.partition, r.offset)) == \
        sorted(before, key=lambda r: (r.partition, r.offset))
    print(f"\n{len(after)} records kept across SIGTERM of all nodes ({stopped_s:.2f} s) and a "
          f"restart (ready after {ready_s:.2f} s); watermarks {before_marks}")


# -- 3: a paused follower leaves the ISR by lag and rejoins ---------------------------------------


@pytest.fixture
def lagging_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A 3-node cluster whose leaders drop a follower after 1.5 s without catching up, while
    broker sessions last 60 s: an ISR shrink here comes from the lag check, not fencing."""
    with running_cluster(tmp_path / "cluster", extra_properties={
        "replica.lag.time.max.ms": str(ISR_LAG_MS),
        "broker.session.timeout.ms": "60000",
        "broker.heartbeat.interval.ms": "500",
    }) as cluster:
        yield cluster


def test_sigstopped_follower_leaves_the_isr_after_the_lag_time_and_rejoins(
    lagging_cluster: Cluster, producer_factory: list[IdempotentProducer],
) -> None:
    cluster = lagging_cluster
    topic = unique_topic("isr-lag")
    create_topic(cluster, topic, partitions=1)
    controller = wait_for(cluster.quorum_leader, 15, "a ready controller")
    state = partition_states(cluster, topic)[0]
    follower = next(n for n in state.replica_nodes if n not in (state.leader_id, controller))
    producer = IdempotentProducer(cluster.bootstrap, topic, 1)
    producer_factory.append(producer)
    producer.start()
    producer.wait_progress(0.0, 100, 30, "acknowledgements with the full ISR")

    cluster.nodes[follower].pause()
    paused_at = time.monotonic()
    wait_until(lambda: follower not in partition_states(cluster, topic)[0].isr_nodes,
               ISR_LAG_MS / 1000 + ISR_LAG_SLACK_S + 5, "the paused follower to leave the ISR",
               interval_s=0.02)
    left_s = time.monotonic() - paused_at
    assert left_s < ISR_LAG_MS / 1000 + ISR_LAG_SLACK_S, \
        f"the paused follower left the ISR only after {left_s:.2f} s"
    shrunk = partition_states(cluster, topic)[0]
    assert shrunk.leader_id == state.leader_id, "the leader must not change"
    assert follower in shrunk.replica_nodes
    # acks=all goes on with the shrunk ISR.
    acks_s = producer.wait_progress(paused_at + left_s, 100, 30, "acks with the shrunk ISR")

    cluster.nodes[follower].resume()
    resumed_at = time.monotonic()
    wait_until(lambda: follower in partition_states(cluster, topic)[0].isr_nodes,
               CATCH_UP_TIMEOUT_S, "the resumed follower to rejoin the ISR", interval_s=0.05)
    rejoined_s = time.monotonic() - resumed_at
    producer.stop()
    assert not producer.failures, producer.failures[:3]
    consumed = consume_all(cluster.bootstrap, topic, 1)
    check_exactly_once(consumed, producer.acked, producer.sent, partitions=1)
    print(f"\nfollower {follower} left the ISR {left_s:.2f} s after SIGSTOP "
          f"(replica.lag.time.max.ms={ISR_LAG_MS}); acks resumed {acks_s:.2f} s after that; "
          f"back in the ISR {rejoined_s:.2f} s after SIGCONT")


# -- 4: kafka-python and aiokafka ----------------------------------------------------------------


def kafka_python_produce(bootstrap: str, topic: str, values: list[bytes]
                         ) -> dict[bytes, tuple[int, int]]:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", retries=20,
                             retry_backoff_ms=200, request_timeout_ms=10_000,
                             metadata_max_age_ms=1000, max_in_flight_requests_per_connection=1)
    try:
        futures = [(v, producer.send(topic, value=v, partition=i % PARTITIONS))
                   for i, v in enumerate(values)]
        producer.flush(60)
        out = {}
        for value, future in futures:
            metadata = future.get(timeout=60)
            out[value] = (metadata.partition, metadata.offset)
        return out
    finally:
        producer.close(10)


def kafka_python_consume(bootstrap: str, topic: str, expected: int) -> list[Consumed]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                             enable_auto_commit=False, auto_offset_reset="earliest")
    out: list[Consumed] = []
    try:
        assignment = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(assignment)
        consumer.seek_to_beginning(*assignment)
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while len(out) < expected:
            assert time.monotonic() < deadline, f"kafka-python consumed {len(out)}/{expected}"
            for batch in consumer.poll(timeout_ms=500, max_records=5000).values():
                out.extend(Consumed(m.partition, m.offset, m.value) for m in batch)
    finally:
        consumer.close(autocommit=False)
    return out


async def aiokafka_produce(bootstrap: str, topic: str, values: list[bytes]
                           ) -> dict[bytes, tuple[int, int]]:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                request_timeout_ms=10_000, retry_backoff_ms=200,
                                metadata_max_age_ms=1000)
    await producer.start()
    try:
        out = {}
        for i, value in enumerate(values):
            deadline = time.monotonic() + 60
            while True:  # aiokafka does not retry a send whose leader died: the caller does
                try:
                    metadata = await producer.send_and_wait(topic, value=value,
                                                            partition=i % PARTITIONS)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)
            out[value] = (metadata.partition, metadata.offset)
        return out
    finally:
        await producer.stop()


async def aiokafka_consume(bootstrap: str, topic: str, expected: int) -> list[Consumed]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    out: list[Consumed] = []
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        await consumer.seek_to_beginning()
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while len(out) < expected:
            assert time.monotonic() < deadline, f"aiokafka consumed {len(out)}/{expected}"
            batches = await consumer.getmany(timeout_ms=500, max_records=5000)
            for messages in batches.values():
                out.extend(Consumed(m.partition, m.offset, m.value) for m in messages)
    finally:
        await consumer.stop()
    return out


def check_acknowledged(consumed: list[Consumed], acked: Mapping[bytes, tuple[int, int]]) -> None:
    where = {r.value: (r.partition, r.offset) for r in consumed}
    lost = [v for v in acked if v not in where]
    assert not lost, f"{len(lost)} acknowledged records lost, e.g. {lost[:3]}"
    moved = [(v, acked[v], where[v]) for v in acked if where[v] != acked[v]]
    assert not moved, f"records not at their acknowledged offsets: {moved[:3]}"


def test_kafka_python_and_aiokafka_follow_a_leader_sigkill(cluster3: Cluster) -> None:
    cluster = cluster3
    topic = unique_topic("python-clients")
    create_topic(cluster, topic)
    acked: dict[bytes, tuple[int, int]] = {}
    acked.update(kafka_python_produce(cluster.bootstrap, topic,
                                      [b"kp-a-%05d" % i for i in range(300)]))
    acked.update(asyncio.run(aiokafka_produce(cluster.bootstrap, topic,
                                              [b"aio-a-%05d" % i for i in range(300)])))

    controller = wait_for(cluster.quorum_leader, 15, "a ready controller")
    states = partition_states(cluster, topic)
    victim = next(s.leader_id for _, s in sorted(states.items()) if s.leader_id != controller)
    led = [p for p, s in states.items() if s.leader_id == victim]
    cluster.nodes[victim].kill()
    killed_at = time.monotonic()
    # The clients only know the old leader: their metadata refresh must find the new one.
    acked.update(kafka_python_produce(cluster.bootstrap, topic,
                                      [b"kp-b-%05d" % i for i in range(300)]))
    kafka_python_s = time.monotonic() - killed_at
    acked.update(asyncio.run(aiokafka_produce(cluster.bootstrap, topic,
                                              [b"aio-b-%05d" % i for i in range(300)])))
    now = partition_states(cluster, topic)
    assert all(now[p].leader_id not in (-1, victim) for p in led)

    live = cluster.live_bootstrap()
    check_acknowledged(kafka_python_consume(live, topic, len(acked)), acked)
    check_acknowledged(asyncio.run(aiokafka_consume(live, topic, len(acked))), acked)
    print(f"\nnode {victim} (leader of partitions {led}) SIGKILLed: kafka-python's 300 "
          f"records after it took {kafka_python_s:.2f} s")


# -- 5: a timed-out idempotent batch retried into the new leader ----------------------------------


async def _init_producer_id(address: tuple[str, int]) -> tuple[int, int]:
    async with await KafkaConnection.connect(*address, timeout_s=5) as connection:
        response = await connection.request(
            INIT_PRODUCER_ID, {"transactional_id": None, "transaction_timeout_ms": 60_000},
            timeout_s=10)
    assert response.error_code == 0, ErrorCode(response.error_code).name
    return int(response.producer_id), int(response.producer_epoch)


async def _produce(address: tuple[str, int], topic: str, records: bytes, timeout_ms: int
                   ) -> tuple[int, int]:
    """One acks=all Produce of ``records`` to partition 0: (error code, base offset)."""
    async with await KafkaConnection.connect(*address, timeout_s=5) as connection:
        response = await connection.request(PRODUCE, {
            "transactional_id": None, "acks": -1, "timeout_ms": timeout_ms,
            "topic_data": [{"name": topic, "partition_data": [
                {"index": 0, "records": records}]}]}, timeout_s=timeout_ms / 1000 + 10)
    result = response.responses[0].partition_responses[0]
    return int(result.error_code), int(result.base_offset)


def produce_until_answered(address: tuple[str, int], topic: str, records: bytes,
                           timeout_s: float = 30) -> tuple[int, int]:
    """Retries what a client retries (not leader yet, timeouts) until a final answer."""
    retriable = {ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.LEADER_NOT_AVAILABLE,
                 ErrorCode.REQUEST_TIMED_OUT, ErrorCode.NOT_ENOUGH_REPLICAS,
                 ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    deadline = time.monotonic() + timeout_s
    while True:
        error, offset = trio.run(_produce, address, topic, records, 10_000)
        if error not in retriable or time.monotonic() > deadline:
            return error, offset
        time.sleep(0.2)


def test_timed_out_idempotent_batch_retried_into_the_new_leader_is_not_duplicated(
    cluster3: Cluster,
) -> None:
    cluster = cluster3
    topic = unique_topic("retry-dedupe")
    create_topic(cluster, topic, partitions=1)
    leader = partition_states(cluster, topic)[0].leader_id
    old = cluster.nodes[leader]
    producer_id, epoch = trio.run(_init_producer_id, old.address)
    first = build_batch([(None, b"r%d" % i, ()) for i in range(5)], producer_id=producer_id,
                        producer_epoch=epoch, base_sequence=0)
    second = build_batch([(None, b"r%d" % i, ()) for i in range(5, 10)],
                         producer_id=producer_id, producer_epoch=epoch, base_sequence=5)

    # timeout_ms=0: the leader appends, but cannot have every ISR member's fsync in time.
    error, _ = trio.run(_produce, old.address, topic, first, 0)
    assert error == ErrorCode.REQUEST_TIMED_OUT, ErrorCode(error).name
    wait_until(lambda: watermarks(cluster.bootstrap, topic, 1)[0][1] == 5, 20,
               "the timed-out batch to be replicated")
    old.kill()
    new_leader = wait_for(
        lambda: ((n := partition_states(cluster, topic)[0].leader_id) not in (-1, leader)
                 and n) or None, FAILOVER_TIMEOUT_S, "a new leader")

    # The producer never learnt the offset; its retry must get it, not a second copy.
    address = cluster.nodes[new_leader].address
    assert produce_until_answered(address, topic, first) == (ErrorCode.NONE, 0)
    assert produce_until_answered(address, topic, second) == (ErrorCode.NONE, 5)
    assert produce_until_answered(address, topic, first) == (ErrorCode.NONE, 0)
    batches = fetch_raw(cluster.nodes[new_leader].bootstrap, topic, 0)
    assert [b.header.base_offset for b in batches] == [0, 5]
    values = [r.value for b in batches for r in decode_records(b.raw)]
    assert values == [b"r%d" % i for i in range(10)]
