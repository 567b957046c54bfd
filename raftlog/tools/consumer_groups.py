"""`raftlog groups list|describe|delete|reset-offsets`, in the spirit of Kafka's
``kafka-consumer-groups.sh``.

Every group request goes to the group's coordinator (FindCoordinator, key type 0); log end
offsets and timestamps are asked of each partition's leader (ListOffsets). Offsets are reset
the way Kafka's admin client does it: one OffsetCommit with generation -1 and an empty member
id, which the coordinator accepts only while the group has no members.
"""

from __future__ import annotations

import argparse
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import trio

from raftlog.client.connection import PLAINTEXT, KafkaClientError, KafkaConnection, Security
from raftlog.protocol.codec import Struct
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import FIND_COORDINATOR, LIST_OFFSETS
from raftlog.protocol.schemas_group import (
    DELETE_GROUPS,
    DESCRIBE_GROUPS,
    LIST_GROUPS,
    OFFSET_COMMIT,
    OFFSET_FETCH,
)
from raftlog.tools import command_config
from raftlog.tools.console import EARLIEST, LATEST, Cluster

ACTIONS = ("list", "describe", "delete", "reset-offsets")
COORDINATOR_WAIT_S = 15.0
_RETRIABLE = {ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
              ErrorCode.NOT_COORDINATOR}
# States in which the group has no members, so its offsets may be reset from outside.
_INACTIVE = {"Empty", "Dead"}

TopicPartition = tuple[str, int]


def add_parser(commands: Any) -> None:
    """Adds the ``groups`` subcommand to ``raftlog``'s subparsers."""
    groups = commands.add_parser(
        "groups", help="list, describe, delete consumer groups or reset their offsets")
    groups.add_argument("action", choices=ACTIONS)
    groups.add_argument("--bootstrap-server", default="127.0.0.1:9092")
    groups.add_argument("--group", action="append", default=[],
                        help="group id (repeatable for describe and delete)")
    groups.add_argument("--topic", action="append", default=[],
                        help="reset-offsets: TOPIC or TOPIC:P,P,... (repeatable)")
    groups.add_argument("--all-topics", action="store_true",
                        help="reset-offsets: every topic the group has committed offsets for")
    scenario = groups.add_mutually_exclusive_group()
    scenario.add_argument("--to-earliest", action="store_true")
    scenario.add_argument("--to-latest", action="store_true")
    scenario.add_argument("--to-datetime", metavar="ISO8601",
                          help="e.g. 2024-05-01T12:00:00.000 (local time unless an offset "
                               "such as Z or +02:00 is given)")
    scenario.add_argument("--to-offset", type=int, metavar="N")
    groups.add_argument("--execute", action="store_true",
                        help="reset-offsets: commit the plan (the default is a dry run)")
    command_config.add_argument(groups)


def run(args: argparse.Namespace) -> int:
    """Entry point from :mod:`raftlog.cli`."""
    try:
        scenario = _scenario(args) if args.action == "reset-offsets" else None
    except ValueError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    return trio.run(groups_command, args.bootstrap_server, args.action, args.group, args.topic,
                    args.all_topics, scenario, args.execute, command_config.from_args(args))


@dataclass(frozen=True)
class Scenario:
    """Where reset-offsets moves each partition: ``kind`` is earliest, latest, datetime or
    offset; ``value`` the timestamp in ms or the offset."""

    kind: str
    value: int = 0


def _scenario(args: argparse.Namespace) -> Scenario:
    if args.to_earliest:
        return Scenario("earliest")
    if args.to_latest:
        return Scenario("latest")
    if args.to_offset is not None:
        return Scenario("offset", args.to_offset)
    if args.to_datetime is not None:
        return Scenario("datetime", parse_datetime_ms(args.to_datetime))
    raise ValueError("reset-offsets needs one of --to-earliest, --to-latest, --to-datetime, "
                     "--to-offset")


