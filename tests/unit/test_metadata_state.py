"""The metadata state machine: one test per validation rule, error code and envelope check.

Goal: each record applies as documented, each rejection carries the documented Kafka (or
internal) error code, and a rejected command changes nothing but the image version.
Method: drive a MetadataStateMachine through MachineDriver (consecutive offsets, current term).
"""

from __future__ import annotations

import dataclasses
from typing import Final

import pytest

from raftlog.metadata import errors
from raftlog.metadata.image import (
    NO_LEADER,
    MetadataImage,
    check_image,
    image_from_bytes,
    image_to_bytes,
)
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
)
from raftlog.metadata.state import (
    PARTITIONS_PER_TOPIC_MAX,
    REQUEST_WINDOW_MAX,
    RESOURCE_TYPE_BROKER,
    RESOURCE_TYPE_TOPIC,
    ApplyResult,
    MetadataStateMachine,
    apply_command,
    validate_topic_name,
)
from raftlog.metadata.testing import MachineDriver, make_topic_id

TOPIC_ID: Final = make_topic_id(1000)


@pytest.fixture
def driver() -> MachineDriver:
    """Controller term 1; brokers 1, 2, 3 registered and unfenced."""
    driver = MachineDriver()
    driver.bootstrap((1, 2, 3))
    return driver


def assert_rejected(
    driver: MachineDriver, record: Record, error_code: int, **kwargs: object
) -> str:
    """Apply ``record``, expect ``error_code``, and check nothing but the version changed."""
    before = driver.machine.image
    result = driver.apply(record, **kwargs)  # type: ignore[arg-type]
    assert result.error_code == error_code, result
    after = driver.machine.image
    assert after == dataclasses.replace(before, version=before.version + 1)
    assert result.message
    return result.message


def create(driver: MachineDriver, name: str = "t", partitions: int = 2, rf: int = 1) -> ApplyResult:
    replicas = tuple(tuple(1 + (p + r) % 3 for r in range(rf)) for p in range(partitions))
    result = driver.apply(
        CreateTopic(name, make_topic_id(len(name) + 7 * partitions), replicas, ())
    )
    assert result.ok, result
    return result


# --- Brokers ------------------------------------------------------------------------------


def test_register_broker_starts_fenced_and_unfence_makes_it_live() -> None:
    driver = MachineDriver()
    result = driver.apply(RegisterBroker(5, "h", 9092, "rack-a", "inc-1"))
    assert result.ok and result.value == 0  # Broker epoch = offset of the registration.
    broker = driver.machine.image.brokers[5]
    assert broker.fenced and broker.rack == "rack-a" and broker.epoch == 0
    assert driver.machine.image.live_broker_ids() == ()
    assert driver.apply(UnfenceBroker(5)).ok
    assert driver.machine.image.live_broker_ids() == (5,)
    assert driver.apply(FenceBroker(5)).ok
    assert driver.machine.image.brokers[5].fenced


def test_reregistering_same_incarnation_is_a_noop_and_new_incarnation_refences(
    driver: MachineDriver,
) -> None:
    before = driver.machine.image.brokers[1]
    again = driver.apply(RegisterBroker(1, before.host, before.port, None, before.incarnation_id))
    assert again.ok and again.value == before.epoch
    assert driver.machine.image.brokers[1] == before
    assert_rejected(driver, RegisterBroker(1, "other", 1, None, before.incarnation_id), 42)
    restarted = driver.apply(RegisterBroker(1, "h", 9, None, "inc-new"))
    assert restarted.ok and driver.machine.image.brokers[1].fenced


@pytest.mark.parametrize(
    "record",
    [
        RegisterBroker(-1, "h", 1, None, "i"),
        RegisterBroker(1, "", 1, None, "i"),
        RegisterBroker(1, "h", 0, None, "i"),
        RegisterBroker(1, "h", 65536, None, "i"),
        RegisterBroker(1, "h", 1, "", "i"),
        RegisterBroker(1, "h", 1, None, ""),
    ],
)
def test_register_broker_rejects_bad_fields(record: RegisterBroker) -> None:
    assert_rejected(MachineDriver(), record, errors.INVALID_REQUEST)


