"""The broker's AlterPartition sender: changes queued while a request is in flight go in the
next request together; each caller gets its own partition's answer (no controller, no I/O)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import trio
import trio.testing

from raftlog.broker.alter_partition_sender import (
    AlterPartitionSender,
    AlterPartitionUnansweredError,
    SupersededError,
)
from raftlog.metadata import errors
from raftlog.metadata.image import PartitionImage


class FakeController:
    """Answers each request after ``release`` is set: every partition accepted, except
    those in ``refuse`` (INVALID_UPDATE_VERSION); ``fail`` makes the next send raise."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.release = trio.Event()
        self.refuse: set[int] = set()
        self.fail = False

    async def send(self, body: dict[str, Any]) -> Any:
        self.bodies.append(body)
        await self.release.wait()
        if self.fail:
            self.fail = False
            raise OSError("connection lost")
        return SimpleNamespace(error_code=errors.NONE, topics=[
            SimpleNamespace(topic_name=t["topic_name"], partitions=[
                SimpleNamespace(partition_index=p["partition_index"],
                                error_code=errors.INVALID_UPDATE_VERSION
                                if p["partition_index"] in self.refuse else errors.NONE,
                                partition_epoch=p["partition_epoch"] + 1, isr=p["new_isr"])
                for p in t["partitions"]])
            for t in body["topics"]])


def _image(topic: str, result: Any) -> PartitionImage:
    return PartitionImage(result.partition_index, (1, 2, 3), tuple(result.isr), 1, 1,
                          result.partition_epoch)


async def test_changes_queued_behind_a_request_go_together() -> None:
    controller = FakeController()
    sender = AlterPartitionSender(controller.send, 1, lambda: 7, _image)
    answers: dict[int, tuple[int, PartitionImage | None]] = {}

    async def change(index: int) -> None:
        answers[index] = await sender.alter_isr("t", index, (1, 2), 1, 4)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender.run)
        nursery.start_soon(change, 0)
        await trio.testing.wait_all_tasks_blocked()
        assert len(controller.bodies) == 1  # partition 0 is in flight
        controller.refuse = {2}
        for index in (1, 2, 3):
            nursery.start_soon(change, index)
        await trio.testing.wait_all_tasks_blocked()
        controller.release.set()
        await trio.testing.wait_all_tasks_blocked()
        assert len(answers) == 4
        nursery.cancel_scope.cancel()
    assert [sorted(p["partition_index"] for t in b["topics"] for p in t["partitions"])
            for b in controller.bodies] == [[0], [1, 2, 3]]
    assert controller.bodies[1]["broker_epoch"] == 7
    assert answers[2] == (errors.INVALID_UPDATE_VERSION, _image("t", SimpleNamespace(
        partition_index=2, isr=[1, 2], partition_epoch=5)))
    assert answers[3][0] == errors.NONE and answers[3][1] is not None
    assert answers[3][1].isr == (1, 2) and answers[3][1].partition_epoch == 5


async def test_a_newer_change_supersedes_a_queued_one_and_a_failed_send_is_unknown() -> None:
    controller = FakeController()
    sender = AlterPartitionSender(controller.send, 1, lambda: 7, _image)
    outcomes: list[object] = []

    async def change(index: int, isr: tuple[int, ...]) -> None:
        try:
            outcomes.append(await sender.alter_isr("t", index, isr, 1, 4))
        except (SupersededError, AlterPartitionUnansweredError) as exc:
            outcomes.append(type(exc))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender.run)
        nursery.start_soon(change, 0, (1,))
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(change, 5, (1, 2))  # queued behind partition 0 ...
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(change, 5, (1, 2, 3))  # ... and replaced before it is sent
        await trio.testing.wait_all_tasks_blocked()
        assert outcomes == [SupersededError]
        controller.fail = True
        controller.release.set()
        await trio.testing.wait_all_tasks_blocked()
        assert len(outcomes) == 3
        nursery.cancel_scope.cancel()
    assert outcomes[1] is AlterPartitionUnansweredError  # partition 0's request failed
    assert isinstance(outcomes[2], tuple) and outcomes[2][0] == errors.NONE
    assert [p["new_isr"] for b in controller.bodies[1:] for t in b["topics"]
            for p in t["partitions"]] == [[1, 2, 3]]


async def test_a_caller_that_stopped_waiting_is_not_sent() -> None:
    controller = FakeController()
    sender = AlterPartitionSender(controller.send, 1, lambda: 7, _image)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender.run)
        nursery.start_soon(sender.alter_isr, "t", 0, (1,), 1, 4)
        await trio.testing.wait_all_tasks_blocked()
        with trio.move_on_after(0.01):
            await sender.alter_isr("t", 1, (1,), 1, 4)  # gives up while 0 is in flight
        controller.release.set()
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert len(controller.bodies) == 1





async def test_a_restart_worth_of_changes_goes_in_requests_the_controller_answers_in_time(
) -> None:
    # 10,000 partitions after a restart: requests of 1,000 changes took the controller more
    # than the 1 s they were given, every outcome became unknown and the same oversized
    # requests were sent again for a minute. At most BATCH_MAX_DEFAULT (200) per request.
    controller = FakeController()
    controller.release.set()
    sender = AlterPartitionSender(controller.send, 1, lambda: 7, _image)
    answered = 0

    async def change(index: int) -> None:
        nonlocal answered
        code, _ = await sender.alter_isr("t", index, (1, 2), 1, 4)
        assert code == errors.NONE
        answered += 1

    async with trio.open_nursery() as nursery:
        for index in range(1000):
            nursery.start_soon(change, index)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(sender.run)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    sizes = [sum(len(t["partitions"]) for t in body["topics"]) for body in controller.bodies]
    assert answered == 1000 and sum(sizes) == 1000
    assert max(sizes) <= 200, sizes
