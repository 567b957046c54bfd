"""jepsen.client_log: librdkafka's IMPLICITACK lines found in a run's clients.log.

Goal: a run whose records came back delivered without an offset says, from the client's own
debug lines, that librdkafka inferred the delivery (issue 19's lost batch). Method: the line
librdkafka 2.16.0 wrote in the hunt run, and lines around it that must not match.
"""

from __future__ import annotations

from pathlib import Path

from jepsen.client_log import implicit_acks, implicit_acks_in

LINE = ("2026-11-28 11:35:13,608 IMPLICITACK [rdkafka#producer-181] "
        "[thrd:10.213.192.2:46497/2]: 10.213.192.2:46497/2: jepsen [0] 10 message(s) "
        "implicitly acked by subsequent batch success (msgids 1..10, last acked 20)")
OTHER = ("2026-11-28 11:35:13,608 MSGSET [rdkafka#producer-181] [thrd:10.213.192.2:46497/2]: "
         "10.213.192.2:46497/2: jepsen [0]: MessageSet with 10 message(s) (MsgId 11, "
         "BaseSeq 10) delivered")


def test_an_implicit_ack_is_found_with_its_partition_and_msgids() -> None:
    found = implicit_acks([OTHER, LINE, OTHER])
    assert found["events"] == 1 and found["messages"] == 10
    [example] = found["examples"]
    assert example == {"time": "2026-11-28 11:35:13,608", "client": "rdkafka#producer-181",
                       "topic": "jepsen", "partition": 0, "messages": 10, "msgids": [1, 10]}


def test_a_log_without_implicit_acks_or_no_log_gives_none(tmp_path: Path) -> None:
    assert implicit_acks_in(tmp_path / "clients.log") is None
    (tmp_path / "clients.log").write_text(OTHER + "\n")
    assert implicit_acks_in(tmp_path / "clients.log") is None
    (tmp_path / "clients.log").write_text(f"{OTHER}\n{LINE}\n{LINE}\n")
    found = implicit_acks_in(tmp_path / "clients.log")
    assert found is not None and found["events"] == 2 and found["messages"] == 20
