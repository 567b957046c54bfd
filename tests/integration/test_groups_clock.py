"""A stepped wall clock on the coordinator's node does not move group membership.

Found by the Jepsen campaign: under the clock nemesis, half of the queue runs saw consumers
lose their partitions (poll-skip, nonmonotonic-poll; allowed by design for subscribing
consumers, so the runs stayed valid). The coordinator timed sessions on the wall clock, so a
forward step evicted every member at once. Kafka times heartbeats on a monotonic clock; so
does raftlog now (``raftlog.clock.SteadyWallClock``). The node here follows
``RAFTLOG_CLOCK_OFFSET_FILE``, the hook the clock nemesis uses.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from raftlog.clock import ENV_OFFSET_FILE
from tests.integration.conftest import BrokerProcess
from tests.integration.helpers import create_topic, unique_topic

TIMEOUT_S = 60.0
SESSION_TIMEOUT_MS = 6_000
STEP_S = 120  # far beyond the session timeout


def _poll_until(consumer: Any, done: Any, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        consumer.poll(0.1)


def test_a_wall_clock_step_evicts_no_member(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from confluent_kafka import Consumer

    offset_file = tmp_path / "clock-offset"
    offset_file.write_text("0\n")
    monkeypatch.setenv(ENV_OFFSET_FILE, str(offset_file))  # inherited by the node only
    broker = BrokerProcess(tmp_path / "node")
    broker.workdir.mkdir()
    broker.start()
    consumer = None
    try:
        topic = unique_topic("clock-step")
        create_topic(broker.bootstrap, topic, partitions=2)
        events: list[str] = []
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"g-{topic}",
                             "session.timeout.ms": SESSION_TIMEOUT_MS,
                             "heartbeat.interval.ms": 300, "auto.offset.reset": "earliest"})
        consumer.subscribe([topic], on_assign=lambda c, ps: events.append("assign"),
                           on_revoke=lambda c, ps: events.append("revoke"))
        _poll_until(consumer, lambda: "assign" in events, "the first assignment")
        offset_file.write_text(f"{STEP_S}\n")  # the node re-reads it every 0.2 s
        step_end = time.monotonic() + 4.0  # the coordinator ticks many times meanwhile
        _poll_until(consumer, lambda: time.monotonic() > step_end, "the step")
        offset_file.write_text(f"{-STEP_S}\n")  # and back, past the original time
        step_end = time.monotonic() + 2.0
        _poll_until(consumer, lambda: time.monotonic() > step_end, "the step back")
        assert events == ["assign"], f"the clock steps caused a rebalance: {events}"
        log = broker.log_path.read_text()
        assert "no heartbeat within" not in log, "a member was evicted"
        assert "preparing to rebalance" in log  # the log lines this test relies on exist
    finally:
        if consumer is not None:
            consumer.close()
        broker.stop()
