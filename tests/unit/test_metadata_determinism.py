"""Determinism of the metadata state machine under arbitrary command sequences.

Goal: what a Raft quorum needs from its state machine. The same commands applied to two fresh
machines give equal images, equal results and identical snapshot bytes; restoring a snapshot
taken mid-way and applying the tail gives the same state as the full replay; every intermediate
image satisfies the image invariants; and a rejected command changes only the version.
Method: Hypothesis draws command sequences from small domains (few names, ids, terms and request
ids) so that collisions, rejections, retries and successes all happen often.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.metadata.image import check_image, image_from_bytes, image_to_bytes
from raftlog.metadata.records import (
    AlterConfigs,
    BecomeController,
    Command,
    CreatePartitions,
    CreateTopic,
    DeleteTopic,
    FenceBroker,
    PartitionChange,
    ProducerIdBlock,
    Record,
    RegisterBroker,
    UnfenceBroker,
    decode_command,
    encode_command,
)
from raftlog.metadata.state import MetadataStateMachine
from raftlog.metadata.testing import MachineDriver, make_topic_id

SMALL = st.integers(-1, 3)
# Invalid values are in every domain, but rarer than valid ones so that sequences get far.
NAMES = st.sampled_from(["a", "b", "a", "b", "a.b", "a_b", "", "..", "x" * 250])
NODE_IDS = st.integers(0, 3)
# Seeds 10 and 11 are the ids of the bootstrapped topics "a" and "b".
TOPIC_IDS = st.sampled_from([make_topic_id(i) for i in (1, 2, 10, 11)] + [b"\x00" * 16, b"short"])
REPLICAS = st.one_of(
    st.lists(st.integers(0, 2), min_size=1, max_size=2, unique=True).map(tuple),
    st.lists(NODE_IDS, max_size=3).map(tuple),
)
ASSIGNMENT = st.one_of(
    REPLICAS.flatmap(lambda replicas: st.lists(st.just(replicas), min_size=1, max_size=3)).map(
        tuple
    ),
    st.lists(REPLICAS, max_size=3).map(tuple),
)
# None means "the current term"; a wrong term is drawn about one time in five.
TERMS = st.tuples(st.integers(0, 4), SMALL).map(lambda pair: pair[1] if pair[0] == 0 else None)
CONFIG_KEYS = st.sampled_from(["retention.ms", "cleanup.policy", "bogus", "log.retention.ms"])
CONFIG_PAIRS = st.sampled_from(
    [
        ("retention.ms", "1"),
        ("retention.ms", "-5"),
        ("cleanup.policy", "compact"),
        ("bogus", "1"),
        ("log.retention.ms", "100"),
        ("log.cleanup.policy", "delete"),
    ]
)
CONFIGS = st.lists(CONFIG_PAIRS, max_size=2).map(tuple)
ISR = st.lists(st.integers(0, 3), max_size=2, unique=True).map(tuple)
PARTITION_CHANGES = st.builds(
    lambda topic, partition, isr, leader, epochs: PartitionChange(
        topic, partition, leader, isr, *epochs
    ),
    NAMES,
    st.integers(-1, 2),
    ISR,
    st.integers(-1, 3),
    st.tuples(st.integers(-1, 3), st.integers(0, 3)),
).flatmap(
    # Usually lead from inside the ISR, as a real controller would.
    lambda change: st.sampled_from(
        [dataclasses.replace(change, leader=leader) for leader in (*change.isr, -1)] + [change]
    )
)

RECORDS: st.SearchStrategy[Record] = st.one_of(
    st.builds(
        RegisterBroker,
        NODE_IDS,
        st.sampled_from(["h1", "h2"]),
        st.sampled_from([9092, 0]),
        st.sampled_from([None, "r1"]),
        st.sampled_from(["i1", "i2"]),
    ),
    st.builds(FenceBroker, NODE_IDS),
    st.builds(UnfenceBroker, NODE_IDS),
    st.builds(CreateTopic, NAMES, TOPIC_IDS, ASSIGNMENT, CONFIGS),
    st.builds(DeleteTopic, NAMES, TOPIC_IDS),
    st.builds(CreatePartitions, NAMES, ASSIGNMENT),
    st.builds(
        AlterConfigs,
        st.sampled_from([2, 4, 9]),
        st.sampled_from(["a", "b", "", "1"]),
        CONFIGS,
        st.lists(CONFIG_KEYS, max_size=2).map(tuple),
    ),
    PARTITION_CHANGES,
    st.builds(ProducerIdBlock, st.sampled_from([0, 5, 1000]), st.sampled_from([0, 1000]), NODE_IDS),
    st.builds(BecomeController, SMALL, NODE_IDS),
)

# (record, term: None = the current one, request id, expected version)
STEPS = st.lists(
    st.tuples(
        RECORDS,
        TERMS,
        # Mostly fresh request ids, sometimes a retry of one of a few.
        st.one_of(st.uuids().map(str), st.sampled_from(["r0", "r1", "r2"])),
        st.none() | st.integers(-1, 40),
    ),
    max_size=40,
)


def bootstrapped() -> MachineDriver:
    driver = MachineDriver()
    driver.bootstrap((0, 1, 2))
    assert driver.create_topic("a", ((0, 1), (1, 2)), seed=10).ok
    assert driver.create_topic("b", ((2,),), seed=11).ok
    return driver


def concrete_commands(
    driver: MachineDriver, steps: list[tuple[Record, int | None, str, int | None]]
) -> list[Command]:
    """Resolve "current term" against ``driver`` while applying, checking each step."""
    commands = []
    for record, term, request_id, expected in steps:
        command = driver.command(
            record, term=term, request_id=request_id, expected_version=expected
        )
        before = driver.machine.image
        result = driver.apply_command(command)
        after = driver.machine.image
        check_image(after)
        if not result.ok:
            assert after == dataclasses.replace(before, version=before.version + 1)
        commands.append(command)
    return commands


@settings(max_examples=150, deadline=None)
@given(STEPS, st.data())
def test_replicas_agree_and_snapshots_replay(
    steps: list[tuple[Record, int | None, str, int | None]], data: st.DataObject
) -> None:
    reference = bootstrapped()
    base_offset = reference.machine.image.version
    commands = concrete_commands(reference, steps)

    # A second machine fed the same commands, through the log encoding, agrees exactly.
    replica = bootstrapped()
    results = [
        replica.machine.apply(decode_command(encode_command(command)), base_offset + 1 + i)
        for i, command in enumerate(commands)
    ]
    assert replica.machine.image == reference.machine.image
    assert replica.machine.snapshot() == reference.machine.snapshot()
    assert len(results) == len(commands)

    # Snapshot at an arbitrary cut, restore, apply the tail: same state as the full replay.
    cut = data.draw(st.integers(0, len(commands)))
    prefix = bootstrapped()
    for i, command in enumerate(commands[:cut]):
        prefix.machine.apply(command, base_offset + 1 + i)
    restored = MetadataStateMachine.from_snapshot(prefix.machine.snapshot())
    tail_results = [
        restored.apply(command, base_offset + 1 + cut + i)
        for i, command in enumerate(commands[cut:])
    ]
    assert tail_results == results[cut:]
    assert restored.image == reference.machine.image
    assert restored.recent_requests == reference.machine.recent_requests
    assert image_from_bytes(image_to_bytes(restored.image)) == restored.image
