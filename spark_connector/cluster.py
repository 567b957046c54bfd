"""Driver-side metadata and offset lookups with confluent-kafka.

Only Metadata and ListOffsets requests are sent: the Consumer has a (unique, throw-away)
group.id because confluent-kafka insists on one, but it never subscribes, commits or asks for a
group coordinator's services, so it works against a broker without consumer groups.

A `Cluster` holds one librdkafka client. It is created lazily and never pickled (the readers
that own one drop it in `__getstate__`), so it lives only in the driver-side Python process
that uses it: the streaming source runner keeps it for the life of the query (Spark never
calls `stop()`, see the reference; the process is killed at the end and a librdkafka client
holds nothing that needs a clean close).
"""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from collections.abc import Iterable, Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from spark_connector.errors import (
    RaftLogConnectionError,
    RaftLogOptionError,
    RaftLogTopicError,
)
from spark_connector.offsets import describe
from spark_connector.options import (
    BOOTSTRAP,
    EARLIEST,
    LATEST,
    ClientSettings,
    Subscription,
    TopicPartition,
)

# Errors that mean "nobody answers at that address" rather than a slow cluster.
_UNREACHABLE = {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE,
                KafkaError._TIMED_OUT}
_FAST_FAIL_S = 5.0  # how long a completely unreachable bootstrap list is tolerated at load()
# One ListOffsets attempt. librdkafka keeps sending ListOffsets to the leader in its metadata
# cache, and a leader that died is not replaced there until something refreshes the
# metadata (measured: a long-lived client timed out for minutes after a SIGKILLed leader,
# while its metadata said otherwise after one refresh). So attempts are short, and each
# failed one refreshes the metadata before the next.
_LIST_OFFSETS_ATTEMPT_S = 3.0


_PROPERTY_RE = re.compile(r'(?:configuration property:? |property )"([^"]+)"')


def client_config_error(option_prefix: str, exc: BaseException) -> RaftLogOptionError | None:
    """librdkafka rejects unknown or invalid properties when a client is created; turn that
    into an error naming the kafka.<property> option."""
    error = exc.args[0] if exc.args else None
    text = error.str() if isinstance(error, KafkaError) else str(exc)
    found = _PROPERTY_RE.search(text)
    if found is None:
        return None
    return RaftLogOptionError(f"{option_prefix}{found.group(1)}",
                              f"rejected by the Kafka client (librdkafka): {text}")


