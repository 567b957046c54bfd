"""``raftlog quotas describe|alter``: client quotas in the metadata log, in the spirit of
``kafka-configs.sh --entity-type users|clients``, over DescribeClientQuotas (48) and
AlterClientQuotas (49).

* ``describe [--user U | --user-default] [--client-id C | --client-default]``: every quota
  entity without options; with them, exactly the entity they name (``--user U`` alone is
  /users/U, not /users/U/clients/C).
* ``alter (--user U | --user-default) and/or (--client-id C | --client-default)
  [--add-config producer_byte_rate=1048576,consumer_byte_rate=...,request_percentage=...]
  [--delete-config KEY,...] [--validate-only]``.

``--command-config FILE`` takes client properties (``raftlog.tools.command_config``): a SASL
user, TLS settings, or ``raft.secret`` for the cluster admin.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import trio

from raftlog.client.connection import KafkaClientError, connect_any
from raftlog.config import ConfigError
from raftlog.metadata.quota_apply import CLIENT_ID, QUOTA_KEYS, USER
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas_quota import ALTER_CLIENT_QUOTAS, DESCRIBE_CLIENT_QUOTAS
from raftlog.tools import command_config

__all__ = ["add_parser", "run"]

MATCH_EXACT, MATCH_DEFAULT = 0, 1


def add_parser(commands: Any) -> None:
    """Adds the ``quotas`` subcommand to ``raftlog``'s subparsers."""
    parser = commands.add_parser("quotas", help="describe or alter client quotas")
    parser.add_argument("action", choices=("describe", "alter"))
    parser.add_argument("--bootstrap-server", default="127.0.0.1:9092")
    user = parser.add_mutually_exclusive_group()
    user.add_argument("--user", help="the user (principal name) the quota is for")
    user.add_argument("--user-default", action="store_true", help="the default user")
    client = parser.add_mutually_exclusive_group()
    client.add_argument("--client-id", help="the client id the quota is for")
    client.add_argument("--client-default", action="store_true", help="the default client id")
    parser.add_argument("--add-config", default="", metavar="K=V,...",
                        help=f"set quotas: {', '.join(sorted(QUOTA_KEYS))}")
    parser.add_argument("--delete-config", default="", metavar="K,...", help="remove quotas")
    parser.add_argument("--validate-only", action="store_true")
    command_config.add_argument(parser)


def run(args: argparse.Namespace) -> int:
    try:
        return trio.run(quotas_command, args)
    except (KafkaClientError, ConfigError, OSError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1


def _entity(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    entity: list[tuple[str, str | None]] = []
    if args.user is not None or args.user_default:
        entity.append((USER, None if args.user_default else args.user))
    if args.client_id is not None or args.client_default:
        entity.append((CLIENT_ID, None if args.client_default else args.client_id))
    return entity


def parse_ops(add_config: str, delete_config: str) -> list[dict[str, Any]]:
    """AlterClientQuotas ops from ``k=v,...`` and ``k,...``."""
    ops: list[dict[str, Any]] = []
    for item in filter(None, (part.strip() for part in add_config.split(","))):
        key, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not sep or number != number:
            raise ConfigError("--add-config", f"{item!r} is not KEY=NUMBER")
        ops.append({"key": key.strip(), "value": number, "remove": False})
    for key in filter(None, (part.strip() for part in delete_config.split(","))):
        ops.append({"key": key, "value": 0.0, "remove": True})
    return ops


def _entity_text(entity: Any) -> str:
    return ",".join(f"{e.entity_type}={'<default>' if e.entity_name is None else e.entity_name}"
                    for e in sorted(entity, key=lambda e: e.entity_type != USER))


def _value_text(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)


async def quotas_command(args: argparse.Namespace) -> int:
    entity = _entity(args)
    security = command_config.from_args(args)
    if args.action == "describe":
        components = [{"entity_type": kind, "match_type": MATCH_DEFAULT if name is None
                       else MATCH_EXACT, "match": name} for kind, name in entity]
        async with await connect_any(args.bootstrap_server, security=security) as connection:
            response = await connection.request(
                DESCRIBE_CLIENT_QUOTAS, {"components": components, "strict": bool(entity)})
        if response.error_code:
            print(f"Error: {ErrorCode(response.error_code).name}: {response.error_message}",
                  file=sys.stderr)
            return 1
        for entry in response.entries or ():
            values = ", ".join(f"{v.key}={_value_text(v.value)}"
                               for v in sorted(entry.values, key=lambda v: v.key))
            print(f"{_entity_text(entry.entity)}: {values}")
        return 0
    if not entity:
        print("Error: alter needs --user/--user-default and/or --client-id/--client-default",
              file=sys.stderr)
        return 2
    ops = parse_ops(args.add_config, args.delete_config)
    if not ops:
        print("Error: alter needs --add-config and/or --delete-config", file=sys.stderr)
        return 2
    body = {"entries": [{"entity": [{"entity_type": kind, "entity_name": name}
                                    for kind, name in entity], "ops": ops}],
            "validate_only": args.validate_only}
    async with await connect_any(args.bootstrap_server, security=security) as connection:
        response = await connection.request(ALTER_CLIENT_QUOTAS, body)
    status = 0
    for result in response.entries:
        if result.error_code:
            status = 1
            print(f"{_entity_text(result.entity)}: {ErrorCode(result.error_code).name}:"
                  f" {result.error_message}", file=sys.stderr)
        else:
            done = "validated" if args.validate_only else "altered"
            print(f"{_entity_text(result.entity)}: {done}")
    return status
