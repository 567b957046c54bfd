"""Jepsen-style test harness for raftlog (``python -m jepsen``; see docs/jepsen.md).

Pure parts: the history model (:mod:`jepsen.history`, one operation in :mod:`jepsen.ops`), a
Python port of Jepsen's Kafka checker (:mod:`jepsen.checker`, after ``jepsen.tests.kafka``,
with its steps in :mod:`jepsen.anomalies`, :mod:`jepsen.analysis`, :mod:`jepsen.key_checks`,
:mod:`jepsen.order_checks` and :mod:`jepsen.cycles`) with its cycle finder
(:mod:`jepsen.graph`), a linearizability checker (:mod:`jepsen.linear`), the fault schedule
(:func:`jepsen.nemesis.plan`) and the workloads' operation generators.

I/O shell: the cluster's processes (:mod:`jepsen.db`), network namespaces and nftables
partitions (:mod:`jepsen.net`), fault injection (:class:`jepsen.nemesis.Nemesis`), the
clients (:mod:`jepsen.workloads`), one run (:mod:`jepsen.runner`), many runs
(:mod:`jepsen.campaign`), plots and the HTML page (:mod:`jepsen.plots`, :mod:`jepsen.report`).
"""

from __future__ import annotations

__all__ = ["checker", "graph", "history"]
