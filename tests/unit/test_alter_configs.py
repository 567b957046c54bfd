"""AlterConfigs / IncrementalAlterConfigs decisions (``plan_config_change``), pure.

Every accepted plan is applied through the real state machine, so the records are also checked
to be acceptable in log order, and the resulting image is what the tests look at.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from raftlog.config import ServerConfig
from raftlog.controller.core import (
    CONFIG_OP_APPEND,
    CONFIG_OP_DELETE,
    CONFIG_OP_SET,
    CONFIG_OP_SUBTRACT,
    CONFIG_RESOURCE_BROKER,
    CONFIG_RESOURCE_TOPIC,
    ConfigAlteration,
    ConfigOp,
    Decision,
    plan_config_change,
)
from raftlog.metadata import errors
from raftlog.metadata.image import MetadataImage
from raftlog.metadata.records import AlterConfigs, PartitionChange
from raftlog.metadata.testing import MachineDriver
from raftlog.tools.console import parse_add_config

DEFAULTS: Mapping[str, str] = {"cleanup.policy": "delete", "retention.ms": "604800000",
                               "min.insync.replicas": "1"}


@pytest.fixture
def driver() -> MachineDriver:
    machine = MachineDriver()
    machine.bootstrap((1, 2, 3))
    assert machine.create_topic("t", [(1, 2, 3)], [("retention.ms", "1000"),
                                                   ("segment.bytes", "1048576")]).ok
    return machine


def topic_ops(*ops: tuple[str, int, str | None], incremental: bool = True,
              name: str = "t") -> ConfigAlteration:
    return ConfigAlteration(CONFIG_RESOURCE_TOPIC, name,
                            tuple(ConfigOp(*op) for op in ops), incremental)


def legacy(*pairs: tuple[str, str | None]) -> ConfigAlteration:
    return topic_ops(*((k, CONFIG_OP_SET, v) for k, v in pairs), incremental=False)


def commit(driver: MachineDriver, decision: Decision) -> MetadataImage:
    assert decision.ok, decision
    for proposal in decision.proposals:
        result = driver.apply(proposal.record, expected_version=proposal.expected_version)
        assert result.ok, result
    return driver.machine.image


def configs(image: MetadataImage, topic: str = "t") -> dict[str, str]:
    return dict(image.topics[topic].configs)


def test_incremental_set_and_delete_keep_other_overrides(driver: MachineDriver) -> None:
    image = driver.machine.image
    decision = plan_config_change(image, topic_ops(
        ("min.insync.replicas", CONFIG_OP_SET, "2"), ("retention.ms", CONFIG_OP_DELETE, None)),
        DEFAULTS)
    (proposal,) = decision.proposals
    assert proposal.record == AlterConfigs(CONFIG_RESOURCE_TOPIC, "t",
                                           (("min.insync.replicas", "2"),), ("retention.ms",))
    assert proposal.expected_version == image.topics["t"].version
    after = commit(driver, decision)
    assert configs(after) == {"segment.bytes": "1048576", "min.insync.replicas": "2"}


def test_legacy_alter_configs_replaces_the_whole_set(driver: MachineDriver) -> None:
    after = commit(driver, plan_config_change(
        driver.machine.image, legacy(("cleanup.policy", "compact")), DEFAULTS))
    assert configs(after) == {"cleanup.policy": "compact"}


def test_legacy_with_no_configs_deletes_every_override(driver: MachineDriver) -> None:
    after = commit(driver, plan_config_change(driver.machine.image, legacy(), DEFAULTS))
    assert configs(after) == {}


def test_append_starts_from_the_default_and_subtract_removes(driver: MachineDriver) -> None:
    after = commit(driver, plan_config_change(driver.machine.image, topic_ops(
        ("cleanup.policy", CONFIG_OP_APPEND, "compact")), DEFAULTS))
    assert configs(after)["cleanup.policy"] == "delete,compact"
    again = plan_config_change(after, topic_ops(
        ("cleanup.policy", CONFIG_OP_APPEND, "compact")), DEFAULTS)
    assert again.ok and not again.proposals  # already there: nothing to commit
    after = commit(driver, plan_config_change(after, topic_ops(
        ("cleanup.policy", CONFIG_OP_SUBTRACT, "delete")), DEFAULTS))
    assert configs(after)["cleanup.policy"] == "compact"


@pytest.mark.parametrize("request_, code", [
    (topic_ops(("no.such.config", CONFIG_OP_SET, "1")), errors.INVALID_CONFIG),
    (topic_ops(("retention.ms", CONFIG_OP_SET, "-2")), errors.INVALID_CONFIG),
    (topic_ops(("retention.ms", CONFIG_OP_SET, "soon")), errors.INVALID_CONFIG),
    (topic_ops(("min.insync.replicas", CONFIG_OP_SET, "0")), errors.INVALID_CONFIG),
    (topic_ops(("segment.bytes", CONFIG_OP_SET, "13")), errors.INVALID_CONFIG),
    (topic_ops(("cleanup.policy", CONFIG_OP_SET, "shred")), errors.INVALID_CONFIG),
    (topic_ops(("min.cleanable.dirty.ratio", CONFIG_OP_SET, "1.5")), errors.INVALID_CONFIG),
    (topic_ops(("retention.ms", CONFIG_OP_APPEND, "5")), errors.INVALID_CONFIG),
    (topic_ops(("cleanup.policy", CONFIG_OP_SUBTRACT, "delete")), errors.INVALID_CONFIG),
    (topic_ops(("no.such.config", CONFIG_OP_DELETE, None)), errors.INVALID_CONFIG),
    (topic_ops(("retention.ms", CONFIG_OP_SET, None)), errors.INVALID_REQUEST),
    (topic_ops(("retention.ms", 7, "5")), errors.INVALID_REQUEST),
    (topic_ops(("retention.ms", CONFIG_OP_SET, "5"), ("retention.ms", CONFIG_OP_DELETE, None)),
     errors.INVALID_REQUEST),
    (legacy(("retention.ms", "5"), ("cleanup.policy", "bogus")), errors.INVALID_CONFIG),
    (topic_ops(("retention.ms", CONFIG_OP_SET, "5"), name="missing"),
     errors.UNKNOWN_TOPIC_OR_PARTITION),
    (ConfigAlteration(8, "x", (), True), errors.INVALID_REQUEST),
    (ConfigAlteration(CONFIG_RESOURCE_BROKER, "node-1", (), True), errors.INVALID_REQUEST),
])
def test_bad_requests_are_refused_and_propose_nothing(
        driver: MachineDriver, request_: ConfigAlteration, code: int) -> None:
    decision = plan_config_change(driver.machine.image, request_, DEFAULTS)
    assert decision.error_code == code, decision
    assert decision.message
    assert decision.proposals == ()


def test_unchanged_values_propose_nothing(driver: MachineDriver) -> None:
    decision = plan_config_change(driver.machine.image, topic_ops(
        ("retention.ms", CONFIG_OP_SET, "1000"), ("flush.ms", CONFIG_OP_DELETE, None)), DEFAULTS)
    assert decision.ok and decision.proposals == ()


def test_a_stale_plan_loses_the_compare_and_set(driver: MachineDriver) -> None:
    """A plan made before another change to the topic (here an ISR change, which also moves
    the topic's version) is refused in log order; re-planning on the new image succeeds."""
    stale = plan_config_change(driver.machine.image, topic_ops(
        ("cleanup.policy", CONFIG_OP_APPEND, "compact")), DEFAULTS)
    part = driver.machine.image.topics["t"].partitions[0]
    assert driver.apply(PartitionChange("t", 0, part.leader, part.isr[:2], part.leader_epoch,
                                        part.partition_epoch + 1)).ok
    (proposal,) = stale.proposals
    result = driver.apply(proposal.record, expected_version=proposal.expected_version)
    assert result.error_code == errors.STALE_METADATA_VERSION
    commit(driver, plan_config_change(driver.machine.image, topic_ops(
        ("cleanup.policy", CONFIG_OP_APPEND, "compact")), DEFAULTS))
    assert configs(driver.machine.image)["cleanup.policy"] == "delete,compact"


def test_broker_resources_take_dynamic_broker_configs(driver: MachineDriver) -> None:
    cluster = ConfigAlteration(CONFIG_RESOURCE_BROKER, "", (
        ConfigOp("log.retention.ms", CONFIG_OP_SET, "5000"),), True)
    after = commit(driver, plan_config_change(driver.machine.image, cluster, DEFAULTS))
    assert dict(after.broker_configs[""].configs) == {"log.retention.ms": "5000"}
    config = ServerConfig.from_properties({"node.id": "1", "log.dirs": "/nonexistent"})
    defaults = config.topic_defaults(after.broker_configs[""].configs)
    assert defaults["retention.ms"] == "5000"
    not_dynamic = ConfigAlteration(CONFIG_RESOURCE_BROKER, "1", (
        ConfigOp("retention.ms", CONFIG_OP_SET, "5000"),), True)
    refused = plan_config_change(after, not_dynamic, DEFAULTS)
    assert refused.error_code == errors.INVALID_CONFIG


def test_add_config_parses_kafka_configs_syntax() -> None:
    assert parse_add_config(["retention.ms=100,cleanup.policy=[compact,delete]", "a=b"]) == {
        "retention.ms": "100", "cleanup.policy": "compact,delete", "a": "b"}
