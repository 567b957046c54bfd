"""Planning config changes: AlterConfigs (33) and IncrementalAlterConfigs (44) validated
against the image and turned into the one AlterConfigs record each resource needs, under
compare-and-set on the resource's version. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from raftlog.config import (
    BROKER_DYNAMIC_CONFIG_KEYS,
    TOPIC_CONFIG_KEYS,
    parse_list,
    validate_broker_dynamic_config,
    validate_topic_config,
)
from raftlog.controller.decisions import Decision, Proposal, rejected
from raftlog.metadata import errors
from raftlog.metadata.image import MetadataImage
from raftlog.metadata.records import AlterConfigs
from raftlog.metadata.state import RESOURCE_TYPE_BROKER, RESOURCE_TYPE_TOPIC
from raftlog.protocol.internal_topics import cleanup_policy_refusal

# Kafka's ConfigResource.Type (as the metadata records carry them) and AlterConfigOp.OpType.
CONFIG_RESOURCE_TOPIC: Final = RESOURCE_TYPE_TOPIC
CONFIG_RESOURCE_BROKER: Final = RESOURCE_TYPE_BROKER
CONFIG_OP_SET: Final = 0
CONFIG_OP_DELETE: Final = 1
CONFIG_OP_APPEND: Final = 2
CONFIG_OP_SUBTRACT: Final = 3
# Topic configs whose ConfigDef type is LIST: the only ones APPEND/SUBTRACT may touch (Kafka's
# ConfigurationControlManager refuses the others with INVALID_CONFIG).
LIST_TOPIC_CONFIGS: Final = frozenset({
    "cleanup.policy",
    "follower.replication.throttled.replicas",
    "leader.replication.throttled.replicas",
})


@dataclass(frozen=True, slots=True)
class ConfigOp:
    """One key of an alter request; AlterConfigs (33) sends every key as a SET."""

    name: str
    operation: int
    value: str | None


@dataclass(frozen=True, slots=True)
class ConfigAlteration:
    """One resource of an AlterConfigs / IncrementalAlterConfigs request.

    ``incremental`` False is AlterConfigs (33): the keys given become the resource's whole set
    of dynamic configs, every other override is deleted (Kafka's legacy semantics).
    """

    resource_type: int
    resource_name: str
    ops: tuple[ConfigOp, ...]
    incremental: bool


def plan_config_change(
    image: MetadataImage, request: ConfigAlteration, defaults: Mapping[str, str]
) -> Decision:
    """Validate ``request`` against ``image`` and return the AlterConfigs record it needs.

    ``defaults`` are the effective topic-level defaults (what APPEND/SUBTRACT start from when a
    topic has no override, as Kafka does). The proposal carries the resource's version for
    compare-and-set, so a concurrent change makes the state machine refuse it (STALE) and the
    caller re-plans from the newer image. No proposal: nothing would change.
    """
    if request.resource_type == CONFIG_RESOURCE_TOPIC:
        topic = image.topics.get(request.resource_name)
        if topic is None:
            return rejected(errors.UNKNOWN_TOPIC_OR_PARTITION,
                             f"Topic '{request.resource_name}' does not exist.")
        current, version = dict(topic.configs), topic.version
    elif request.resource_type == CONFIG_RESOURCE_BROKER:
        name = request.resource_name
        if name and not (name.isascii() and name.isdigit()):
            return rejected(errors.INVALID_REQUEST,
                             f"Broker resource name {name!r} is neither '' nor a node id.")
        resource = image.broker_configs.get(name)
        current = {} if resource is None else dict(resource.configs)
        version = -1 if resource is None else resource.version
    else:
        return rejected(errors.INVALID_REQUEST,
                         f"Unsupported config resource type {request.resource_type}.")
    try:
        wanted = _apply_config_ops(request, current, defaults)
    except _ConfigRefused as refused:
        return rejected(refused.error_code, str(refused))
    if request.resource_type == CONFIG_RESOURCE_TOPIC:
        # The effective policy: an override, else the topic default it would fall back to.
        policy = wanted.get("cleanup.policy", defaults.get("cleanup.policy"))
        problem = cleanup_policy_refusal(request.resource_name, policy)
        if problem is not None:
            return rejected(errors.INVALID_CONFIG, problem)
    delete = tuple(sorted(set(current) - set(wanted)))
    changed = tuple(sorted((k, v) for k, v in wanted.items() if current.get(k) != v))
    if not delete and not changed:
        return Decision()
    record = AlterConfigs(request.resource_type, request.resource_name, changed, delete)
    return Decision(proposals=(Proposal(record, version, "AlterConfigs"),))


class _ConfigRefused(Exception):
    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


def _apply_config_ops(
    request: ConfigAlteration, current: Mapping[str, str], defaults: Mapping[str, str]
) -> dict[str, str]:
    """The resource's dynamic configs after ``request``, every value validated.

    Raises:
        _ConfigRefused: INVALID_REQUEST (duplicate key, null value, bad operation) or
            INVALID_CONFIG (unknown name, bad value, APPEND/SUBTRACT on a non-list config).
    """
    is_topic = request.resource_type == CONFIG_RESOURCE_TOPIC
    known = TOPIC_CONFIG_KEYS if is_topic else BROKER_DYNAMIC_CONFIG_KEYS
    names = [op.name for op in request.ops]
    if len(set(names)) != len(names):
        raise _ConfigRefused(errors.INVALID_REQUEST, "Error due to duplicate config keys.")
    result = dict(current) if request.incremental else {}
    for op in request.ops:
        if op.name not in known:
            kind = "topic config" if is_topic else "dynamic broker config"
            raise _ConfigRefused(errors.INVALID_CONFIG, f"Unknown {kind} name: {op.name}")
        if op.operation == CONFIG_OP_DELETE:
            result.pop(op.name, None)
            continue
        if op.operation not in (CONFIG_OP_SET, CONFIG_OP_APPEND, CONFIG_OP_SUBTRACT):
            raise _ConfigRefused(errors.INVALID_REQUEST,
                                 f"Unknown config operation {op.operation} for {op.name}.")
        if op.value is None:
            raise _ConfigRefused(errors.INVALID_REQUEST, f"Null value not supported for: {op.name}")
        if op.operation == CONFIG_OP_SET:
            result[op.name] = op.value
        else:
            result[op.name] = _list_op(op, result.get(op.name, defaults.get(op.name)), is_topic)
    for key, value in sorted(result.items()):
        if key in current and current[key] == value:
            continue  # unchanged, even if the validation rules have tightened since
        problem = (validate_topic_config(key, value) if is_topic
                   else validate_broker_dynamic_config(key, value))
        if problem is not None:
            raise _ConfigRefused(errors.INVALID_CONFIG, problem)
    return result


def _list_op(op: ConfigOp, base: str | None, is_topic: bool) -> str:
    """APPEND adds the items of ``op.value`` not yet in ``base``; SUBTRACT removes them."""
    if not is_topic or op.name not in LIST_TOPIC_CONFIGS:
        verb = "append to" if op.operation == CONFIG_OP_APPEND else "subtract from"
        raise _ConfigRefused(errors.INVALID_CONFIG,
                             f"Can't {verb} key {op.name} because its type is not LIST.")
    assert op.value is not None
    items = list(parse_list(base or ""))
    change = parse_list(op.value)
    if op.operation == CONFIG_OP_APPEND:
        items += [item for item in change if item not in items]
    else:
        items = [item for item in items if item not in change]
    return ",".join(items)