def parse_datetime_ms(text: str) -> int:
    """ISO 8601 to milliseconds since the epoch; without a zone, local time (as Kafka)."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(f"--to-datetime {text!r} is not ISO 8601 "
                         "(e.g. 2024-05-01T12:00:00.000)") from exc
    if moment.tzinfo is None:
        moment = moment.astimezone()  # naive: the local zone
    return int(moment.timestamp() * 1000)


# -- ConsumerProtocol payloads -----------------------------------------------------------------


def decode_assignment(data: bytes | None) -> dict[str, list[int]]:
    """The partitions of a ConsumerProtocolAssignment (versions 0-3: int16 version, then an
    array of (topic string, int32 array), then user data, which is ignored)."""
    if not data:
        return {}
    buf = bytes(data)
    pos = 2  # version

    def take(fmt: str) -> int:
        nonlocal pos
        (value,) = struct.unpack_from(fmt, buf, pos)
        pos += struct.calcsize(fmt)
        return int(value)

    out: dict[str, list[int]] = {}
    try:
        for _ in range(take(">i")):
            length = take(">h")
            topic = buf[pos:pos + length].decode()
            pos += length
            out[topic] = sorted(take(">i") for _ in range(take(">i")))
    except (struct.error, UnicodeDecodeError) as exc:
        raise KafkaClientError(f"cannot decode a member assignment: {exc}") from exc
    return out


# -- the coordinator ---------------------------------------------------------------------------


class GroupAdmin:
    """The cluster's connections plus one connection per group coordinator."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._coordinators: dict[str, KafkaConnection] = {}
        self._by_address: dict[tuple[str, int], KafkaConnection] = {}

    @classmethod
    async def connect(cls, bootstrap: str, security: Security = PLAINTEXT) -> GroupAdmin:
        cluster = await Cluster.connect(bootstrap, security)
        await cluster.metadata([])
        return cls(cluster)

    async def aclose(self) -> None:
        for connection in self._by_address.values():
            await connection.aclose()
        await self.cluster.aclose()

    async def coordinator(self, group: str) -> KafkaConnection:
        if group in self._coordinators:
            return self._coordinators[group]
        deadline = trio.current_time() + COORDINATOR_WAIT_S
        while True:
            found = await self.cluster.bootstrap.request(
                FIND_COORDINATOR, {"key": group, "key_type": 0})
            if found.error_code == ErrorCode.NONE:
                break
            if found.error_code not in _RETRIABLE:
                raise KafkaClientError(f"FindCoordinator {group!r}: "
                                       f"{ErrorCode(found.error_code).name}")
            if trio.current_time() > deadline:
                break
            await trio.sleep(0.1)
        if found.error_code:
            raise KafkaClientError(f"no coordinator for group {group!r} after "
                                   f"{COORDINATOR_WAIT_S:.0f} s: "
                                   f"{ErrorCode(found.error_code).name}")
        address = (found.host, found.port)
        if address not in self._by_address:
            self._by_address[address] = await KafkaConnection.connect(
                *address, security=self.cluster.security)
        self._coordinators[group] = self._by_address[address]
        return self._coordinators[group]

    async def request(self, group: str, api: Any, body: dict[str, Any],
                      error_of: Any) -> Struct:
        """``api`` to ``group``'s coordinator; retried (after a new FindCoordinator) while
        ``error_of(response)`` is a coordinator-moving or loading error."""
        deadline = trio.current_time() + COORDINATOR_WAIT_S
        while True:
            connection = await self.coordinator(group)
            response = await connection.request(api, body)
            code = error_of(response)
            if code not in _RETRIABLE or trio.current_time() > deadline:
                return response
            self._coordinators.pop(group, None)
            await trio.sleep(0.1)

    async def describe(self, group: str) -> Struct:
        response = await self.request(
            group, DESCRIBE_GROUPS, {"groups": [group], "include_authorized_operations": False},
            lambda r: r.groups[0].error_code)
        described: Struct = response.groups[0]
        if described.error_code:
            raise KafkaClientError(f"DescribeGroups {group!r}: "
                                   f"{ErrorCode(described.error_code).name}")
        return described

    async def committed(self, group: str) -> dict[TopicPartition, int]:
        response = await self.request(group, OFFSET_FETCH,
                                      {"group_id": group, "topics": None, "require_stable": False},
                                      lambda r: r.get("error_code", 0))
        if response.get("error_code", 0):
            raise KafkaClientError(f"OffsetFetch {group!r}: "
                                   f"{ErrorCode(response.error_code).name}")
        out = {}
        for topic in response.topics:
            for p in topic.partitions:
                if p.error_code:
                    raise KafkaClientError(f"OffsetFetch {group!r} {topic.name}-"
                                           f"{p.partition_index}: {ErrorCode(p.error_code).name}")
                if p.committed_offset >= 0:
                    out[(topic.name, p.partition_index)] = p.committed_offset
        return out

    async def partitions(self, topic: str) -> list[int]:
        return sorted(await self.cluster.partition_leaders(topic))

    async def list_offsets(self, partitions: Sequence[TopicPartition],
                           timestamp: int) -> dict[TopicPartition, int]:
        """ListOffsets (read-uncommitted) at ``timestamp`` from each partition's leader; -1
        where no record has a timestamp at or after it."""
        out: dict[TopicPartition, int] = {}
        for topic in sorted({t for t, _ in partitions}):
            leaders = await self.cluster.partition_leaders(topic)
            mine = sorted(p for t, p in partitions if t == topic)
            for leader in sorted({leaders[p] for p in mine if p in leaders}):
                wanted = [p for p in mine if leaders.get(p) == leader]
                connection = await self.cluster.leader_connection(leader)
                body = {"replica_id": -1, "isolation_level": 0, "topics": [{
                    "name": topic, "partitions": [
                        {"partition_index": p, "current_leader_epoch": -1,
                         "timestamp": timestamp} for p in wanted]}]}
                response = await connection.request(LIST_OFFSETS, body)
                for result in response.topics[0].partitions:
                    if result.error_code:
                        raise KafkaClientError(
                            f"ListOffsets {topic}-{result.partition_index}: "
                            f"{ErrorCode(result.error_code).name}")
                    out[(topic, result.partition_index)] = result.offset
            missing = [p for p in mine if p not in leaders]
            if missing:
                raise KafkaClientError(f"topic {topic!r} has no partition {missing[0]}")
        return out


