"""What a topic admin request answers when the metadata quorum cannot take its proposal."""

from __future__ import annotations

from typing import Any

import pytest

from raftlog.broker.topic_admin import TopicAdmin
from raftlog.config import ServerConfig
from raftlog.metadata.records import DeleteTopic
from raftlog.protocol.errors import ErrorCode
from raftlog.quorum.interface import NotControllerError, QuorumError, QuorumTimeoutError


class RefusingQuorum:
    """A quorum whose every proposal fails with ``error`` (the failure under test)."""

    def __init__(self, error: QuorumError) -> None:
        self.error = error

    async def propose(self, record: Any, *, timeout_s: float) -> Any:
        raise self.error


@pytest.mark.parametrize(("error", "code"), [
    # Nothing was applied: Kafka's NOT_CONTROLLER, which clients retry at the new controller
    # (a scale run answered REQUEST_TIMED_OUT here after an election, and the create failed).
    (NotControllerError("node 2 is not the ready controller"), ErrorCode.NOT_CONTROLLER),
    # The outcome is unknown: a timeout, as before.
    (QuorumTimeoutError("no commit in time"), ErrorCode.REQUEST_TIMED_OUT),
])
async def test_a_failed_proposal_answers_the_kafka_error_for_what_is_known(
        error: QuorumError, code: int) -> None:
    config = ServerConfig.from_properties({"node.id": "1", "log.dirs": "/nonexistent"})
    admin = TopicAdmin(config, RefusingQuorum(error), lambda: None)  # type: ignore[arg-type]
    answered, message = await admin._propose(DeleteTopic(name="t", topic_id=b"\0" * 16))
    assert answered == code and message
