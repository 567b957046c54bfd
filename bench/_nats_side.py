"""The NATS half of the benchmark: Debian's nats-server (2.9.10) with JetStream, one R1 file
stream, driven by nats-py on asyncio.

NATS 2.9 acknowledges a publish once the message is in the stream's file *without* fsync (it
syncs every 2 minutes and 2.9.10 has no `sync_interval`), whereas raftlog acks after fsync.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import nats
from _nats_server import nats_server_binary
from _support import PhaseResult, ServerProcess, free_port, measure_cpu
from nats.js.api import AckPolicy, ConsumerConfig, PubAck, StorageType, StreamConfig

STREAM = "BENCH"
SUBJECT = "bench"
DURABLE = "bench-reader"
PUBLISH_TIMEOUT_S = 180.0
FETCH_TIMEOUT_S = 5.0
CONSUME_TIMEOUT_S = 180.0


class NatsNode:
    """A standalone nats-server with JetStream, its store in `workdir`, on a free port."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        port = free_port()
        store = workdir / "jetstream"
        self.server = ServerProcess(
            "nats-server",
            [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store),
             "-n", "bench"],
            port, workdir / "nats-server.log",
        )

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.server.port}"

    def start(self) -> float:
        return self.server.start()

    def stop(self) -> int | None:
        return self.server.stop()

    def create_stream(self) -> None:
        asyncio.run(self._create_stream())

    async def _create_stream(self) -> None:
        nc = await nats.connect(self.url)
        try:
            js = nc.jetstream()
            await js.add_stream(StreamConfig(name=STREAM, subjects=[SUBJECT],
                                             storage=StorageType.FILE, num_replicas=1))
        finally:
            await nc.close()


def publish(node: NatsNode, repeat: int, records: int, payload: bytes,
            window: int) -> PhaseResult:
    return asyncio.run(_publish(node, repeat, records, payload, window))


async def _publish(node: NatsNode, repeat: int, records: int, payload: bytes,
                   window: int) -> PhaseResult:
    """Async-publish with at most `window` unacknowledged messages; timed until every ack."""
    nc = await nats.connect(node.url)
    acked = 0
    failed: list[str] = []

    def on_ack(future: asyncio.Future[PubAck]) -> None:
        nonlocal acked
        if future.cancelled():
            failed.append("cancelled")
        elif (error := future.exception()) is not None:
            failed.append(repr(error))
        else:
            acked += 1

    try:
        js = nc.jetstream(publish_async_max_pending=window)
        await js.stream_info(STREAM)  # warm the connection before the clock
        with measure_cpu(node.server.pid) as meter:
            started = time.perf_counter()
            for _ in range(records):
                future = await js.publish_async(SUBJECT, payload)
                future.add_done_callback(on_ack)
            await asyncio.wait_for(js.publish_async_completed(), PUBLISH_TIMEOUT_S)
            seconds = time.perf_counter() - started
        stored = (await js.stream_info(STREAM)).state.messages
    finally:
        await nc.close()
    assert meter.usage is not None
    ok = acked == records and not failed and stored == records
    note = "" if ok else f"{acked} acked, {len(failed)} failed, {stored} stored " \
        f"(first failure: {failed[0] if failed else '-'})"
    return PhaseResult("nats", "produce", repeat, acked, acked * len(payload), seconds,
                       meter.usage, ok=ok, note=note, extra={"window": window})


def consume(node: NatsNode, repeat: int, records: int, record_bytes: int,
            batch: int) -> PhaseResult:
    return asyncio.run(_consume(node, repeat, records, record_bytes, batch))


async def _consume(node: NatsNode, repeat: int, records: int, record_bytes: int,
                   batch: int) -> PhaseResult:
    """A durable pull consumer reads everything in fetch(`batch`) calls, AckAll on each last."""
    nc = await nats.connect(node.url)
    count = 0
    payload_bytes = 0
    bad_size = 0
    timeouts = 0
    try:
        js = nc.jetstream()
        config = ConsumerConfig(ack_policy=AckPolicy.ALL, max_ack_pending=max(batch * 20, 20_000))
        sub = await js.pull_subscribe(SUBJECT, durable=DURABLE, stream=STREAM, config=config)
        with measure_cpu(node.server.pid) as meter:
            started = time.perf_counter()
            deadline = time.monotonic() + CONSUME_TIMEOUT_S
            while count < records and time.monotonic() < deadline:
                try:
                    messages = await sub.fetch(min(batch, records - count),
                                               timeout=FETCH_TIMEOUT_S)
                except nats.errors.TimeoutError:
                    timeouts += 1
                    continue
                for message in messages:
                    size = len(message.data)
                    bad_size += size != record_bytes
                    payload_bytes += size
                count += len(messages)
                if messages:
                    await messages[-1].ack()
            seconds = time.perf_counter() - started
        await sub.unsubscribe()
    finally:
        await nc.close()
    assert meter.usage is not None
    ok = count == records and bad_size == 0
    note = "" if ok else f"read {count}/{records}, {bad_size} wrong sizes, {timeouts} timeouts"
    return PhaseResult("nats", "consume", repeat, count, payload_bytes, seconds, meter.usage,
                       ok=ok, note=note, extra={"batch": batch, "fetch_timeouts": timeouts})