# -- commands ----------------------------------------------------------------------------------


async def groups_command(bootstrap: str, action: str, groups: Sequence[str],
                         topics: Sequence[str], all_topics: bool, scenario: Scenario | None,
                         execute: bool, security: Security = PLAINTEXT) -> int:
    if action != "list" and not groups:
        raise KafkaClientError(f"groups {action} needs --group")
    admin = await GroupAdmin.connect(bootstrap, security)
    try:
        if action == "list":
            return await _list(admin)
        if action == "describe":
            code = 0
            for i, group in enumerate(groups):
                if i:
                    print()
                code = max(code, await _describe(admin, group))
            return code
        if action == "delete":
            return await _delete(admin, groups)
        assert scenario is not None
        if len(groups) != 1:
            raise KafkaClientError("reset-offsets takes exactly one --group")
        return await _reset(admin, groups[0], topics, all_topics, scenario, execute)
    finally:
        await admin.aclose()


async def _list(admin: GroupAdmin) -> int:
    """ListGroups on every broker (each lists the groups it coordinates)."""
    found: set[str] = set()
    for node_id in sorted(admin.cluster.brokers):
        connection = await admin.cluster.leader_connection(node_id)
        response = await connection.request(LIST_GROUPS, {})
        if response.error_code:
            raise KafkaClientError(f"ListGroups on node {node_id}: "
                                   f"{ErrorCode(response.error_code).name}")
        found.update(g.group_id for g in response.groups)
    for group in sorted(found):
        print(group)
    return 0


@dataclass
class _Row:
    topic: str
    partition: int
    committed: int | None
    end: int
    member: Any | None


async def _describe(admin: GroupAdmin, group: str) -> int:
    described = await admin.describe(group)
    state = described.group_state
    if state == "Dead":
        print(f"Error: Consumer group '{group}' does not exist.", file=sys.stderr)
        return 1
    members = list(described.members)
    assignments = {m.member_id: decode_assignment(m.member_assignment) for m in members}
    committed = await admin.committed(group)
    owner: dict[TopicPartition, Any] = {}
    for m in members:
        for topic, parts in assignments[m.member_id].items():
            for p in parts:
                owner[(topic, p)] = m
    partitions = sorted(set(committed) | set(owner))
    ends = await admin.list_offsets(partitions, LATEST) if partitions else {}

    print(f"Consumer group '{group}':  STATE {state}  "
          f"PROTOCOL-TYPE {described.protocol_type or '-'}  "
          f"PROTOCOL {described.protocol_data or '-'}  MEMBERS {len(members)}")
    if members:
        print()
        rows = []
        for m in sorted(members, key=lambda m: m.member_id):
            assigned = assignments[m.member_id]
            text = ",".join(f"{t}({','.join(map(str, ps))})" for t, ps in sorted(assigned.items()))
            rows.append([m.member_id, m.group_instance_id or "-", m.client_host, m.client_id,
                         str(sum(map(len, assigned.values()))), text or "-"])
        _table(["CONSUMER-ID", "INSTANCE-ID", "HOST", "CLIENT-ID", "#PARTITIONS", "ASSIGNMENT"],
               rows)
    else:
        print(f"\nConsumer group '{group}' has no active members.")
    if partitions:
        print()
        table = []
        for tp in partitions:
            current = committed.get(tp)
            end = ends[tp]
            lag = "-" if current is None else str(max(0, end - current))
            m = owner.get(tp)
            table.append([group, tp[0], str(tp[1]), "-" if current is None else str(current),
                          str(end), lag, m.member_id if m else "-",
                          m.client_host if m else "-", m.client_id if m else "-"])
        _table(["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
                "CONSUMER-ID", "HOST", "CLIENT-ID"], table)
    return 0


