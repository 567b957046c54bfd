"""What a topic admin request answers when the metadata quorum cannot take its proposal."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from raftlog.broker.topic_admin import TopicAdmin
from raftlog.config import ServerConfig
from raftlog.metadata.records import DeleteTopic, RegisterBroker, UnfenceBroker
from raftlog.metadata.state import MetadataStateMachine
from raftlog.protocol.errors import ErrorCode
from raftlog.quorum.interface import NotControllerError, QuorumError, QuorumTimeoutError
from raftlog.quorum.local import LocalQuorum


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
    admin = TopicAdmin(config, RefusingQuorum(error), trio.lowlevel.checkpoint)  # type: ignore[arg-type]
    answered, message = await admin._propose(DeleteTopic(name="t", topic_id=b"\0" * 16))
    assert answered == code and message


async def test_one_create_topics_request_syncs_the_partitions_once(tmp_path: Path) -> None:
    # Each sync looks at every partition of the image: at 10,000 partitions, one per topic of
    # a request (and each blocking the event loop) was most of the controller's time.
    config = ServerConfig.from_properties({"node.id": "1", "log.dirs": str(tmp_path)})
    syncs = 0

    async def sync() -> None:
        nonlocal syncs
        syncs += 1
        await trio.lowlevel.checkpoint()

    async with LocalQuorum(tmp_path / "meta", MetadataStateMachine()) as quorum:
        for record in (RegisterBroker(1, "h", 1, None, "i"), UnfenceBroker(1)):
            assert (await quorum.propose(record)).ok
        admin = TopicAdmin(config, quorum, sync)
        topics = [SimpleNamespace(name=f"t{i}", num_partitions=2, replication_factor=1,
                                  assignments=(), configs=()) for i in range(5)]
        request = SimpleNamespace(body=SimpleNamespace(topics=topics, validate_only=False))
        create_all = admin.create_topics(request)  # type: ignore[arg-type]
        assert callable(create_all)
        body = await create_all()
        assert body is not None
        assert [t["error_code"] for t in body["topics"]] == [ErrorCode.NONE] * 5
        assert syncs == 1
        assert len(quorum.image.topics) == 5
        # The same request again changes nothing (TOPIC_ALREADY_EXISTS): no pass at all.
        again = await admin.create_topics(request)()  # type: ignore[arg-type, operator, misc]
        assert again is not None
        assert {t["error_code"] for t in again["topics"]} == {ErrorCode.TOPIC_ALREADY_EXISTS}
        assert syncs == 1