class Cluster:
    """Metadata and offsets through one confluent-kafka Consumer (no group membership)."""

    def __init__(self, settings: ClientSettings, isolation_level: str = "read_committed",
                 group_id_prefix: str = "spark-raftlog") -> None:
        self.settings = settings
        self._isolation_level = isolation_level
        self._group_id = f"{group_id_prefix}-driver-{uuid.uuid4().hex[:12]}"
        self._consumer: Consumer | None = None
        self._errors: list[KafkaError] = []

    # -- client --------------------------------------------------------------------------

    def _client(self) -> Consumer:
        if self._consumer is None:
            conf = self.settings.config(**{
                "group.id": self._group_id,
                "enable.auto.commit": False,
                "isolation.level": self._isolation_level,
                "error_cb": self._errors.append,
                "log_level": 0,  # errors are reported through our exceptions instead
            })
            try:
                self._consumer = Consumer(conf)
            except (KafkaException, ValueError) as exc:
                raise client_config_error("kafka.", exc) or RaftLogOptionError(
                    BOOTSTRAP, f"cannot create a Kafka client: {exc}") from None
        return self._consumer

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _unreachable(self, waited_s: float, last: object) -> RaftLogConnectionError:
        broker_errors = [str(e.str()) for e in self._errors if e.code() in _UNREACHABLE]
        detail = broker_errors[-1] if broker_errors else str(last)
        return RaftLogConnectionError(
            f"raftlog: cannot reach the cluster at {BOOTSTRAP}="
            f"'{self.settings.bootstrap_servers}' (waited {waited_s:.1f} s): {detail}")

    # -- metadata ------------------------------------------------------------------------

    def topics(self, *, fail_fast: bool = False) -> dict[str, tuple[int, ...]]:
        """{topic: partitions} of every (non-internal) topic. Asks for all topics, never for
        named ones, so it cannot trigger the broker's auto-creation of a missing topic.

        `fail_fast` gives up after a few seconds when every attempt failed to connect (used
        while a query is being defined); otherwise retries until kafka.default.api.timeout.ms.
        """
        client = self._client()
        started = time.monotonic()
        deadline = started + self.settings.api_timeout_s
        last: object = None
        while True:
            remaining = deadline - time.monotonic()
            try:
                metadata = client.list_topics(timeout=max(0.1, min(1.0, remaining)))
                break
            except KafkaException as exc:
                last = exc
                client.poll(0)  # serve error_cb: the per-broker connection errors
                waited = time.monotonic() - started
                code = exc.args[0].code() if exc.args else None
                if remaining <= 0 or (fail_fast and waited >= _FAST_FAIL_S
                                      and code in _UNREACHABLE):
                    raise self._unreachable(waited, last) from None
                time.sleep(0.1)
        result: dict[str, tuple[int, ...]] = {}
        for name, topic in metadata.topics.items():
            if topic.error is not None or name.startswith("__"):
                continue
            result[name] = tuple(sorted(topic.partitions))
        return result

    def partitions(self, subscription: Subscription, *, strict: bool,
                   fail_fast: bool = False) -> list[TopicPartition]:
        """The topic-partitions a subscription covers now, sorted.

        `strict`: a subscribed or assigned topic/partition that does not exist is an error
        (when a query starts). Otherwise it is left out (a running stream: the data-loss
        checks decide what a vanished partition means).
        """
        topics = self.topics(fail_fast=fail_fast)
        where = f"on {BOOTSTRAP}='{self.settings.bootstrap_servers}'"
        if subscription.kind == "subscribe":
            missing = [t for t in subscription.topics if t not in topics]
            if missing and strict:
                raise RaftLogTopicError(
                    f"raftlog: option 'subscribe': topic(s) {', '.join(missing)} not found "
                    f"{where} (existing: {', '.join(sorted(topics)) or 'none'})")
            return sorted((t, p) for t in subscription.topics if t in topics for p in topics[t])
        if subscription.kind == "subscribePattern":
            return sorted((t, p) for t, parts in topics.items() if subscription.matches(t)
                          for p in parts)
        missing_tps = [(t, p) for t, p in subscription.assigned
                       if t not in topics or p not in topics[t]]
        if missing_tps and strict:
            raise RaftLogTopicError(
                f"raftlog: option 'assign': partition(s) {describe(missing_tps)} not found "
                f"{where}")
        return sorted(tp for tp in subscription.assigned if tp not in missing_tps)

    # -- offsets -------------------------------------------------------------------------

    def list_offsets(self, targets: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """ListOffsets for each partition: target -2 = earliest, -1 = latest (the high
        watermark, or the last stable offset under read_committed: librdkafka sends the
        client's isolation.level), >= 0 = the first offset whose timestamp is >= target.
        Result -1 means no such record (timestamp lookups only)."""
        if not targets:
            return {}
        client = self._client()
        request = [KafkaTopicPartition(t, p, ts) for (t, p), ts in sorted(targets.items())]
        deadline = time.monotonic() + self.settings.api_timeout_s
        while True:
            try:
                answer = client.offsets_for_times(request, timeout=max(
                    0.1, min(_LIST_OFFSETS_ATTEMPT_S, deadline - time.monotonic())))
                failed = [tp for tp in answer if tp.error is not None]
                if not failed:
                    return {(tp.topic, tp.partition): tp.offset for tp in answer}
                error = failed[0].error
                assert error is not None
                if not error.retriable() or time.monotonic() >= deadline:
                    raise RaftLogTopicError(
                        f"raftlog: listing offsets of {failed[0].topic}-{failed[0].partition}"
                        f" failed: {error.str()}")
            except KafkaException as exc:
                error = exc.args[0]
                if not error.retriable() and error.code() not in _UNREACHABLE:
                    raise RaftLogTopicError(f"raftlog: listing offsets failed: {error.str()}"
                                            ) from None
                if time.monotonic() >= deadline:
                    raise self._unreachable(self.settings.api_timeout_s, exc) from None
            self._refresh_metadata()
            time.sleep(0.1)

    def _refresh_metadata(self) -> None:
        """Re-learn partition leaders (after a failover; see _LIST_OFFSETS_ATTEMPT_S)."""
        with contextlib.suppress(KafkaException):  # the next attempt reports what is wrong
            self._client().list_topics(timeout=_LIST_OFFSETS_ATTEMPT_S)

    def earliest(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self.list_offsets({tp: EARLIEST for tp in tps})

    def latest(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self.list_offsets({tp: LATEST for tp in tps})

    def check_producer_config(self) -> None:
        """Create (and drop) a Producer so that librdkafka validates kafka.* properties."""
        from confluent_kafka import Producer

        try:
            producer = Producer(self.settings.config(**{"log_level": 0}))
        except (KafkaException, ValueError) as exc:
            raise client_config_error("kafka.", exc) or RaftLogOptionError(
                BOOTSTRAP, f"cannot create a Kafka producer: {exc}") from None
        producer.flush(0)
