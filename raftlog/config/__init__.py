"""Server configuration: a Kafka-style ``server.properties`` file, with Kafka's property names.

``load_properties`` reads Java ``.properties`` syntax; ``ServerConfig.from_properties`` turns the
strings into a validated, frozen config. The parts, each a module of this package:

* ``properties``: the file syntax, the typed value parsers and :class:`ConfigError`;
* ``catalog``: the properties raftlog understands and their defaults (Kafka's, except where a
  laptop wants something else, each case saying why), typed access falling back to them;
* ``topics``: the topic-level config names and their validation, because the broker's ``log.*``
  settings are the defaults for exactly those topic configs;
* ``listeners``: listener and voter lists and the listener rules of the server config;
* ``server_config``: :class:`ServerConfig` itself.

Unknown properties are logged at WARNING and ignored, as Kafka does; a bad value raises
:class:`ConfigError` naming the property. The names below are the package's interface.
"""

from raftlog.config.catalog import LOG_RETENTION_CHECK_INTERVAL_MS_DEFAULT
from raftlog.config.listeners import Listener, QuorumVoter
from raftlog.config.properties import (
    ConfigError,
    load_properties,
    parse_list,
    parse_properties,
)
from raftlog.config.server_config import ServerConfig, raft_secret_of
from raftlog.config.topics import (
    BROKER_DYNAMIC_CONFIG_KEYS,
    BROKER_TO_TOPIC_CONFIG,
    TOPIC_CONFIG_KEYS,
    validate_broker_dynamic_config,
    validate_topic_config,
)

__all__ = [
    "BROKER_DYNAMIC_CONFIG_KEYS",
    "BROKER_TO_TOPIC_CONFIG",
    "LOG_RETENTION_CHECK_INTERVAL_MS_DEFAULT",
    "TOPIC_CONFIG_KEYS",
    "ConfigError",
    "Listener",
    "QuorumVoter",
    "ServerConfig",
    "load_properties",
    "parse_list",
    "parse_properties",
    "raft_secret_of",
    "validate_broker_dynamic_config",
    "validate_topic_config",
]