def test_fencing_an_unknown_broker_is_broker_id_not_registered(driver: MachineDriver) -> None:
    assert_rejected(driver, FenceBroker(9), errors.BROKER_ID_NOT_REGISTERED)
    assert_rejected(driver, UnfenceBroker(9), errors.BROKER_ID_NOT_REGISTERED)


# --- Topics -------------------------------------------------------------------------------


def test_create_topic_builds_partitions_with_first_live_replica_as_leader(
    driver: MachineDriver,
) -> None:
    assert driver.apply(FenceBroker(2)).ok
    record = CreateTopic("orders", TOPIC_ID, ((2, 1), (1, 3)), (("retention.ms", "1000"),))
    result = driver.apply(record)
    assert result.ok and result.value == TOPIC_ID
    image = driver.machine.image
    topic = image.topics["orders"]
    assert image.topic_by_id(TOPIC_ID) is topic
    assert topic.version == image.version
    assert dict(topic.configs) == {"retention.ms": "1000"}
    first, second = topic.partitions
    assert (first.replicas, first.isr, first.leader) == ((2, 1), (1,), 1)
    assert (second.replicas, second.isr, second.leader) == ((1, 3), (1, 3), 1)
    assert (first.leader_epoch, first.partition_epoch) == (0, 0)
    check_image(image)


def test_create_existing_topic_is_topic_already_exists(driver: MachineDriver) -> None:
    create(driver, "t")
    assert_rejected(driver, CreateTopic("t", TOPIC_ID, ((1,),), ()), errors.TOPIC_ALREADY_EXISTS)


@pytest.mark.parametrize("name", ["", ".", "..", "a" * 250, "has space", "ünï", "a/b", "a\n"])
def test_invalid_topic_names_are_invalid_topic_exception(driver: MachineDriver, name: str) -> None:
    assert validate_topic_name(name) is not None
    assert_rejected(
        driver, CreateTopic(name, TOPIC_ID, ((1,),), ()), errors.INVALID_TOPIC_EXCEPTION
    )


@pytest.mark.parametrize("name", ["a", "a" * 249, "A-b_c.9", "...", "_"])
def test_legal_topic_names(name: str) -> None:
    assert validate_topic_name(name) is None


def test_topic_names_colliding_on_dot_and_underscore_are_rejected(driver: MachineDriver) -> None:
    create(driver, "a.b")
    message = assert_rejected(
        driver, CreateTopic("a_b", TOPIC_ID, ((1,),), ()), errors.INVALID_TOPIC_EXCEPTION
    )
    assert "collides" in message


def test_create_topic_rejects_bad_topic_ids(driver: MachineDriver) -> None:
    for topic_id in (b"\x00" * 16, b"short"):
        assert_rejected(driver, CreateTopic("t", topic_id, ((1,),), ()), errors.INVALID_REQUEST)
    create(driver, "t")
    used = driver.machine.image.topics["t"].topic_id
    assert_rejected(driver, CreateTopic("u", used, ((1,),), ()), errors.INVALID_REQUEST)
    meta = CreateTopic("__cluster_metadata", TOPIC_ID, ((1,),), ())
    assert_rejected(driver, meta, errors.INVALID_REQUEST)


def test_partition_count_limits_are_invalid_partitions(driver: MachineDriver) -> None:
    assert_rejected(driver, CreateTopic("t", TOPIC_ID, (), ()), errors.INVALID_PARTITIONS)
    too_many = ((1,),) * (PARTITIONS_PER_TOPIC_MAX + 1)
    assert_rejected(driver, CreateTopic("t", TOPIC_ID, too_many, ()), errors.INVALID_PARTITIONS)


@pytest.mark.parametrize(
    ("partitions", "error_code"),
    [
        (((),), errors.INVALID_REPLICATION_FACTOR),
        (((1, 2, 3, 4),), errors.INVALID_REPLICATION_FACTOR),
        (((1, 2), (1,)), errors.INVALID_REPLICA_ASSIGNMENT),
        (((1, 1),), errors.INVALID_REPLICA_ASSIGNMENT),
        (((1, 9),), errors.INVALID_REPLICA_ASSIGNMENT),
    ],
)
def test_bad_replica_lists(
    driver: MachineDriver, partitions: tuple[tuple[int, ...], ...], error_code: int
) -> None:
    assert_rejected(driver, CreateTopic("t", TOPIC_ID, partitions, ()), error_code)


