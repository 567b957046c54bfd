"""`raftlog` command line, in the spirit of Kafka's scripts.

    raftlog server --config server.properties [--override key=value ...]
    raftlog topics create|list|describe|delete --bootstrap-server HOST:PORT ...
    raftlog topics alter --topic T [--add-config k=v[,k=v]] [--delete-config k]
    raftlog produce TOPIC [--key-separator SEP]        (lines from stdin)
    raftlog consume TOPIC [--from-beginning] [--max-messages N]
    raftlog demo                                       (start a node, produce, consume, stop)
    raftlog cluster up [--nodes 3] [--data-dir DIR] [--port-base N] [--override K=V ...]
    raftlog quorum status --bootstrap-server HOST:PORT (the metadata quorum: voters, leader, lag)
    raftlog groups list|describe|delete|reset-offsets --bootstrap-server HOST:PORT [--group G]
    raftlog transactions list|describe|abort --bootstrap-server HOST:PORT [--transactional-id ID]
    raftlog top [--metrics URL[,URL...] | --data-dir DIR] [--interval S] [--once]
                                                       (live view from the nodes' /metrics)
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import trio

from raftlog.client.connection import KafkaClientError, Security, connect_any
from raftlog.config import ConfigError, ServerConfig, load_properties
from raftlog.protocol.schemas import METADATA
from raftlog.tools import command_config
from raftlog.tools import console as tools

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_CLUSTER_DIR = "raftlog-cluster"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raftlog", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log-level", default="INFO")
    commands = parser.add_subparsers(dest="command", required=True)

    server = commands.add_parser("server", help="run a node")
    server.add_argument("--config", required=True, help="server.properties file")
    server.add_argument("--override", action="append", default=[], metavar="KEY=VALUE")

    topics = commands.add_parser("topics",
                                 help="create, list, describe, alter or delete topics")
    topics.add_argument("action", choices=["create", "list", "describe", "alter", "delete"])
    topics.add_argument("--bootstrap-server", default=DEFAULT_BOOTSTRAP)
    topics.add_argument("--topic")
    topics.add_argument("--partitions", type=int, default=-1)
    topics.add_argument("--replication-factor", type=int, default=-1)
    topics.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    topics.add_argument("--add-config", action="append", default=[], metavar="K=V[,K=V]",
                        help="alter: set these configs (list values in [a,b])")
    topics.add_argument("--delete-config", action="append", default=[], metavar="KEY",
                        help="alter: remove this override (back to the default)")
    command_config.add_argument(topics)

    produce = commands.add_parser("produce", help="console producer: one record per line")
    produce.add_argument("topic")
    produce.add_argument("--bootstrap-server", default=DEFAULT_BOOTSTRAP)
    produce.add_argument("--key-separator", default=None,
                         help="split each line into key and value at this string")
    produce.add_argument("--acks", type=int, default=-1, choices=[-1, 0, 1])
    command_config.add_argument(produce)

    consume = commands.add_parser("consume", help="console consumer")
    consume.add_argument("topic")
    consume.add_argument("--bootstrap-server", default=DEFAULT_BOOTSTRAP)
    consume.add_argument("--from-beginning", action="store_true")
    consume.add_argument("--max-messages", type=int, default=None)
    consume.add_argument("--timeout-ms", type=int, default=None,
                         help="exit after this long without a new record")
    consume.add_argument("--print-key", action="store_true")
    consume.add_argument("--print-offset", action="store_true")
    command_config.add_argument(consume)

    demo = commands.add_parser("demo", help="start a local node and run a sample stream")
    demo.add_argument("--records", type=int, default=10_000)

    cluster = commands.add_parser("cluster", help="run a local multi-node cluster")
    cluster.add_argument("action", choices=["up"])
    cluster.add_argument("--nodes", type=int, default=None,
                         help="number of combined nodes (default 3; fixed at creation)")
    cluster.add_argument("--data-dir", default=DEFAULT_CLUSTER_DIR,
                         help=f"cluster directory (default ./{DEFAULT_CLUSTER_DIR})")
    cluster.add_argument("--port-base", type=int, default=None,
                         help="Kafka port of node 1 (default 9092; 0 picks free ports)")
    cluster.add_argument("--ready-timeout", type=float, default=60.0,
                         help="seconds to wait for the cluster to serve produce requests")
    cluster.add_argument("--secure", action="store_true", default=None,
                         help="SASL_SSL listeners with a local CA and an admin SCRAM user;"
                              " prints a client config file (fixed at creation)")
    cluster.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                         help="a server property for every node, this start only"
                              " (e.g. trace.produce.enable=true)")

    quorum = commands.add_parser("quorum", help="describe the metadata quorum")
    quorum.add_argument("action", choices=["status"])
    quorum.add_argument("--bootstrap-server", default=DEFAULT_BOOTSTRAP)
    command_config.add_argument(quorum)

    from raftlog.tools import consumer_groups as group_cli

    group_cli.add_parser(commands)
    from raftlog.tools import transactions as txn_cli

    txn_cli.add_parser(commands)
    from raftlog.tools import users as users_cli

    users_cli.add_parser(commands)
    from raftlog.tools import acls as acls_cli

    acls_cli.add_parser(commands)
    from raftlog.tools import quotas as quotas_cli

    quotas_cli.add_parser(commands)
    from raftlog.tools import storage_format

    storage_format.add_parser(commands)
    from raftlog.tools import top

    top.add_parser(commands, DEFAULT_CLUSTER_DIR)
    return parser


def _key_values(items: Sequence[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(what, f"{item!r} is not KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return _run(args)
    except (ConfigError, KafkaClientError) as exc:
        print(f"raftlog: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _run(args: argparse.Namespace) -> int:
    if args.command == "server":
        from raftlog.node import run_until_signalled

        properties = load_properties(args.config)
        config = ServerConfig.from_properties(properties,
                                              _key_values(args.override, "--override"))
        trio.run(run_until_signalled, config)
        return 0
    if args.command in ("topics", "produce", "consume", "quorum"):
        security = command_config.from_args(args)
    if args.command == "topics":
        configs = _key_values(args.config, "--config")
        bootstrap = args.bootstrap_server
        if args.action == "alter":
            if args.topic is None:
                raise KafkaClientError("topics alter needs --topic")
            deletes = [k.strip() for item in args.delete_config for k in item.split(",")
                       if k.strip()]
            return trio.run(tools.alter_topic_configs, bootstrap, args.topic,
                            tools.parse_add_config(args.add_config), deletes, security)
        if args.action in ("create", "delete"):
            # Only the controller creates and deletes topics; others answer NOT_CONTROLLER.
            bootstrap = trio.run(_controller_bootstrap, bootstrap, security)
        return trio.run(tools.topics_command, bootstrap, args.action, args.topic,
                        args.partitions, args.replication_factor, configs, security)
    if args.command == "produce":
        return trio.run(tools.console_produce, args.bootstrap_server, args.topic,
                        args.key_separator, args.acks, security)
    if args.command == "consume":
        return trio.run(tools.console_consume, args.bootstrap_server, args.topic,
                        args.from_beginning, args.max_messages, args.timeout_ms,
                        args.print_key, args.print_offset, security)
    if args.command == "cluster":
        from raftlog.tools.cluster import ClusterError, cluster_up

        try:
            return trio.run(functools.partial(
                cluster_up, Path(args.data_dir), args.nodes, args.port_base,
                log_level=args.log_level.upper(), ready_timeout_s=args.ready_timeout,
                secure=args.secure, overrides=_key_values(args.override, "--override")))
        except (ClusterError, ConfigError) as exc:
            print(f"raftlog cluster: {exc}", file=sys.stderr)
            return 2
    if args.command == "quorum":
        from raftlog.tools.cluster import quorum_status

        return trio.run(quorum_status, args.bootstrap_server, security)
    if args.command == "groups":
        from raftlog.tools import consumer_groups as group_cli

        return group_cli.run(args)
    if args.command == "transactions":
        from raftlog.tools import transactions as txn_cli

        return txn_cli.run(args)
    if args.command == "format":
        from raftlog.tools import storage_format

        return storage_format.run(args)
    if args.command == "users":
        from raftlog.tools import users as users_cli

        return users_cli.run(args)
    if args.command == "acls":
        from raftlog.tools import acls as acls_cli

        return acls_cli.run(args)
    if args.command == "quotas":
        from raftlog.tools import quotas as quotas_cli

        return quotas_cli.run(args)
    if args.command == "top":
        from raftlog.tools import top

        return top.run(args)
    if args.command == "demo":
        from raftlog.tools.demo import run_demo

        return run_demo(args.records)
    raise AssertionError(args.command)


async def _controller_bootstrap(bootstrap: str, security: Security) -> str:
    """The controller's address per Metadata's ``controller_id`` (else ``bootstrap``)."""
    connection = await connect_any(bootstrap, security=security)
    try:
        response = await connection.request(METADATA, {"topics": []})
    finally:
        await connection.aclose()
    for broker in response.brokers:
        if broker.node_id == response.controller_id:
            return f"{broker.host}:{broker.port}"
    return bootstrap
