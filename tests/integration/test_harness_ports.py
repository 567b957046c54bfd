"""The test harness's own ports: a broker's two listeners never get the same port.

Goal: ``BrokerProcess`` drew its Kafka and controller ports independently, and once in CI both
draws were 25864, so the node refused to start ("each listener needs its own port") and a
Spark test errored in setup. Method: the port draw forced to repeat itself.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import tests.integration.conftest as harness
from tests.integration.conftest import BrokerProcess


def test_the_controller_port_is_drawn_again_when_it_repeats_the_kafka_port(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    draws = iter([25864, 25864, 25865])
    monkeypatch.setattr(harness, "free_port", lambda: next(draws))
    broker = BrokerProcess(tmp_path, port=harness.free_port(), controller_port=harness.free_port())
    assert (broker.port, broker.controller_port) == (25864, 25865)


def test_a_broker_that_does_not_listen_in_time_is_killed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fixture whose node missed the start deadline left the process running to the end of
    the session (no teardown runs for a fixture that failed in setup)."""
    monkeypatch.setattr(harness, "START_TIMEOUT_S", 0.0)
    broker = BrokerProcess(tmp_path)
    with pytest.raises(RuntimeError, match="did not listen in time"):
        broker.start()
    assert broker.process is not None and broker.process.poll() is not None
