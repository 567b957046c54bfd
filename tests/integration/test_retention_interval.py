"""A broker honours ``log.retention.check.interval.ms`` from server.properties: with 200 ms it
deletes expired segments within seconds, where its 30 s default would not have run yet."""

from __future__ import annotations

import time

from raftlog.partition.batch import build_batch
from tests.integration.conftest import BrokerProcess
from tests.integration.helpers import (
    EARLIEST,
    broker_log_problems,
    create_topic,
    list_offsets,
    produce_raw,
    unique_topic,
    wait_until,
)

HOUR_MS = 3_600_000
# Generous for a loaded machine, yet well inside the 30 s a default broker waits before its
# first check (the broker starts before the wait begins, so ignoring the property fails).
DELETION_WAIT_S = 15.0


def test_short_check_interval_deletes_expired_segments(
        fast_retention_broker: BrokerProcess) -> None:
    broker = fast_retention_broker
    started = time.monotonic()
    topic = unique_topic("retention-interval")
    create_topic(broker.bootstrap, topic, 1, {"segment.bytes": "1024", "retention.ms": "60000"})
    old_ms = int(time.time() * 1000) - HOUR_MS  # past retention.ms on arrival
    # Two of these batches fill a 1024-byte segment: six make three segments. Retention runs
    # every 200 ms, so on a busy machine it may delete the first ones before the last produce
    # returns (a listing of the files here once saw only the active segment left).
    for i in range(6):
        produce_raw(broker.bootstrap, topic, 0,
                    build_batch([(None, b"x" * 400, ())], timestamp_ms=old_ms + i))
    segments_made = 3

    def start_offset() -> int:
        return list_offsets(broker.bootstrap, topic, [0], EARLIEST)[0]

    wait_until(lambda: start_offset() > 0, DELETION_WAIT_S,
               "retention to delete the expired segments", interval_s=0.2)
    assert time.monotonic() - started < 30, "too slow to tell the property from the default"
    assert len(list((broker.data_dir / f"{topic}-0").glob("*.log"))) < segments_made
    assert broker_log_problems(broker.log_path.read_text()) == []
