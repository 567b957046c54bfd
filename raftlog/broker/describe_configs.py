"""DescribeConfigs (32): a topic's configs, or a broker's, each with Kafka's config source.

A topic config comes from the topic's own override, else from a dynamic broker config
(AlterConfigs: this node's own over the cluster-wide default), else from the static default.
A BROKER resource is this node (its static properties overlaid by the dynamic ones) or, with
the empty name, the cluster-wide dynamic defaults only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from raftlog.config import BROKER_TO_TOPIC_CONFIG, TOPIC_CONFIG_KEYS, ServerConfig
from raftlog.metadata.image import MetadataImage
from raftlog.protocol.codec import Struct
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import DESCRIBE_CONFIGS
from raftlog.quorum.interface import Quorum
from raftlog.server.listener import Body, Handler, HandlerResult, RequestContext

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
CONFIG_SOURCE_TOPIC = 1
CONFIG_SOURCE_DYNAMIC_BROKER = 2
CONFIG_SOURCE_DYNAMIC_DEFAULT_BROKER = 3
CONFIG_SOURCE_STATIC_BROKER = 4
CONFIG_SOURCE_DEFAULT = 5


def dynamic_broker_configs(image: MetadataImage, node_id: int) -> dict[str, str]:
    """AlterConfigs' broker configs in effect on ``node_id``: its own over the cluster's."""
    merged: dict[str, str] = {}
    for name in ("", str(node_id)):
        resource = image.broker_configs.get(name)
        if resource is not None:
            merged.update(resource.configs)
    return merged


class ConfigApis:
    """DescribeConfigs, answered from this node's configuration and the metadata image."""

    def __init__(self, config: ServerConfig, quorum: Quorum) -> None:
        self.config = config
        self.quorum = quorum

    def handlers(self) -> dict[int, Handler]:
        table: dict[int, Callable[[RequestContext], HandlerResult]] = {
            DESCRIBE_CONFIGS.key: self.describe_configs,
        }
        return dict(table)

    def describe_configs(self, ctx: RequestContext) -> HandlerResult:
        version = ctx.header.api_version
        results = [self._describe_resource(r, version) for r in ctx.body.resources]
        return {"throttle_time_ms": 0, "results": results}

    def _describe_resource(self, resource: Struct, version: int) -> Body:
        result: Body = {"error_code": 0, "error_message": None,
                        "resource_type": resource.resource_type,
                        "resource_name": resource.resource_name, "configs": []}
        if resource.resource_type == RESOURCE_TOPIC:
            topic = self.quorum.image.topics.get(resource.resource_name)
            if topic is None:
                result["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                return result
            entries = self._topic_config_entries(dict(topic.configs))
        elif resource.resource_type == RESOURCE_BROKER:
            refusal = self._broker_name_refusal(resource.resource_name)
            if refusal is not None:
                result["error_code"] = ErrorCode.INVALID_REQUEST
                result["error_message"] = refusal
                return result
            entries = self._broker_config_entries(resource.resource_name)
        else:
            result["error_code"] = ErrorCode.INVALID_REQUEST
            result["error_message"] = f"Unsupported resource type {resource.resource_type}"
            return result
        wanted = resource.configuration_keys
        result["configs"] = [
            {"name": k, "value": v, "read_only": False, "is_default": source ==
             CONFIG_SOURCE_DEFAULT, "config_source": source, "is_sensitive": False,
             "synonyms": []}
            for k, v, source in entries if wanted is None or k in wanted
        ]
        return result

    def _topic_config_entries(self, overrides: Mapping[str, str]) -> list[tuple[str, str, int]]:
        defaults = self.config.topic_defaults(
            dynamic_broker_configs(self.quorum.image, self.config.node_id))
        inherited = self._dynamic_topic_default_sources()
        entries = []
        for key in sorted(TOPIC_CONFIG_KEYS):
            if key in overrides:
                entries.append((key, overrides[key], CONFIG_SOURCE_TOPIC))
            elif key in defaults:
                entries.append((key, defaults[key], inherited.get(key, CONFIG_SOURCE_DEFAULT)))
        return entries

    def _dynamic_topic_default_sources(self) -> dict[str, int]:
        """Topic configs whose default comes from a dynamic broker config, with Kafka's source
        for it: this node's own (DYNAMIC_BROKER_CONFIG) wins over the cluster-wide one."""
        sources: dict[str, int] = {}
        for name, source in (("", CONFIG_SOURCE_DYNAMIC_DEFAULT_BROKER),
                             (str(self.config.node_id), CONFIG_SOURCE_DYNAMIC_BROKER)):
            resource = self.quorum.image.broker_configs.get(name)
            for key in resource.configs if resource is not None else ():
                if key in BROKER_TO_TOPIC_CONFIG:
                    sources[BROKER_TO_TOPIC_CONFIG[key]] = source
        return sources

    def _broker_name_refusal(self, name: str) -> str | None:
        """Why a BROKER resource name is refused, as Kafka's ConfigHelper words it: a node
        describes only itself (its id) or the cluster-wide defaults (the empty name)."""
        if not name:
            return None
        try:
            if name.strip() != name or "_" in name:  # which Java's toInt refuses too
                raise ValueError(name)
            broker_id = int(name)
        except ValueError:
            return f"Broker id must be an integer, but it is: {name}"
        if broker_id != self.config.node_id:
            return (f"Unexpected broker id, expected {self.config.node_id} or empty string, "
                    f"but received {name}")
        return None

    def _broker_config_entries(self, name: str) -> list[tuple[str, str, int]]:
        """For this node's id: static properties overlaid by AlterConfigs' dynamic ones, this
        node's own (DYNAMIC_BROKER_CONFIG) over the cluster default
        (DYNAMIC_DEFAULT_BROKER_CONFIG). For the empty name: only the cluster-wide dynamic
        defaults, as Kafka (no static properties)."""
        props: dict[str, tuple[str, int]] = {}
        layers = [("", CONFIG_SOURCE_DYNAMIC_DEFAULT_BROKER)]
        if name:
            props = {k: (v, CONFIG_SOURCE_STATIC_BROKER)
                     for k, v in _broker_properties(self.config).items()}
            layers.append((str(self.config.node_id), CONFIG_SOURCE_DYNAMIC_BROKER))
        for resource_name, source in layers:
            dynamic = self.quorum.image.broker_configs.get(resource_name)
            if dynamic is not None:
                props.update((k, (v, source)) for k, v in dynamic.configs.items())
        return [(k, v, source) for k, (v, source) in sorted(props.items())]


def _broker_properties(config: ServerConfig) -> dict[str, str]:
    """The broker's effective static settings under Kafka's property names."""
    out = {}
    for item in dataclasses.fields(config):
        value = getattr(config, item.name)
        if item.name == "raft_secret" or not isinstance(value, int | str | bool):
            continue
        out[item.name.replace("_", ".")] = str(value).lower() if isinstance(value, bool) \
            else str(value)
    return out
