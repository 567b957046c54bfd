"""A process that runs only a :class:`~raftlog.quorum.raft.RaftQuorum`, driven over stdin/stdout.

For fault-injection tests (SIGKILL, SIGSTOP) that need real processes without the rest of the
broker::

    python -m raftlog.quorum.raft_node --config node.json

``node.json``: ``{"properties": {server.properties as a map}, "settings": {RaftSettings fields},
"pysyncobj_defaults": false}``. With ``pysyncobj_defaults`` the Raft timing is pysyncobj's own
(for comparing failover times).

Protocol: one JSON object per line. Requests on stdin carry ``"id"`` and ``"op"``; each gets one
response line ``{"id": ..., ...}`` on stdout. Unsolicited events on stdout carry ``"event"``:
``started`` and ``controller`` (``ready`` true/false, ``term``, wall-clock ``time``), emitted when
``controller_ready`` changes. Logs go to stderr. The process exits when stdin closes.

Requests: ``status``; ``image``; ``propose`` ``{"broker": k}`` (registers broker ``k``: an easy
record to look for); ``propose_stale`` ``{"broker": k, "term": t}`` (submits with controller
term ``t`` straight to Raft, skipping the ready check: what a deposed leader that still believes
it leads would do); ``read_barrier``; ``compact`` (force a snapshot).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import sys
import time
import uuid
from typing import Any, Final

import trio

from raftlog.config import ServerConfig
from raftlog.metadata.records import Command, RegisterBroker, encode_command
from raftlog.metadata.state import ApplyResult
from raftlog.quorum.interface import ProposalTimeoutError, QuorumError, QuorumTimeoutError
from raftlog.quorum.raft import RaftQuorum
from raftlog.quorum.raft_events import Submission
from raftlog.quorum.raft_settings import PYSYNCOBJ_DEFAULT_SETTINGS, RaftSettings

logger = logging.getLogger(__name__)

REQUEST_TIMEOUT_S: Final = 5.0
WATCH_INTERVAL_S: Final = 0.05
READ_CHUNK_BYTES: Final = 65536


def broker_record(broker: int) -> RegisterBroker:
    """The record ``propose`` replicates for broker ``broker`` (a test marker)."""
    return RegisterBroker(broker, "127.0.0.1", 1 + broker % 65535, None, f"marker-{broker}")


def _emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message, default=str) + "\n")
    sys.stdout.flush()


def _result(result: ApplyResult) -> dict[str, Any]:
    return {"ok": result.ok, "error_code": result.error_code, "message": result.message}


def _error(exc: BaseException) -> dict[str, Any]:
    info: dict[str, Any] = {"error": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, ProposalTimeoutError):
        info["outcome_unknown"] = exc.outcome_unknown
    return info


class _Node:
    def __init__(self, quorum: RaftQuorum) -> None:
        self.quorum = quorum

    async def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        try:
            if op == "status":
                view = self.quorum.syncobj.view
                raft = {} if view is None else {
                    "journal_fsyncs": view.journal_fsyncs,
                    "snapshots_written": view.snapshots_written,
                    "snapshots_installed": view.snapshots_installed,
                }  # fmt: skip
                return {"status": dataclasses.asdict(self.quorum.status()), "raft": raft}
            if op == "image":
                return self._image_summary()
            if op == "propose":
                result = await self.quorum.propose(
                    broker_record(int(request["broker"])), timeout_s=REQUEST_TIMEOUT_S
                )
                return _result(result)
            if op == "propose_stale":
                return await self._propose_stale(int(request["broker"]), int(request["term"]))
            if op == "read_barrier":
                await self.quorum.read_barrier(timeout_s=REQUEST_TIMEOUT_S)
                return {"ok": True, **self._image_summary()}
            if op == "compact":
                self.quorum.syncobj.forceLogCompaction()
                return {"ok": True}
        except (QuorumError, ValueError, KeyError) as exc:
            return _error(exc)
        return {"error": "UnknownOp", "message": repr(op)}

    def _image_summary(self) -> dict[str, Any]:
        image = self.quorum.image
        return {
            "version": image.version,
            "controller_term": image.controller_term,
            "controller_node_id": image.controller_node_id,
            "brokers": sorted(image.brokers),
        }

    async def _propose_stale(self, broker: int, term: int) -> dict[str, Any]:
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        outcome: dict[str, Any] = {}

        def deliver(result: object, error: int) -> None:
            if not done.is_set():
                outcome.update(result=result, error=error)
                done.set()

        def on_done(result: object, error: int) -> None:  # tick thread
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(deliver, result, error)

        request_id = uuid.uuid4().hex
        command = Command(broker_record(broker), term, request_id)
        self.quorum.syncobj.submit(encode_command(command), Submission(request_id, on_done))
        with trio.move_on_after(REQUEST_TIMEOUT_S):
            await done.wait()
        if not done.is_set():
            return {"error": "Timeout", "message": "no outcome", "outcome_unknown": True}
        result = outcome["result"]
        if isinstance(result, ApplyResult):
            return {"raft_error": outcome["error"], **_result(result)}
        return {"raft_error": outcome["error"], "ok": False}

    async def watch(self) -> None:
        ready = False
        while True:
            now_ready = self.quorum.controller_ready
            if now_ready != ready:
                ready = now_ready
                _emit(
                    {
                        "event": "controller",
                        "ready": ready,
                        "term": self.quorum.image.controller_term,
                        "time": time.time(),
                    }
                )
            with contextlib.suppress(QuorumTimeoutError):
                await self.quorum.wait_changed(self.quorum.image.version, WATCH_INTERVAL_S)


async def _serve(quorum: RaftQuorum) -> None:
    node = _Node(quorum)
    stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(node.watch)
        _emit({"event": "started", "pid": os.getpid(), "time": time.time()})
        buffer = b""
        while True:
            chunk = await stdin.receive_some(READ_CHUNK_BYTES)
            if not chunk:
                break
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if line.strip():
                    nursery.start_soon(_answer, node, json.loads(line))
        nursery.cancel_scope.cancel()


async def _answer(node: _Node, request: dict[str, Any]) -> None:
    response = await node.handle(request)
    _emit({"id": request.get("id"), **response})


def main(argv: list[str] | None = None) -> None:
    """Entry point: ``python -m raftlog.quorum.raft_node --config node.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    with open(args.config, encoding="utf-8") as file:
        spec = json.load(file)
    logging.basicConfig(
        level=spec.get("log_level", "INFO"),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    base = PYSYNCOBJ_DEFAULT_SETTINGS if spec.get("pysyncobj_defaults") else RaftSettings()
    settings = base.replace(**spec.get("settings", {}))
    config = ServerConfig.from_properties(spec["properties"])

    async def run() -> None:
        async with RaftQuorum.from_config(config, settings=settings) as quorum:
            await _serve(quorum)

    trio.run(run)


if __name__ == "__main__":
    main()
