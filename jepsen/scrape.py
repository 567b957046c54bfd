"""Scraping every node's ``/metrics`` during a run (the I/O shell of :mod:`jepsen.metrics`).

One daemon thread per node GETs ``http://<node address>:<metrics port>/metrics`` every
``interval_s`` with a short timeout and appends what :func:`jepsen.metrics.select` keeps to
``metrics.jsonl``. A node that is killed, paused or unreachable costs at most the timeout and
is recorded as missing; nothing here ever blocks the run, and nothing here feeds the checkers.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Final

from jepsen.metrics import Sample, select

INTERVAL_S: Final = 1.0
TIMEOUT_S: Final = 0.8


def fetch(host: str, port: int, timeout_s: float, path: str = "/metrics") -> str:
    """The body of ``GET path`` (``/metrics`` by default); raises OSError (or http.client's
    errors) on failure or any status but 200."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise OSError(f"HTTP {response.status}: {body[:200]!r}")
        return body.decode("utf-8", errors="replace")
    finally:
        connection.close()


class Scraper:
    """Scrapes ``targets`` (node id -> (host, port)) into ``path`` until :meth:`stop`.

    ``start_ns`` is the history's time origin (``time.monotonic_ns()`` when the history
    started), so a sample's ``t`` lines up with the operations' ``time``.
    """

    def __init__(self, targets: Mapping[int, tuple[str, int]], path: Path, start_ns: int,
                 interval_s: float = INTERVAL_S, timeout_s: float = TIMEOUT_S) -> None:
        self.targets = dict(targets)
        self.path = path
        self.start_ns = start_ns
        self.interval_s = interval_s
        self.timeout_s = min(timeout_s, interval_s)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._out: IO[str] | None = None
        self._threads = [threading.Thread(target=self._loop, args=(node, host, port),
                                          name=f"scrape-n{node}", daemon=True)
                         for node, (host, port) in sorted(self.targets.items())]
        self.counts = {"ok": 0, "missed": 0}

    def start(self) -> Scraper:
        self._out = self.path.open("a", encoding="utf-8")
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(self.timeout_s + 2.0)
        with self._lock:
            if self._out is not None:
                self._out.close()
                self._out = None

    def _now_s(self) -> float:
        return (time.monotonic_ns() - self.start_ns) / 1e9

    def _loop(self, node: int, host: str, port: int) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            t = self._now_s()
            try:
                sample = Sample(t, node, True, select(fetch(host, port, self.timeout_s)))
            except Exception as exc:  # down, paused, cut off, half-started: missing
                sample = Sample(t, node, False, error=f"{type(exc).__name__}: {exc}"[:200])
            self._write(sample)
            next_at += self.interval_s
            delay = next_at - time.monotonic()
            if delay < 0:  # a slow scrape: skip the missed slots rather than bunch up
                next_at = time.monotonic()
                delay = 0.0
            self._stop.wait(delay)

    def _write(self, sample: Sample) -> None:
        with self._lock:
            if self._out is None:
                return
            self._out.write(sample.to_json() + "\n")
            self._out.flush()
            self.counts["ok" if sample.ok else "missed"] += 1