def test_replication_factor_counts_only_unfenced_brokers(driver: MachineDriver) -> None:
    assert driver.apply(FenceBroker(3)).ok
    assert_rejected(
        driver, CreateTopic("t", TOPIC_ID, ((1, 2, 3),), ()), errors.INVALID_REPLICATION_FACTOR
    )
    assert driver.apply(FenceBroker(2)).ok
    assert_rejected(
        driver, CreateTopic("t", TOPIC_ID, ((2,),), ()), errors.INVALID_REPLICA_ASSIGNMENT
    )


@pytest.mark.parametrize(
    "configs",
    [
        (("no.such.config", "1"),),
        (("retention.ms", "-2"),),
        (("retention.ms", "soon"),),
        (("cleanup.policy", "shred"),),
        (("retention.ms", "1"), ("retention.ms", "2")),
    ],
)
def test_bad_topic_configs_are_invalid_config(
    driver: MachineDriver, configs: tuple[tuple[str, str], ...]
) -> None:
    assert_rejected(driver, CreateTopic("t", TOPIC_ID, ((1,),), configs), errors.INVALID_CONFIG)


def test_delete_topic(driver: MachineDriver) -> None:
    create(driver, "t")
    topic_id = driver.machine.image.topics["t"].topic_id
    assert_rejected(driver, DeleteTopic("t", TOPIC_ID), errors.UNKNOWN_TOPIC_ID)
    result = driver.apply(DeleteTopic("t", topic_id))
    assert result.ok and result.value == topic_id
    image = driver.machine.image
    assert "t" not in image.topics and topic_id not in image.topic_names_by_id
    assert_rejected(driver, DeleteTopic("t", topic_id), errors.UNKNOWN_TOPIC_OR_PARTITION)
    # The name is free again.
    assert driver.apply(CreateTopic("t", TOPIC_ID, ((1,),), ())).ok


def test_create_partitions(driver: MachineDriver) -> None:
    create(driver, "t", partitions=2, rf=2)
    result = driver.apply(CreatePartitions("t", ((3, 1), (1, 2))))
    assert result.ok and result.value == 4
    topic = driver.machine.image.topics["t"]
    assert [p.partition for p in topic.partitions] == [0, 1, 2, 3]
    assert topic.partitions[2].leader == 3
    assert_rejected(driver, CreatePartitions("nope", ((1,),)), errors.UNKNOWN_TOPIC_OR_PARTITION)
    assert_rejected(driver, CreatePartitions("t", ()), errors.INVALID_PARTITIONS)
    assert_rejected(driver, CreatePartitions("t", ((1,),)), errors.INVALID_REPLICA_ASSIGNMENT)
    assert_rejected(driver, CreatePartitions("t", ((1, 2, 3, 4),)), 38)
    too_many = ((1, 2),) * PARTITIONS_PER_TOPIC_MAX
    assert_rejected(driver, CreatePartitions("t", too_many), errors.INVALID_PARTITIONS)


# --- Configs ------------------------------------------------------------------------------


def test_alter_topic_configs_sets_and_deletes(driver: MachineDriver) -> None:
    assert driver.apply(CreateTopic("t", TOPIC_ID, ((1,),), (("retention.ms", "5"),))).ok
    change = AlterConfigs(RESOURCE_TYPE_TOPIC, "t", (("segment.ms", "100"),), ("retention.ms",))
    assert driver.apply(change).ok
    topic = driver.machine.image.topics["t"]
    assert dict(topic.configs) == {"segment.ms": "100"}
    assert topic.version == driver.machine.image.version


