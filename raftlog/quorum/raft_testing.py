"""Real-process Raft clusters for fault-injection tests (``raft_node`` processes on 127.0.0.1).

Like :mod:`raftlog.metadata.testing`, nothing here is used by the broker. Every wait has a
timeout, and :meth:`RaftCluster.close` (also on ``with`` exit) kills every process it started.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import trio

from raftlog.config import QuorumVoter
from raftlog.quorum.raft import RaftQuorum
from raftlog.quorum.raft_settings import RaftSettings

START_TIMEOUT_S: Final = 20.0
REQUEST_TIMEOUT_S: Final = 10.0
SECRET: Final = "raft-testing-secret"
CLUSTER_ID: Final = "raft-testing-cluster"

Message = dict[str, Any]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class RaftNodeProcess:
    """One ``python -m raftlog.quorum.raft_node`` process and its JSON-lines channel."""

    node_id: int
    workdir: Path
    properties: dict[str, str]
    settings: Mapping[str, Any] = field(default_factory=dict)
    pysyncobj_defaults: bool = False
    process: subprocess.Popen[bytes] | None = None
    events: list[Message] = field(default_factory=list)
    _responses: dict[int, queue.Queue[Message]] = field(default_factory=dict)
    _condition: threading.Condition = field(default_factory=threading.Condition)
    _next_id: int = 0

    @property
    def log_path(self) -> Path:
        return self.workdir / f"node-{self.node_id}.log"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start the process and wait for its ``started`` event."""
        assert not self.running
        config = self.workdir / f"node-{self.node_id}.json"
        spec = {
            "properties": self.properties,
            "settings": dict(self.settings),
            "pysyncobj_defaults": self.pysyncobj_defaults,
        }
        config.write_text(json.dumps(spec))
        with self.events_lock():
            self.events.clear()
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "raftlog.quorum.raft_node", "--config", str(config)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                cwd=self.workdir,
            )
        threading.Thread(target=self._read, args=(self.process,), daemon=True).start()
        self.wait_event(lambda e: e.get("event") == "started", START_TIMEOUT_S)

    def events_lock(self) -> threading.Condition:
        return self._condition

    def _read(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            try:
                message: Message = json.loads(line)
            except ValueError:
                continue
            if "event" in message:
                with self._condition:
                    self.events.append(message)
                    self._condition.notify_all()
            elif isinstance(message.get("id"), int):
                self._responses.setdefault(message["id"], queue.Queue()).put(message)

    def request(self, op: str, timeout_s: float = REQUEST_TIMEOUT_S, **args: Any) -> Message:
        """Send one request and wait for its response.

        Raises:
            TimeoutError: no response within ``timeout_s``.
        """
        assert self.process is not None and self.process.stdin is not None
        self._next_id += 1
        request_id = self._next_id
        responses = self._responses.setdefault(request_id, queue.Queue())
        self.process.stdin.write((json.dumps({"id": request_id, "op": op, **args}) + "\n").encode())
        self.process.stdin.flush()
        try:
            return responses.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"node {self.node_id}: no answer to {op} in {timeout_s} s") from None

    def send_only(self, op: str, **args: Any) -> int:
        """Write a request without waiting (e.g. to a stopped process); see :meth:`response`."""
        assert self.process is not None and self.process.stdin is not None
        self._next_id += 1
        self._responses.setdefault(self._next_id, queue.Queue())
        line = json.dumps({"id": self._next_id, "op": op, **args}) + "\n"
        self.process.stdin.write(line.encode())
        self.process.stdin.flush()
        return self._next_id

    def response(self, request_id: int, timeout_s: float = REQUEST_TIMEOUT_S) -> Message:
        try:
            return self._responses[request_id].get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"node {self.node_id}: no answer to #{request_id}") from None

    def wait_event(self, predicate: Callable[[Message], bool], timeout_s: float) -> Message:
        """Wait for an event (past or future) matching ``predicate``.

        Raises:
            TimeoutError: none within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        with self._condition:
            while True:
                for event in self.events:
                    if predicate(event):
                        return event
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self.process is not None and self.process.poll() is not None):
                    raise TimeoutError(f"node {self.node_id}: no matching event in {timeout_s} s")
                self._condition.wait(min(remaining, 0.2))

    def signal(self, signum: int) -> None:
        if self.running:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


class RaftCluster:
    """``voters`` voter processes (ids 1..n) and ``observers`` observers (ids 101..)."""

    def __init__(
        self,
        workdir: Path,
        *,
        voters: int = 3,
        observers: int = 0,
        settings: Mapping[str, Any] | None = None,
        pysyncobj_defaults: bool = False,
    ) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        raft_ports = {node_id: free_port() for node_id in range(1, voters + 1)}
        voters_text = ",".join(f"{i}@127.0.0.1:{port}" for i, port in raft_ports.items())
        self.nodes: dict[int, RaftNodeProcess] = {}
        ids = [*raft_ports, *range(101, 101 + observers)]
        for node_id in ids:
            data = workdir / f"data-{node_id}"
            listeners = f"PLAINTEXT://127.0.0.1:{free_port()}"
            if node_id in raft_ports:
                listeners += f",CONTROLLER://127.0.0.1:{raft_ports[node_id]}"
            properties = {
                "node.id": str(node_id),
                "process.roles": "broker,controller" if node_id in raft_ports else "broker",
                "listeners": listeners,
                "controller.quorum.voters": voters_text,
                "controller.listener.names": "CONTROLLER",
                "log.dirs": str(data),
                "raft.secret": SECRET,
                "cluster.id": CLUSTER_ID,
            }
            self.nodes[node_id] = RaftNodeProcess(
                node_id, workdir, properties, settings or {}, pysyncobj_defaults
            )

    def __enter__(self) -> RaftCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        """Start every node (in parallel) and wait until each reports ``started``."""
        threads = [threading.Thread(target=node.start) for node in self.nodes.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(START_TIMEOUT_S + 5)
        assert all(node.running for node in self.nodes.values()), self.logs()

    def close(self) -> None:
        for node in self.nodes.values():
            node.signal(signal.SIGCONT)
            node.kill()

    def voters(self) -> Iterator[RaftNodeProcess]:
        return (node for node_id, node in self.nodes.items() if node_id < 101)

    def wait_controller(
        self, timeout_s: float, *, after: float = 0.0, among: list[int] | None = None
    ) -> tuple[RaftNodeProcess, Message]:
        """The first node whose ``controller ready`` event has ``time > after``.

        Raises:
            TimeoutError: none within ``timeout_s``.
        """
        candidates = [node for node in self.voters() if (among is None or node.node_id in among)]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = []
            for node in candidates:
                with node.events_lock():
                    found += [
                        (event["time"], node, event)
                        for event in node.events
                        if event.get("event") == "controller"
                        and event["ready"]
                        and event["time"] > after
                    ]
            if found:
                _, node, event = min(found, key=lambda item: item[0])
                return node, event
            time.sleep(0.01)
        raise TimeoutError(f"no controller within {timeout_s} s\n{self.logs()}")

    def current_controller(self, timeout_s: float) -> RaftNodeProcess:
        """The running voter whose status says ``controller_ready``.

        Raises:
            TimeoutError: none within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for node in self.voters():
                if node.running and node.request("status")["status"]["controller_ready"]:
                    return node
            time.sleep(0.02)
        raise TimeoutError(f"no controller within {timeout_s} s\n{self.logs()}")

    def wait_caught_up(self, node: RaftNodeProcess, timeout_s: float) -> None:
        """Wait until the controller sees ``node`` connected with no lag.

        Raises:
            TimeoutError: not within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                status = self.current_controller(deadline - time.monotonic())
            except TimeoutError:
                break
            voters = status.request("status")["status"]["voters"]
            entry = next(v for v in voters if v["node_id"] == node.node_id)
            if entry["connected"] and entry["lag"] == 0:
                return
            time.sleep(0.05)
        raise TimeoutError(f"node {node.node_id} did not catch up in {timeout_s} s")

    def logs(self, tail_bytes: int = 3000) -> str:
        parts = []
        for node in self.nodes.values():
            if node.log_path.exists():
                text = node.log_path.read_bytes()[-tail_bytes:].decode(errors="replace")
                parts.append(f"--- node {node.node_id} ---\n{text}")
        return "\n".join(parts)


# --- In-process clusters (trio) ---------------------------------------------------------------


@contextlib.asynccontextmanager
async def open_quorums(
    directory: Path,
    *,
    voters: int = 3,
    observers: int = 0,
    settings: RaftSettings | None = None,
    secret: str = SECRET,
) -> AsyncIterator[list[RaftQuorum]]:
    """``voters`` RaftQuorums (ids 1..n) and ``observers`` (ids 101..) in this process, opened
    (from trio in the main thread) and closed on exit."""
    voter_list = [QuorumVoter(i, "127.0.0.1", free_port()) for i in range(1, voters + 1)]
    ids = [*(v.node_id for v in voter_list), *range(101, 101 + observers)]
    quorums = [
        RaftQuorum(
            node_id=node_id,
            voters=voter_list,
            metadata_dir=directory / f"node-{node_id}",
            secret=secret,
            is_voter=node_id < 101,
            cluster_id=CLUSTER_ID,
            settings=settings,
        )
        for node_id in ids
    ]
    async with contextlib.AsyncExitStack() as stack:
        for quorum in quorums:
            await stack.enter_async_context(quorum)
        yield quorums


async def wait_for_controller(quorums: list[RaftQuorum], timeout_s: float) -> RaftQuorum:
    """The quorum that becomes the ready controller first.

    Raises:
        TimeoutError: none within ``timeout_s``.
    """
    with trio.move_on_after(timeout_s):
        while True:
            for quorum in quorums:
                if quorum.controller_ready:
                    return quorum
            await trio.sleep(0.01)
    raise TimeoutError(f"no controller within {timeout_s} s")


async def wait_until(condition: Callable[[], bool], timeout_s: float) -> None:
    """Poll ``condition`` (state the Raft tick thread changes, which has no trio event).

    Raises:
        TimeoutError: still false after ``timeout_s``.
    """
    with trio.move_on_after(timeout_s):
        while not condition():  # noqa: ASYNC110 (no event to wait on: another thread's state)
            await trio.sleep(0.01)
        return
    raise TimeoutError(f"condition not reached within {timeout_s} s")
