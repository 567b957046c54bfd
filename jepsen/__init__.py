"""Jepsen-style test harness for raftlog.

This package holds the history model (:mod:`jepsen.history`), a Python port of
Jepsen's Kafka checker (:mod:`jepsen.checker`, after ``jepsen.tests.kafka``)
and a small cycle finder (:mod:`jepsen.graph`).
"""

from __future__ import annotations

__all__ = ["checker", "graph", "history"]