@pytest.mark.parametrize(
    ("record", "error_code"),
    [
        (AlterConfigs(2, "missing", (), ()), errors.UNKNOWN_TOPIC_OR_PARTITION),
        (AlterConfigs(2, "t", (("bogus", "1"),), ()), errors.INVALID_CONFIG),
        (AlterConfigs(2, "t", (("retention.ms", "x"),), ()), errors.INVALID_CONFIG),
        (AlterConfigs(2, "t", (), ("bogus",)), errors.INVALID_CONFIG),
        (AlterConfigs(2, "t", (("retention.ms", "1"),), ("retention.ms",)), errors.INVALID_REQUEST),
        (AlterConfigs(2, "t", (("flush.ms", "1"), ("flush.ms", "2")), ()), errors.INVALID_REQUEST),
        (AlterConfigs(4, "x", (), ()), errors.INVALID_REQUEST),
        (AlterConfigs(4, "", (("retention.ms", "1"),), ()), errors.INVALID_CONFIG),
        (AlterConfigs(4, "", (("log.retention.ms", "-5"),), ()), errors.INVALID_CONFIG),
        (AlterConfigs(4, "", (), ("node.id",)), errors.INVALID_CONFIG),
        (AlterConfigs(8, "1", (), ()), errors.INVALID_REQUEST),
    ],
)
def test_alter_configs_rejections(
    driver: MachineDriver, record: AlterConfigs, error_code: int
) -> None:
    create(driver, "t")
    assert_rejected(driver, record, error_code)


def test_alter_broker_configs(driver: MachineDriver) -> None:
    change = AlterConfigs(RESOURCE_TYPE_BROKER, "", (("log.retention.ms", "60000"),), ())
    assert driver.apply(change).ok
    assert dict(driver.machine.image.broker_configs[""].configs) == {"log.retention.ms": "60000"}
    assert driver.apply(AlterConfigs(RESOURCE_TYPE_BROKER, "", (), ("log.retention.ms",))).ok
    assert dict(driver.machine.image.broker_configs[""].configs) == {}
    assert driver.apply(
        AlterConfigs(RESOURCE_TYPE_BROKER, "2", (("message.max.bytes", "9"),), ())
    ).ok


# --- Partitions ---------------------------------------------------------------------------


def test_partition_change_moves_leadership(driver: MachineDriver) -> None:
    create(driver, "t", partitions=1, rf=3)
    result = driver.apply(PartitionChange("t", 0, 2, (2, 3), leader_epoch=1, partition_epoch=1))
    assert result.ok and result.value == 1
    partition = driver.machine.image.partition("t", 0)
    assert partition is not None
    assert (partition.leader, partition.isr, partition.leader_epoch) == (2, (2, 3), 1)
    # ISR shrink under the same leader keeps the leader epoch.
    assert driver.apply(PartitionChange("t", 0, 2, (2,), leader_epoch=1, partition_epoch=2)).ok
    assert driver.apply(PartitionChange("t", 0, NO_LEADER, (), 2, partition_epoch=3)).ok


@pytest.mark.parametrize(
    ("change", "error_code"),
    [
        (PartitionChange("nope", 0, 1, (1,), 1, 1), errors.UNKNOWN_TOPIC_OR_PARTITION),
        (PartitionChange("t", 5, 1, (1,), 1, 1), errors.UNKNOWN_TOPIC_OR_PARTITION),
        (PartitionChange("t", 0, 1, (1, 9), 1, 1), errors.INVALID_REQUEST),
        (PartitionChange("t", 0, 1, (1, 1), 1, 1), errors.INVALID_REQUEST),
        (PartitionChange("t", 0, 2, (1,), 1, 1), errors.INVALID_REQUEST),
        (PartitionChange("t", 0, 2, (2,), 0, 1), errors.INVALID_REQUEST),
        (PartitionChange("t", 0, 1, (1,), 0, 0), errors.INVALID_UPDATE_VERSION),
        (PartitionChange("t", 0, 1, (1,), 0, 2), errors.INVALID_UPDATE_VERSION),
    ],
)
def test_partition_change_rejections(
    driver: MachineDriver, change: PartitionChange, error_code: int
) -> None:
    create(driver, "t", partitions=1, rf=3)
    assert_rejected(driver, change, error_code)


def test_partition_change_with_an_older_leader_epoch_is_fenced(driver: MachineDriver) -> None:
    create(driver, "t", partitions=1, rf=3)
    assert driver.apply(PartitionChange("t", 0, 2, (1, 2), 5, 1)).ok
    assert_rejected(driver, PartitionChange("t", 0, 2, (2,), 4, 2), errors.FENCED_LEADER_EPOCH)


