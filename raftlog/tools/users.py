"""``raftlog users add|list|delete``: SCRAM users in the metadata log (Kafka's
``kafka-configs.sh --alter --add-config 'SCRAM-SHA-512=[iterations=8192,password=...]'
--entity-type users``), over DescribeUserScramCredentials (50) and AlterUserScramCredentials
(51).

* ``add NAME --password P | --password-file F [--mechanism SCRAM-SHA-512] [--iterations
  8192]``: the salt is drawn here and the password salted here (PBKDF2); only the salt and the
  salted password cross the network, and the node stores only the keys derived from them.
  Adding an existing user replaces that mechanism's credential (a password change).
* ``list [NAME...]``: the users with their mechanisms and iteration counts.
* ``delete NAME [--mechanism M]``: one mechanism's credential (both by default).

``--command-config FILE`` with ``raft.secret`` / ``raft.secret.file`` logs the tool in as the
cluster admin (needed on a SASL listener).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import trio

from raftlog.broker.scram_apis import MECHANISM_BY_TYPE, TYPE_BY_MECHANISM
from raftlog.client.connection import KafkaClientError, connect_any
from raftlog.config import ConfigError
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas_security import (
    ALTER_USER_SCRAM_CREDENTIALS,
    DESCRIBE_USER_SCRAM_CREDENTIALS,
)
from raftlog.security.scram import salted_password
from raftlog.tools import command_config

__all__ = ["add_parser", "run"]

ACTIONS = ("add", "list", "delete")
ITERATIONS_DEFAULT = 8192
SALT_BYTES = 32


def add_parser(commands: Any) -> None:
    """Adds the ``users`` subcommand to ``raftlog``'s subparsers."""
    parser = commands.add_parser("users", help="add, list or delete SCRAM users")
    parser.add_argument("action", choices=ACTIONS)
    parser.add_argument("names", nargs="*", metavar="NAME")
    parser.add_argument("--bootstrap-server", default="127.0.0.1:9092")
    parser.add_argument("--mechanism", choices=sorted(TYPE_BY_MECHANISM), default=None,
                        help="add: SCRAM-SHA-512 by default; delete: every mechanism")
    parser.add_argument("--iterations", type=int, default=ITERATIONS_DEFAULT,
                        help="4096..16384 (default %(default)s)")
    parser.add_argument("--password")
    parser.add_argument("--password-file", help="a file whose first line is the password")
    command_config.add_argument(parser)


def run(args: argparse.Namespace) -> int:
    try:
        return trio.run(users_command, args)
    except (KafkaClientError, ConfigError, OSError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1


def _password(args: argparse.Namespace) -> str:
    if (args.password is None) == (args.password_file is None):
        raise ConfigError("--password", "add needs exactly one of --password, --password-file")
    if args.password is not None:
        password: str = args.password
    else:
        lines = Path(args.password_file).read_text(encoding="utf-8").splitlines()
        password = lines[0] if lines else ""
    if not password:
        raise ConfigError("--password", "the password is empty")
    return password


def upsertion(name: str, mechanism: str, password: str, iterations: int) -> dict[str, Any]:
    """One AlterUserScramCredentials upsertion: a fresh salt and the salted password."""
    salt = os.urandom(SALT_BYTES)
    return {"name": name, "mechanism": TYPE_BY_MECHANISM[mechanism], "iterations": iterations,
            "salt": salt,
            "salted_password": salted_password(mechanism, password.encode(), salt, iterations)}


async def users_command(args: argparse.Namespace) -> int:
    if args.action in ("add", "delete") and not args.names:
        print(f"Error: {args.action} needs a user name", file=sys.stderr)
        return 2
    body: dict[str, Any]
    if args.action == "add":
        password = _password(args)
        mechanism = args.mechanism or "SCRAM-SHA-512"
        body = {"deletions": [], "upsertions": [
            upsertion(name, mechanism, password, args.iterations) for name in args.names]}
    elif args.action == "delete":
        mechanisms = [args.mechanism] if args.mechanism else None
        body = {"deletions": [], "upsertions": []}
        async with await connect_any(args.bootstrap_server,
                                     security=command_config.from_args(args)) as connection:
            described = await connection.request(DESCRIBE_USER_SCRAM_CREDENTIALS,
                                                 {"users": [{"name": n} for n in args.names]})
        for result in described.results:
            held = [MECHANISM_BY_TYPE[i.mechanism] for i in result.credential_infos]
            for mechanism in mechanisms or held or ["SCRAM-SHA-512"]:
                body["deletions"].append({"name": result.user,
                                          "mechanism": TYPE_BY_MECHANISM[mechanism]})
    else:
        return await _list(args)
    async with await connect_any(args.bootstrap_server,
                                 security=command_config.from_args(args)) as connection:
        response = await connection.request(ALTER_USER_SCRAM_CREDENTIALS, body)
    failed = 0
    for result in response.results:
        if result.error_code:
            failed += 1
            print(f"{result.user}: {ErrorCode(result.error_code).name}: {result.error_message}",
                  file=sys.stderr)
        else:
            print(f"{result.user}: {'added' if args.action == 'add' else 'deleted'}")
    return 1 if failed else 0


async def _list(args: argparse.Namespace) -> int:
    users = [{"name": name} for name in args.names] or None
    async with await connect_any(args.bootstrap_server,
                                 security=command_config.from_args(args)) as connection:
        response = await connection.request(DESCRIBE_USER_SCRAM_CREDENTIALS, {"users": users})
    if response.error_code:
        print(f"Error: {ErrorCode(response.error_code).name}: {response.error_message}",
              file=sys.stderr)
        return 1
    status = 0
    for result in response.results:
        if result.error_code:
            status = 1
            print(f"{result.user}: {ErrorCode(result.error_code).name}", file=sys.stderr)
            continue
        mechanisms = ", ".join(f"{MECHANISM_BY_TYPE[i.mechanism]} (iterations {i.iterations})"
                               for i in result.credential_infos)
        print(f"{result.user}: {mechanisms}")
    return status
