"""Partition replication: roles from the metadata image, the task tree, the HW checkpoint.

The trio shell around ``PartitionManager`` for replicated partitions (see
``docs/cluster-design.md``, "Replication"). One ``ReplicaManager`` per node:

* ``apply_image(image)`` derives each local partition's role and tells the partition
  (``Partition.become_leader`` / ``become_follower``). Leader (image leader == this node): its
  epoch starts at its log end in the epoch cache, follower fetches are served by
  ``FetchApis.fetch`` (which calls ``record_follower_fetch``). Follower: the partition joins the
  ``LeaderFetcher`` of its leader. A new leader epoch is a role change even for the same leader.
* the follower side, one ``LeaderFetcher`` task per leader node: ``raftlog.replication.fetcher``.
* the leader side, follower positions and ISR changes through the injected ``alter_isr`` (the
  AlterPartition RPC): ``raftlog.replication.leader``.
* a ``replication-offset-checkpoint`` of high watermarks (Kafka's name and format), so a
  restarted leader shows consumers what was committed before followers fetch again.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import trio

from raftlog.client.connection import ClusterLogin
from raftlog.metadata.image import NO_LEADER, MetadataImage, PartitionImage, TopicImage
from raftlog.partition.files import write_atomically
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import Partition, now_ms
from raftlog.replication.fetcher import FetcherStats, FollowerAssignment, LeaderFetcher
from raftlog.replication.leader import AlterIsr, IsrManager
from raftlog.replication.load_progress import LoadProgress
from raftlog.replication.settings import PartitionKey, ReplicationSettings

__all__ = ["HW_CHECKPOINT", "ReplicaManager"]

log = logging.getLogger(__name__)

HW_CHECKPOINT = "replication-offset-checkpoint"


class ReplicaManager:
    """Roles, fetchers and ISR maintenance for one node's partitions (see module docstring).

    Call ``apply_image`` (or step through ``apply_image_steps``) with every new metadata
    image, and run ``run``
    in the node's nursery: it owns the fetcher tasks, the ISR checks and the HW checkpoint.
    """

    def __init__(
        self,
        manager: PartitionManager,
        *,
        settings: ReplicationSettings | None = None,
        alter_isr: AlterIsr | None = None,
        incarnation_id: str | None = None,
        login: ClusterLogin | None = None,
    ) -> None:
        self.manager = manager
        self.node_id = manager.node_id
        # How fetchers prove to leaders that they are this broker (raft.secret); None only
        # where no other node exists to fetch from.
        self.login = login
        self.settings = ReplicationSettings() if settings is None else settings
        # When set, this node leads only once the image holds its registration with this
        # incarnation, unfenced: an image replayed at start-up may name it leader of an epoch
        # whose unflushed tail it lost in a crash, and followers may have that tail.
        self.incarnation_id = incarnation_id
        self._may_lead_logged: bool | None = None
        self.image: MetadataImage | None = None
        self.fetchers: dict[int, LeaderFetcher] = {}
        # What every fetcher of this node did as a follower (raftlog.observe reads it).
        self.fetcher_stats = FetcherStats()
        self._followed: dict[PartitionKey, FollowerAssignment] = {}
        # The partition states applied with success, and what else they were applied under
        # (``apply_image_steps`` skips a state object it already applied on the same basis).
        self._applied: dict[PartitionKey, PartitionImage] = {}
        self._applied_topics: dict[str, TopicImage] = {}
        self._applied_basis: object = None
        self._nursery: trio.Nursery | None = None
        self._hw_checkpoint_path = manager.data_dir / HW_CHECKPOINT
        self._checkpointed_hws = _read_hw_checkpoint(self._hw_checkpoint_path)
        self._written_hws: dict[PartitionKey, int] = dict(self._checkpointed_hws)
        manager.is_replica_eligible = self.is_eligible
        manager.on_corrupt = self.note_corrupt
        self.isr = IsrManager(manager, self.node_id, self.settings, alter_isr, self.is_eligible,
                              self.registered_epoch)

    # --- the task tree ---------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Runs fetchers, ISR checks and HW checkpoints until cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for fetcher in self.fetchers.values():
                    fetcher.start(nursery)
                await nursery.start(self.isr.run)
                nursery.start_soon(self._run_hw_checkpoints)
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            try:
                self.write_hw_checkpoint()
            except OSError as exc:
                log.error("cannot write %s: %s", self._hw_checkpoint_path, exc)

    # --- roles from metadata ---------------------------------------------------------------

    def apply_image(self, image: MetadataImage,
                    topic_defaults: Mapping[str, str] | None = None) -> None:
        """Bring local partitions in step with ``image`` at once (``apply_image_steps``)."""
        for _ in self.apply_image_steps(image, topic_defaults):
            pass

    def apply_image_steps(self, image: MetadataImage,
                          topic_defaults: Mapping[str, str] | None = None) -> Iterator[None]:
        """Bring local partitions in step with ``image``: open assigned ones, set each one's
        role, delete the ones no longer assigned here. ``topic_defaults`` are the broker's
        topic-level defaults (``ServerConfig.topic_defaults()``).

        Yields after each partition it opened or gave a role, so that a caller can let other
        tasks run (a role change writes the epoch checkpoint: a thousand of them must not
        hold the heartbeat back). Only partitions whose state object changed since it was
        last applied are looked at (images share unchanged topics and partitions), unless
        this node's leadership right, a broker or the topic defaults changed: then all are."""
        self.image = image
        defaults = {"replica.lag.time.max.ms": str(self.settings.replica_lag_time_max_ms),
                    **(topic_defaults or {})}
        wanted: set[PartitionKey] = set()
        may_lead = self._may_lead(image)
        basis = (may_lead, tuple(sorted(defaults.items())), image.brokers)
        if basis != self._applied_basis:
            self._applied.clear()
            self._applied_topics.clear()
            self._applied_basis = basis
        progress = LoadProgress(lambda: progress.opened + self._assigned_count(image),
                                time.monotonic)
        for topic in image.topics.values():
            configs = {**defaults, **dict(topic.configs)}
            if self._applied_topics.get(topic.name) is not topic:  # configs may have changed
                self.manager.update_configs(topic.name, configs)
                self._applied_topics[topic.name] = topic
            for state in topic.partitions:
                if self.node_id not in state.replicas:
                    continue
                key = (topic.name, state.partition)
                wanted.add(key)
                if self._applied.get(key) is state and key in self.manager.partitions:
                    continue
                opening = key not in self.manager.partitions
                if self._apply_state(topic.name, state, configs, may_lead):
                    self._applied[key] = state
                if opening and key in self.manager.partitions and \
                        (line := progress.note_opened()) is not None:
                    log.info("%s", line)
                yield
        if (line := progress.finished()) is not None:
            log.info("%s", line)
        for name in [name for name in self._applied_topics if name not in image.topics]:
            del self._applied_topics[name]
        for key in list(self.manager.partitions):
            if key not in wanted:
                self._applied.pop(key, None)
                self._stop_following(key)
                self.manager.remove_partition(*key)
        self._stop_idle_fetchers()

    def _assigned_count(self, image: MetadataImage) -> int:
        """Partitions assigned here that are not open yet (what this sync has left to load)."""
        return sum(
            1 for topic in image.topics.values() for state in topic.partitions
            if self.node_id in state.replicas
            and (topic.name, state.partition) not in self.manager.partitions
        )

    def _apply_state(self, topic: str, state: PartitionImage, configs: Mapping[str, str],
                     may_lead: bool) -> bool:
        """One partition's role from ``state``; False when it could not be opened or given
        its role (it stays offline here and the next image retries)."""
        partition = self._open(topic, state, configs)
        if partition is None:
            return False
        try:
            if state.leader == self.node_id and may_lead:
                self.become_leader(partition, state)
            elif state.leader == self.node_id:
                self.become_follower(partition, dataclasses.replace(
                    state, leader=NO_LEADER))  # offline here until unfenced
            else:
                self.become_follower(partition, state)
        except OSError as exc:
            # The epoch checkpoint or a truncation failed: the partition stays offline here
            # (NOT_LEADER_OR_FOLLOWER) and the next image retries.
            log.error("cannot change the role of %s-%d: %s", topic, state.partition, exc)
            self._go_offline(partition)
            return False
        return True

    def _may_lead(self, image: MetadataImage) -> bool:
        if self.incarnation_id is None:
            return True
        me = image.brokers.get(self.node_id)
        ready = me is not None and me.incarnation_id == self.incarnation_id and not me.fenced
        if ready != self._may_lead_logged:
            self._may_lead_logged = ready
            log.info("node %d %s", self.node_id, "may lead partitions" if ready else
                     "is not registered and unfenced in this incarnation: leading nothing")
        return ready

    def _open(self, topic: str, state: PartitionImage, configs: Mapping[str, str]
              ) -> Partition | None:
        existing = self.manager.get(topic, state.partition)
        if existing is not None:
            return existing
        try:
            partition = self.manager.ensure_partition(topic, state.partition, configs,
                                                      state.leader_epoch)
        except OSError as exc:
            # Out of file descriptors or disk: this partition stays offline (clients get
            # NOT_LEADER_OR_FOLLOWER and retry) and the next metadata change retries the open.
            log.error("cannot open partition %s-%d: %s", topic, state.partition, exc)
            return None
        partition.await_role(self._checkpointed_hws.get((topic, state.partition)),
                             replicated=len(state.replicas) > 1)
        return partition

    def become_leader(self, partition: Partition, state: PartitionImage) -> None:
        """This node leads ``partition`` at ``state.leader_epoch`` (idempotent per epoch; an
        image with the same epoch only updates replicas and ISR)."""
        if not partition.leads_epoch(state.leader_epoch):
            self._stop_following((partition.topic, partition.index))
        if partition.become_leader(self.node_id, state, now_ms()):
            log.info("partition %s-%d: leader at epoch %d, ISR %s, offsets [%d, %d), HW %d",
                     partition.topic, partition.index, state.leader_epoch, list(state.isr),
                     partition.log.log_start_offset, partition.log.log_end_offset,
                     partition.high_watermark)
            self.manager.note_role_change(partition)
        if partition.corrupt_offset is not None:
            self.isr.resign(partition)  # a good ISR member should lead instead
        self.manager.update_high_watermark(partition)

    def become_follower(self, partition: Partition, state: PartitionImage) -> None:
        """This node follows ``state.leader`` (or nobody, when it is -1) at its epoch."""
        key = (partition.topic, partition.index)
        if not partition.become_follower(state, following=key in self._followed):
            return  # same leader, same epoch: nothing to do
        self._stop_following(key)
        self.manager.note_role_change(partition)
        log.info("partition %s-%d: follower of %d at epoch %d, offsets [%d, %d)",
                 partition.topic, partition.index, state.leader, state.leader_epoch,
                 partition.log.log_start_offset, partition.log.log_end_offset)
        if state.leader == NO_LEADER:
            return
        assignment = FollowerAssignment(partition, state.leader, state.leader_epoch)
        self._followed[key] = assignment
        fetcher = self.fetchers.get(state.leader)
        if fetcher is None:
            fetcher = self.fetchers[state.leader] = LeaderFetcher(self, state.leader)
            if self._nursery is not None:
                fetcher.start(self._nursery)
        fetcher.add(assignment)

    def note_corrupt(self, partition: Partition) -> None:
        """``partition``'s log found a corrupt batch (a read or the scrub, ``log_verify``).
        A leader hands leadership to another ISR member (``IsrManager.resign``); a follower's
        fetcher truncates it away and fetches the good copy once this replica is out of the
        ISR (``LeaderFetcher``)."""
        if partition.is_leader:
            self.isr.resign(partition)
            return
        assignment = self._followed.get((partition.topic, partition.index))
        fetcher = None if assignment is None else self.fetchers.get(assignment.leader_id)
        if fetcher is not None:
            fetcher.wake()

    def _go_offline(self, partition: Partition) -> None:
        self._stop_following((partition.topic, partition.index))
        partition.go_offline()
        self.manager.note_role_change(partition)

    def _stop_following(self, key: PartitionKey) -> None:
        assignment = self._followed.pop(key, None)
        if assignment is None:
            return
        fetcher = self.fetchers.get(assignment.leader_id)
        if fetcher is not None:
            fetcher.remove(assignment)

    def _stop_idle_fetchers(self) -> None:
        for leader_id, fetcher in list(self.fetchers.items()):
            if not fetcher.assignments:
                fetcher.stop()
                del self.fetchers[leader_id]

    def is_following(self, assignment: FollowerAssignment) -> bool:
        """Whether ``assignment`` is still what this node should be doing."""
        partition = assignment.partition
        return (self._followed.get(assignment.key) is assignment and not partition.deleted
                and not partition.is_leader)

    def is_eligible(self, node_id: int) -> bool:
        """Whether a broker may join an ISR: registered and not fenced."""
        image = self.image
        if image is None:
            return True
        broker = image.brokers.get(node_id)
        return broker is not None and not broker.fenced

    def record_follower_fetch(self, partition: Partition, replica_id: int,
                              fetch_offset: int, log_start_offset: int = -1,
                              broker_epoch: int = -1) -> bool:
        """A follower fetched (``IsrManager.record_follower_fetch``)."""
        return self.isr.record_follower_fetch(partition, replica_id, fetch_offset,
                                              log_start_offset, broker_epoch)

    def registered_epoch(self, node_id: int) -> int | None:
        """The broker epoch the metadata has for ``node_id`` now (-1: not registered), or
        None without metadata (unit tests that drive roles by hand)."""
        image = self.image
        if image is None:
            return None
        broker = image.brokers.get(node_id)
        return -1 if broker is None else broker.epoch

    def broker_address(self, node_id: int) -> tuple[str, int] | None:
        image = self.image
        broker = None if image is None else image.brokers.get(node_id)
        return None if broker is None else (broker.host, broker.port)

    # --- high-watermark checkpoint ---------------------------------------------------------

    async def _run_hw_checkpoints(self) -> None:
        while True:
            await trio.sleep(self.settings.hw_checkpoint_interval_ms / 1000)
            hws = self._current_hws()
            if hws != self._written_hws:
                data = _hw_checkpoint_bytes(hws)
                try:
                    await trio.to_thread.run_sync(write_atomically, self._hw_checkpoint_path,
                                                  data)
                except OSError as exc:
                    log.error("cannot write %s: %s", self._hw_checkpoint_path, exc)
                    continue
                self._written_hws = hws

    def write_hw_checkpoint(self) -> None:
        """Write the high-watermark checkpoint now (blocking), if anything changed."""
        hws = self._current_hws()
        if hws != self._written_hws:
            write_atomically(self._hw_checkpoint_path, _hw_checkpoint_bytes(hws))
            self._written_hws = hws

    def _current_hws(self) -> dict[PartitionKey, int]:
        return {key: p.high_watermark for key, p in self.manager.partitions.items()}


def _hw_checkpoint_bytes(hws: Mapping[PartitionKey, int]) -> bytes:
    lines = ["0", str(len(hws))]
    lines += [f"{topic} {index} {hw}" for (topic, index), hw in sorted(hws.items())]
    return ("\n".join(lines) + "\n").encode()


def _read_hw_checkpoint(path: Path) -> dict[PartitionKey, int]:
    """Kafka's replication-offset-checkpoint: ``0``, a count, then ``topic partition hw``
    lines (topic names never contain spaces). Unreadable files count as empty."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        log.warning("cannot read %s: %s", path, exc)
        return {}
    hws: dict[PartitionKey, int] = {}
    if len(lines) < 2 or lines[0] != "0" or not lines[1].isdigit() \
            or len(lines) != 2 + int(lines[1]):
        log.warning("%s is unreadable; ignoring it", path)
        return {}
    for line in lines[2:]:
        fields = line.split(" ")
        if len(fields) != 3 or not fields[1].isdigit() or not fields[2].isdigit():
            log.warning("%s is unreadable; ignoring it", path)
            return {}
        hws[(fields[0], int(fields[1]))] = int(fields[2])
    return hws