async def _delete(admin: GroupAdmin, groups: Sequence[str]) -> int:
    failed: dict[str, str] = {}
    for group in groups:
        response = await admin.request(group, DELETE_GROUPS, {"groups_names": [group]},
                                       lambda r: r.results[0].error_code)
        code = response.results[0].error_code
        if code:
            failed[group] = ErrorCode(code).name
    deleted = [g for g in groups if g not in failed]
    if deleted:
        names = ", ".join(f"'{g}'" for g in deleted)
        print(f"Deletion of requested consumer groups ({names}) was successful.")
    if failed:
        print("Error: Deletion of some consumer groups failed:", file=sys.stderr)
        for group, name in failed.items():
            print(f"* Group '{group}' could not be deleted due to: {name}", file=sys.stderr)
        return 1
    return 0


def _parse_topic(spec: str) -> tuple[str, list[int] | None]:
    topic, sep, parts = spec.partition(":")
    if not sep:
        return topic, None
    try:
        return topic, sorted({int(p) for p in parts.split(",") if p.strip()})
    except ValueError as exc:
        raise KafkaClientError(f"bad --topic {spec!r} (expected TOPIC or TOPIC:P,P)") from exc


async def _reset(admin: GroupAdmin, group: str, topics: Sequence[str], all_topics: bool,
                 scenario: Scenario, execute: bool) -> int:
    if bool(topics) == all_topics:
        raise KafkaClientError("reset-offsets needs --topic (repeatable) or --all-topics")
    described = await admin.describe(group)
    if described.group_state not in _INACTIVE:
        print(f"Error: Assignments can only be reset if the group '{group}' is inactive, but "
              f"the current state is {described.group_state} "
              f"({len(described.members)} active members). Stop its consumers first.",
              file=sys.stderr)
        return 1
    committed = await admin.committed(group)
    if all_topics:
        partitions = sorted(committed)
    else:
        partitions = []
        for spec in topics:
            topic, wanted = _parse_topic(spec)
            existing = await admin.partitions(topic)
            for p in wanted if wanted is not None else existing:
                if p not in existing:
                    raise KafkaClientError(f"topic {topic!r} has no partition {p}")
                partitions.append((topic, p))
        partitions = sorted(set(partitions))
    if not partitions:
        print(f"Consumer group '{group}' has no committed offsets to reset.", file=sys.stderr)
        return 1
    plan = await _plan(admin, partitions, scenario)

    rows = [[group, t, str(p), str(committed.get((t, p), "-")), str(plan[(t, p)])]
            for t, p in partitions]
    _table(["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET"], rows)
    if not execute:
        print("\nDry run: nothing was committed. Add --execute to commit these offsets.")
        return 0
    return await _commit(admin, group, plan)


async def _plan(admin: GroupAdmin, partitions: Sequence[TopicPartition],
                scenario: Scenario) -> dict[TopicPartition, int]:
    earliest = await admin.list_offsets(partitions, EARLIEST)
    latest = await admin.list_offsets(partitions, LATEST)
    if scenario.kind == "earliest":
        return earliest
    if scenario.kind == "latest":
        return latest
    if scenario.kind == "offset":
        # As Kafka: an offset outside the log is moved to its nearest end.
        return {tp: min(max(scenario.value, earliest[tp]), latest[tp]) for tp in partitions}
    found = await admin.list_offsets(partitions, scenario.value)
    # No record at or after the time: the log end (the next record will be later).
    return {tp: latest[tp] if found[tp] < 0 else found[tp] for tp in partitions}


async def _commit(admin: GroupAdmin, group: str, plan: dict[TopicPartition, int]) -> int:
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), offset in sorted(plan.items()):
        by_topic.setdefault(topic, []).append(
            {"partition_index": partition, "committed_offset": offset,
             "committed_leader_epoch": -1, "commit_timestamp": -1, "committed_metadata": ""})
    body = {"group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
            "group_instance_id": None, "retention_time_ms": -1,
            "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}

    def first_error(response: Struct) -> int:
        codes = [p.error_code for t in response.topics for p in t.partitions if p.error_code]
        return codes[0] if codes else 0

    response = await admin.request(group, OFFSET_COMMIT, body, first_error)
    errors = [(t.name, p.partition_index, ErrorCode(p.error_code).name)
              for t in response.topics for p in t.partitions if p.error_code]
    if errors:
        for topic, partition, name in errors:
            print(f"Error: committing {topic}-{partition} for group '{group}': {name}",
                  file=sys.stderr)
        if any(name == "UNKNOWN_MEMBER_ID" for *_, name in errors):
            print("(a consumer joined the group meanwhile: stop it and retry)", file=sys.stderr)
        return 1
    print(f"\nCommitted the new offsets of {len(plan)} partitions for group '{group}'.")
    return 0


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    for line in [headers, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
