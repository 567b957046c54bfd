"""Cluster health (docs/metrics.md, "Cluster health") and the broker's per-topic traffic and
purgatories (the ``kafka_server_brokertopicmetrics_*`` and
``kafka_server_delayedoperationpurgatory_purgatorysize`` rows of "Requests").

Gauges are computed at scrape time in one pass over this node's partitions and one over the
metadata image; counters are the recorders the parts own (``IsrManager.stats``,
``ControllerService.stats``, ``ProduceApis.stats``, ``FetchApis.stats``). Controller gauges
are reported by the node whose quorum says it is the ready controller, 0 elsewhere, so a sum
over nodes is the cluster's value.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, Metric

from raftlog.metadata.image import NO_LEADER, MetadataImage
from raftlog.metrics.recorders import CounterMap
from raftlog.observe import families
from raftlog.observe.parts import NodeParts

__all__ = ["ClusterCollector"]


class ClusterCollector:
    def __init__(self, parts: NodeParts) -> None:
        self._parts = parts

    def collect(self) -> Iterator[Metric]:
        parts = self._parts
        image = parts.quorum.image
        yield from _replica_manager(parts)
        yield from _controller(parts, image)
        yield from _topic_traffic(parts, image)


def _replica_manager(parts: NodeParts) -> Iterator[Metric]:
    partitions = list(parts.manager.partitions.values())
    leaders = under_replicated = under_min_isr = producer_ids = 0
    for partition in partitions:
        producer_ids += len(partition.producers)
        if not partition.is_leader or partition.deleted:
            continue
        leaders += 1
        if len(partition.isr) < len(partition.replicas):
            under_replicated += 1
        if partition.isr_size < partition.min_insync_replicas:
            under_min_isr += 1
    isr = parts.replicas.isr.stats
    yield families.gauge(
        "kafka_server_replicamanager_underreplicatedpartitions",
        "Partitions this node leads whose ISR is smaller than their replica set.",
        under_replicated)
    yield families.gauge(
        "kafka_server_replicamanager_underminisrpartitioncount",
        "Partitions this node leads whose ISR is smaller than min.insync.replicas.",
        under_min_isr)
    yield families.gauge(
        "kafka_server_replicamanager_partitioncount", "Partition replicas on this node.",
        len(partitions))
    yield families.gauge(
        "kafka_server_replicamanager_leadercount", "Partitions this node leads.", leaders)
    yield families.gauge(
        "kafka_server_replicamanager_produceridcount",
        "Producer ids held in the producer state of this node's partitions.", producer_ids)
    yield families.counter(
        "kafka_server_replicamanager_isrshrinks",
        "ISR shrinks committed for partitions this node leads.", isr.shrinks)
    yield families.counter(
        "kafka_server_replicamanager_isrexpands",
        "ISR expansions committed for partitions this node leads.", isr.expands)


def _controller(parts: NodeParts, image: MetadataImage) -> Iterator[Metric]:
    active = parts.quorum.controller_ready
    offline = partition_count = active_brokers = fenced_brokers = 0
    if active:
        brokers = image.brokers
        for broker in brokers.values():
            if broker.fenced:
                fenced_brokers += 1
            else:
                active_brokers += 1
        for topic in image.topics.values():
            partition_count += len(topic.partitions)
            for state in topic.partitions:
                leader = state.leader
                if leader == NO_LEADER or leader not in brokers or brokers[leader].fenced:
                    offline += 1
    topic_count = len(image.topics) if active else 0
    yield families.gauge(
        "kafka_controller_kafkacontroller_activecontrollercount",
        "1 on the active controller, else 0.", 1 if active else 0)
    yield families.gauge(
        "kafka_controller_kafkacontroller_offlinepartitionscount",
        "Controller: partitions without a live leader.", offline)
    yield families.gauge(
        "kafka_controller_kafkacontroller_globalpartitioncount",
        "Controller: partitions in the cluster.", partition_count)
    yield families.gauge(
        "kafka_controller_kafkacontroller_globaltopiccount",
        "Controller: topics in the cluster.", topic_count)
    yield families.gauge(
        "kafka_controller_kafkacontroller_activebrokercount",
        "Controller: registered, unfenced brokers.", active_brokers)
    yield families.gauge(
        "kafka_controller_kafkacontroller_fencedbrokercount",
        "Controller: registered, fenced brokers.", fenced_brokers)
    controller = parts.controller
    elections = 0 if controller is None else controller.stats.leader_elections.value
    unclean = 0 if controller is None else controller.stats.unclean_leader_elections.value
    yield families.counter(
        "kafka_controller_controllerstats_leaderelections",
        "Leader changes this node committed as controller.", elections)
    yield families.counter(
        "kafka_controller_controllerstats_uncleanleaderelections",
        "Leader changes this node committed as controller that chose a leader from outside"
        " the ISR.", unclean)


def _topic_traffic(parts: NodeParts, image: MetadataImage) -> Iterator[Metric]:
    produce = parts.apis.produce_apis.stats
    fetch = parts.apis.fetch_apis.stats
    topics = image.topics
    yield _per_topic(
        "kafka_server_brokertopicmetrics_bytesin",
        "Bytes of client batches appended as leader, per topic.", produce.bytes_in, topics)
    yield _per_topic(
        "kafka_server_brokertopicmetrics_bytesout",
        "Record bytes served to consumers (not followers), per topic.", fetch.bytes_out,
        topics)
    yield _per_topic(
        "kafka_server_brokertopicmetrics_messagesin",
        "Records of client batches appended as leader, per topic.", produce.messages_in,
        topics)
    yield families.gauge_rows(
        "kafka_server_delayedoperationpurgatory_purgatorysize",
        "Requests waiting: acks=all produces for replication, fetches for data.",
        ["delayedOperation"], [(["Produce"], produce.waiting), (["Fetch"], fetch.waiting)])


def _per_topic(name: str, documentation: str, values: CounterMap,
               topics: Mapping[str, object]) -> Metric:
    """A per-topic counter family without the topics the metadata no longer has (their
    counters stay in the recorder, one integer each, and come back if the name does)."""
    family = CounterMetricFamily(name, documentation, labels=["topic"])
    for topic, value in values.items():
        if topic in topics:
            family.add_metric([str(topic)], value)
    return family