def test_only_live_brokers_may_lead_or_join_the_isr(driver: MachineDriver) -> None:
    create(driver, "t", partitions=1, rf=3)  # Replicas (1, 2, 3), all in the ISR.
    assert driver.apply(PartitionChange("t", 0, 1, (1,), 0, 1)).ok
    assert driver.apply(FenceBroker(2)).ok
    assert_rejected(driver, PartitionChange("t", 0, 2, (2,), 1, 2), errors.INELIGIBLE_REPLICA)
    assert_rejected(driver, PartitionChange("t", 0, 1, (1, 2), 0, 2), errors.INELIGIBLE_REPLICA)
    assert driver.apply(PartitionChange("t", 0, 1, (1, 3), 0, 2)).ok
    # A fenced member already in the ISR may stay while another change is applied.
    assert driver.apply(FenceBroker(3)).ok
    assert driver.apply(PartitionChange("t", 0, 1, (1, 3), 0, 3)).ok


# --- Producer ids and the controller ------------------------------------------------------


def test_producer_id_blocks_are_handed_out_in_order(driver: MachineDriver) -> None:
    first = driver.apply(ProducerIdBlock(0, 1000, 1))
    assert first.ok and first.value == 0
    assert driver.machine.image.next_producer_id == 1000
    # A controller that read an old next_block_start loses the race deterministically.
    assert_rejected(driver, ProducerIdBlock(0, 1000, 2), errors.STALE_METADATA_VERSION)
    assert driver.apply(ProducerIdBlock(1000, 1000, 2)).value == 1000
    assert_rejected(driver, ProducerIdBlock(2000, 0, 1), errors.INVALID_REQUEST)
    assert_rejected(driver, ProducerIdBlock(2000, 10, 9), errors.BROKER_ID_NOT_REGISTERED)


def test_commands_before_any_controller_term_are_not_fenced() -> None:
    driver = MachineDriver()
    assert driver.apply(RegisterBroker(1, "h", 1, None, "i"), term=7).ok


def test_term_fencing(driver: MachineDriver) -> None:
    assert driver.machine.image.controller_term == 1
    message = assert_rejected(driver, FenceBroker(1), errors.NOT_CONTROLLER, term=0)
    assert "current term is 1" in message
    assert_rejected(driver, FenceBroker(1), errors.NOT_CONTROLLER, term=2)
    # Node 2 becomes controller for term 2: commands under term 1 are now fenced.
    assert driver.apply(BecomeController(2, 2)).value == 2
    assert driver.machine.image.controller_node_id == 2
    assert_rejected(driver, FenceBroker(1), errors.NOT_CONTROLLER, term=1)
    assert driver.apply(FenceBroker(1), term=2).ok


def test_become_controller_rules(driver: MachineDriver) -> None:
    assert_rejected(driver, BecomeController(1, 2), errors.NOT_CONTROLLER)
    assert driver.apply(BecomeController(1, 1)).ok  # The same leader again: idempotent.
    assert driver.apply(BecomeController(3, 2)).ok
    assert_rejected(driver, BecomeController(2, 1), errors.NOT_CONTROLLER)
    assert_rejected(driver, BecomeController(4, 1), errors.INVALID_REQUEST, term=3)
    assert_rejected(MachineDriver(), BecomeController(0, 1), errors.INVALID_REQUEST)
    assert_rejected(MachineDriver(), BecomeController(1, -1), errors.INVALID_REQUEST)


# --- Compare-and-set and request-id deduplication -----------------------------------------


def test_expected_version_is_compare_and_set_on_the_topic(driver: MachineDriver) -> None:
    create(driver, "t")
    read_version = driver.machine.image.version
    set_a = AlterConfigs(RESOURCE_TYPE_TOPIC, "t", (("retention.ms", "1"),), ())
    assert driver.apply(set_a, expected_version=read_version).ok
    # A second writer that read the same image loses: the topic moved on after its read.
    set_b = AlterConfigs(RESOURCE_TYPE_TOPIC, "t", (("retention.ms", "2"),), ())
    assert_rejected(driver, set_b, errors.STALE_METADATA_VERSION, expected_version=read_version)
    # Changes to other resources do not make the topic stale.
    fresh = driver.machine.image.version
    assert driver.apply(FenceBroker(3)).ok
    assert driver.apply(set_b, expected_version=fresh).ok
    # A topic that does not exist has no version, so creating it never fails CAS.
    assert driver.apply(CreateTopic("u", TOPIC_ID, ((1,),), ()), expected_version=0).ok


