"""The `raftlog` command line against a real node: topics, console producer and consumer."""

from __future__ import annotations

import subprocess
import sys

from tests.integration.conftest import BrokerProcess


def _raftlog(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "raftlog", *args], input=stdin,
                          capture_output=True, text=True, timeout=60)


def test_topics_produce_consume_round_trip(broker: BrokerProcess) -> None:
    bootstrap = ["--bootstrap-server", broker.bootstrap]
    created = _raftlog("topics", "create", *bootstrap, "--topic", "cli", "--partitions", "3",
                       "--config", "retention.ms=86400000")
    assert created.returncode == 0, created.stderr
    again = _raftlog("topics", "create", *bootstrap, "--topic", "cli")
    assert again.returncode == 1
    assert "TOPIC_ALREADY_EXISTS" in again.stderr

    lines = [f"key{i % 7}:value{i}" for i in range(300)]
    produced = _raftlog("produce", "cli", *bootstrap, "--key-separator", ":",
                        stdin="\n".join(lines) + "\n")
    assert produced.returncode == 0, produced.stderr

    consumed = _raftlog("consume", "cli", *bootstrap, "--from-beginning", "--print-key",
                        "--max-messages", "300")
    assert consumed.returncode == 0, consumed.stderr
    rows = [row.split("\t") for row in consumed.stdout.splitlines()]
    assert sorted(f"{k}:{v}" for k, v in rows) == sorted(lines)
    # One key always lands on one partition, so per-key order is the produce order.
    by_key: dict[str, list[int]] = {}
    for key, value in rows:
        by_key.setdefault(key, []).append(int(value.removeprefix("value")))
    assert all(values == sorted(values) for values in by_key.values())

    described = _raftlog("topics", "describe", *bootstrap, "--topic", "cli")
    assert "PartitionCount: 3" in described.stdout
    assert "retention.ms=86400000" in described.stdout
    listed = _raftlog("topics", "list", *bootstrap)
    assert listed.stdout.split() == ["cli"]
    deleted = _raftlog("topics", "delete", *bootstrap, "--topic", "cli")
    assert deleted.returncode == 0, deleted.stderr
    assert _raftlog("topics", "list", *bootstrap).stdout.split() == []


def test_unreachable_bootstrap_is_a_clear_error() -> None:
    result = _raftlog("topics", "list", "--bootstrap-server", "127.0.0.1:1")
    assert result.returncode == 2
    assert "127.0.0.1:1" in result.stderr


def test_bad_config_names_the_property(tmp_path: object) -> None:
    from pathlib import Path

    config = Path(str(tmp_path)) / "bad.properties"
    config.write_text("node.id=notanumber\nlog.dirs=/tmp/x\n")
    result = _raftlog("server", "--config", str(config))
    assert result.returncode == 2
    assert "node.id" in result.stderr
