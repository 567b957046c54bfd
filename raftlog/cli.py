"""`raftlog` command line, in the spirit of Kafka's scripts.

    raftlog server --config server.properties [--override key=value ...]
    raftlog topics create|list|describe|delete --bootstrap-server HOST:PORT ...
    raftlog produce TOPIC [--key-separator SEP]        (lines from stdin)
    raftlog consume TOPIC [--from-beginning] [--max-messages N]
    raftlog demo                                       (start a node, produce, consume, stop)
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import trio

from raftlog import tools
from raftlog.config import ConfigError, ServerConfig, load_properties
from raftlog.fetch.client import KafkaClientError

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raftlog", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log-level", default="INFO")
    commands = parser.add_subparsers(dest="command", required=True)

    server = commands.add_parser("server", help="run a node")
    server.add_argument("--config", required=True, help="server.properties file")
    server.add_argument("--override", action="append", default=[], metavar="KEY=VALUE")

    topics = commands.add_parser("topics", help="create, list, describe or delete topics")
    topics.add_argument("action", choices=["create", "list", "describe", "delete"])
    topics.add_argument("--bootstrap-server", default=DEFAULT_BOOTSTRAP)
    topics.add_argument("--topic")
    topics.add_argument("--partitions", type=int, default=-1)
    topics.add_argument("--replication-factor", type=int, default=-1)
    topics.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")

    produce = commands.add_parser("produce", help="console producer: one record per line")
    produce.add_argument("topic")
    produce.add_argument("--bootstrap-server", default=DEFAULT_BOOTSTRAP)
    produce.add_argument("--key-separator", default=None,
                         help="split each line into key and value at this string")
    produce.add_argument("--acks", type=int, default=-1, choices=[-1, 0, 1])

    consume = commands.add_parser("consume", help="console consumer")
    consume.add_argument("topic")
    consume.add_argument("--bootstrap-server", default=DEFAULT_BOOTSTRAP)
    consume.add_argument("--from-beginning", action="store_true")
    consume.add_argument("--max-messages", type=int, default=None)
    consume.add_argument("--timeout-ms", type=int, default=None,
                         help="exit after this long without a new record")
    consume.add_argument("--print-key", action="store_true")
    consume.add_argument("--print-offset", action="store_true")

    demo = commands.add_parser("demo", help="start a local node and run a sample stream")
    demo.add_argument("--records", type=int, default=10_000)
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
    if args.command == "topics":
        configs = _key_values(args.config, "--config")
        return trio.run(tools.topics_command, args.bootstrap_server, args.action, args.topic,
                        args.partitions, args.replication_factor, configs)
    if args.command == "produce":
        return trio.run(tools.console_produce, args.bootstrap_server, args.topic,
                        args.key_separator, args.acks)
    if args.command == "consume":
        return trio.run(tools.console_consume, args.bootstrap_server, args.topic,
                        args.from_beginning, args.max_messages, args.timeout_ms,
                        args.print_key, args.print_offset)
    if args.command == "demo":
        from raftlog.demo import run_demo

        return run_demo(args.records)
    raise AssertionError(args.command)
