"""Transaction-coordinator metrics (docs/metrics.md, "Groups and transactions"): the
transactions of the ``__transaction_state`` partitions this node leads, counted at scrape time,
and the coordinator's completion and timeout counters (``raftlog.txn.coordinator.TxnStats``).
Only a transactional id's coordinator reports it, so a sum over nodes is the cluster's value.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from raftlog.observe.families import counter, gauge
from raftlog.observe.parts import NodeParts
from raftlog.txn.coordinator import OPEN_STATES, TxnState

__all__ = ["TXN_RESULTS", "TxnCollector"]

TXN_RESULTS = ("commit", "abort")


class TxnCollector:
    def __init__(self, parts: NodeParts) -> None:
        self._parts = parts

    def collect(self) -> Iterator[Metric]:
        service = self._parts.txn
        if service is None:  # a controller-only node coordinates no transactions
            return
        ongoing = ids = 0
        # Copies first (list() of a dict runs no Python code): a scrape on another thread
        # must not see the coordinator's dicts change size under it.
        for state in list(service.state_log.owned.values()):
            for metadata in list(state.txns.values()):
                if metadata.state == TxnState.DEAD:
                    continue
                ids += 1
                if metadata.state in OPEN_STATES:
                    ongoing += 1
        yield gauge("raftlog_txn_ongoing",
                    "Transactions open on this coordinator (Ongoing, PrepareCommit or "
                    "PrepareAbort)", ongoing)
        yield gauge("raftlog_txn_transactional_ids",
                    "Transactional ids this coordinator holds", ids)
        completed = CounterMetricFamily("raftlog_txn_completed", "Transactions completed",
                                        labels=["result"])
        for result in TXN_RESULTS:  # both, from 0, so that rate() sees the first one
            completed.add_metric([result], service.stats.completed.get(result))
        yield completed
        yield counter("raftlog_txn_timeouts",
                      "Transactions this coordinator aborted on transaction.timeout.ms",
                      service.stats.timeouts)
