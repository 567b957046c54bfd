"""How raftlog configures pysyncobj: its timing and sizing, and the configurations it refuses.

The findings' (``/work/shared/reference/pysyncobj-findings.md``) corrections that are settings:

* **8-B** (the first RequestVote over an idle follower link is dropped): ``connectionTimeout=30``
  as the findings recommend (:attr:`RaftSettings.connection_timeout_s`); the keepalive that
  keeps links from going idle is sent by :class:`~raftlog.quorum.raft_syncobj.RaftSyncObj`.
* **Pickle RCE**, **journal without snapshot file**, fork in a threaded process, dynamic
  membership, queued commands applying late, batches over the Raft message cap:
  :func:`check_conf` refuses them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pysyncobj import SyncObjConf

from raftlog.quorum.raft_transport import RAFT_MESSAGE_MAX_BYTES, largest_message_bytes


class UnsafeRaftConfigError(ValueError):
    """A pysyncobj configuration that the findings showed to lose data or expose the node."""


@dataclass(frozen=True, slots=True)
class RaftSettings:
    """Timing and sizing of the Raft layer (findings §10.4).

    Attributes:
        raft_min_timeout_s, raft_max_timeout_s: Randomised election timeout range.
        append_entries_period_s: Heartbeat interval.
        connection_timeout_s: A link with nothing read for this long is dropped (8-B: large).
        connection_retry_s: Reconnect interval.
        leader_fallback_timeout_s: A leader without a majority's responses for this long steps
            down (pysyncobj's CheckQuorum; its default of 30 s lets a partitioned leader act).
        keepalive_interval_s: Send a no-op message on every link this often, so no link is idle
            (8-B); None sends none (pysyncobj's behaviour).
        commands_queue_size: Bound of pysyncobj's command queue (QUEUE_FULL beyond).
        log_compaction_min_entries, log_compaction_min_time_s: Snapshot when the log holds this
            many entries, or this long after the previous snapshot.
        auto_tick_period_s: The tick thread's poll timeout.
        bind_attempts, bind_retry_s: Give up binding the Raft port after this many tries.
    """

    raft_min_timeout_s: float = 0.35
    raft_max_timeout_s: float = 0.9
    append_entries_period_s: float = 0.05
    connection_timeout_s: float = 30.0
    connection_retry_s: float = 0.5
    leader_fallback_timeout_s: float = 1.0
    keepalive_interval_s: float | None = 1.0
    commands_queue_size: int = 1024
    log_compaction_min_entries: int = 5000
    log_compaction_min_time_s: float = 300.0
    auto_tick_period_s: float = 0.05
    bind_attempts: int = 20
    bind_retry_s: float = 0.25

    def replace(self, **changes: Any) -> RaftSettings:
        """A copy with ``changes`` applied."""
        values = {name: getattr(self, name) for name in self.__dataclass_fields__}
        values.update(changes)
        return RaftSettings(**values)


# pysyncobj's own defaults, for measuring what raftlog's settings change (failover tests).
PYSYNCOBJ_DEFAULT_SETTINGS: Final = RaftSettings(
    raft_min_timeout_s=0.4,
    raft_max_timeout_s=1.4,
    append_entries_period_s=0.1,
    connection_timeout_s=3.5,
    connection_retry_s=5.0,
    leader_fallback_timeout_s=30.0,
    keepalive_interval_s=None,
)


def build_conf(
    settings: RaftSettings,
    *,
    journal_file: Path,
    snapshot_file: Path,
    password: str,
    bind_address: str | None,
) -> SyncObjConf:
    """The pysyncobj configuration raftlog runs with (callbacks are set by RaftSyncObj)."""
    conf = SyncObjConf(
        password=password,
        autoTick=True,
        autoTickPeriod=settings.auto_tick_period_s,
        appendEntriesUseBatch=False,
        raftMinTimeout=settings.raft_min_timeout_s,
        raftMaxTimeout=settings.raft_max_timeout_s,
        appendEntriesPeriod=settings.append_entries_period_s,
        connectionTimeout=settings.connection_timeout_s,
        connectionRetryTime=settings.connection_retry_s,
        leaderFallbackTimeout=settings.leader_fallback_timeout_s,
        commandsQueueSize=settings.commands_queue_size,
        commandsWaitLeader=False,
        logCompactionMinEntries=settings.log_compaction_min_entries,
        logCompactionMinTime=settings.log_compaction_min_time_s,
        journalFile=str(journal_file),
        fullDumpFile=str(snapshot_file),
        useFork=False,
        dynamicMembershipChange=False,
        bindAddress=bind_address,
        maxBindRetries=settings.bind_attempts,
        bindRetryTime=settings.bind_retry_s,
    )
    check_conf(conf)
    return conf


def check_conf(conf: SyncObjConf) -> None:
    """Refuse configurations the findings showed to be unsafe.

    Raises:
        UnsafeRaftConfigError: listing every problem found.
    """
    problems = []
    if not conf.journalFile or not conf.fullDumpFile:
        # findings §6: compaction truncates a journal that has no snapshot file: silent loss.
        problems.append(
            f"journalFile ({conf.journalFile!r}) and fullDumpFile ({conf.fullDumpFile!r}) must "
            "both be set: a journal without a snapshot file loses everything at compaction"
        )
    if not conf.password:
        problems.append("password must be set: without it the Raft port unpickles anyone's bytes")
    if conf.useFork:
        problems.append("useFork must be False (fork() in a threaded process can hang)")
    if conf.dynamicMembershipChange:
        problems.append("dynamicMembershipChange is not supported (open race, pysyncobj #89)")
    if conf.commandsWaitLeader:
        problems.append("commandsWaitLeader must be False: a queued command could apply late")
    largest = largest_message_bytes(conf.appendEntriesBatchSizeBytes, conf.logCompactionBatchSize)
    if largest > RAFT_MESSAGE_MAX_BYTES:
        # Peers refuse frames over the cap: a batch near it would never reach them.
        problems.append(
            f"appendEntriesBatchSizeBytes/logCompactionBatchSize allow {largest}-byte "
            f"messages, over the {RAFT_MESSAGE_MAX_BYTES}-byte cap on Raft messages"
        )
    if problems:
        raise UnsafeRaftConfigError("; ".join(problems))
