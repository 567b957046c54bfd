"""Cluster metadata: records and the pure state machine that applies them.

``records`` (what can change) -> ``state`` (pure, deterministic apply, producing immutable
``image`` snapshots). The quorum that orders commands is ``raftlog.quorum``.
"""