def test_expected_version_on_brokers_and_broker_configs(driver: MachineDriver) -> None:
    stale = driver.machine.image.version
    assert driver.apply(FenceBroker(2)).ok
    assert_rejected(driver, UnfenceBroker(2), errors.STALE_METADATA_VERSION, expected_version=stale)
    assert driver.apply(UnfenceBroker(3), expected_version=stale).ok
    change = AlterConfigs(RESOURCE_TYPE_BROKER, "", (("log.retention.ms", "1"),), ())
    assert driver.apply(change).ok
    assert_rejected(driver, change, errors.STALE_METADATA_VERSION, expected_version=stale)


def test_a_retried_request_applies_once_and_returns_the_first_result(
    driver: MachineDriver,
) -> None:
    command = driver.command(CreateTopic("t", TOPIC_ID, ((1,),), ()))
    first = driver.apply_command(command)
    topics_after_first = driver.machine.image.topics
    again = driver.apply_command(command)
    assert first.ok and again == first
    assert driver.machine.image.topics == topics_after_first
    # A rejected request is remembered too: the retry gets the same rejection.
    bad = driver.command(DeleteTopic("missing", TOPIC_ID))
    assert driver.apply_command(bad).error_code == errors.UNKNOWN_TOPIC_OR_PARTITION
    assert driver.apply_command(bad).error_code == errors.UNKNOWN_TOPIC_OR_PARTITION


def test_request_window_forgets_the_oldest_ids(driver: MachineDriver) -> None:
    command = driver.command(CreateTopic("t", TOPIC_ID, ((1,),), ()))
    assert driver.apply_command(command).ok
    for _ in range(REQUEST_WINDOW_MAX):
        assert driver.apply(FenceBroker(3)).ok
    assert len(driver.machine.recent_requests) == REQUEST_WINDOW_MAX
    assert driver.apply_command(command).error_code == errors.TOPIC_ALREADY_EXISTS


def test_dedupe_wins_over_term_fencing(driver: MachineDriver) -> None:
    command = driver.command(FenceBroker(3))
    first = driver.apply_command(command)
    assert driver.apply(BecomeController(2, 1)).ok
    assert driver.apply_command(command) == first


# --- Images and snapshots -----------------------------------------------------------------


def test_apply_is_pure_and_never_mutates_the_input_image(driver: MachineDriver) -> None:
    image = driver.machine.image
    encoded = image_to_bytes(image)
    command = Command(CreateTopic("t", TOPIC_ID, ((1,),), ()), 1, "x")
    first_image, first = apply_command(image, command, image.version + 1)
    second_image, second = apply_command(image, command, image.version + 1)
    assert first == second and first_image == second_image
    assert image_to_bytes(image) == encoded
    with pytest.raises(TypeError):
        image.topics["x"] = first_image.topics["t"]  # type: ignore[index]


def test_image_and_state_snapshots_round_trip(driver: MachineDriver) -> None:
    create(driver, "t", partitions=3, rf=2)
    assert driver.apply(
        AlterConfigs(RESOURCE_TYPE_BROKER, "", (("compression.type", "lz4"),), ())
    ).ok
    assert driver.apply(ProducerIdBlock(0, 10, 1)).ok
    image = driver.machine.image
    assert image_from_bytes(image_to_bytes(image)) == image
    restored = MetadataStateMachine.from_snapshot(driver.machine.snapshot())
    assert restored.image == image
    assert restored.recent_requests == driver.machine.recent_requests
    assert restored.snapshot() == driver.machine.snapshot()


def test_snapshot_decoding_is_strict() -> None:
    with pytest.raises(ValueError, match="supported format"):
        image_from_bytes(b"\xa0")
    with pytest.raises(ValueError, match="supported format"):
        MetadataStateMachine().restore(image_to_bytes(MetadataImage()))


def test_apply_requires_increasing_offsets(driver: MachineDriver) -> None:
    with pytest.raises(AssertionError):
        driver.machine.apply(driver.command(FenceBroker(1)), driver.machine.image.version)
