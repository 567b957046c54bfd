"""``raftlog acls add|list|remove``: ACL bindings in the spirit of Kafka's ``kafka-acls.sh``,
over CreateAcls (30), DescribeAcls (29) and DeleteAcls (31).

* ``add --allow-principal User:alice [--deny-principal User:bob] --operation Read
  [--operation Write] (--topic T | --group G | --cluster | --transactional-id X)
  [--resource-pattern-type literal|prefixed] [--allow-host H] [--deny-host H]``: one binding
  per principal, host, operation and resource.
* ``list [resource options] [--principal P] [--resource-pattern-type any|match|literal|
  prefixed]``: without a resource, every binding (pattern type ``any`` by default).
* ``remove``: with principals, the bindings ``add`` would have made; without, every binding of
  the resource (and pattern type, ``literal`` by default).

``--command-config FILE`` with ``raft.secret`` / ``raft.secret.file`` logs the tool in as the
cluster admin (a super user; needed on a SASL listener).
"""

from __future__ import annotations

import argparse
import sys
from itertools import product
from typing import Any

import trio

from raftlog.client.connection import KafkaClientError, connect_any
from raftlog.config import ConfigError
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas_security import CREATE_ACLS, DELETE_ACLS, DESCRIBE_ACLS
from raftlog.security.acl import (
    CLUSTER_NAME,
    AclOperation,
    AclPermission,
    AclResourceType,
    PatternType,
)
from raftlog.tools import command_config

__all__ = ["add_parser", "run"]

ACTIONS = ("add", "list", "remove")
OPERATIONS = {op.name.replace("_", "").lower(): op for op in AclOperation
              if op not in (AclOperation.UNKNOWN, AclOperation.ANY)}
PATTERNS = ("literal", "prefixed", "match", "any")


def add_parser(commands: Any) -> None:
    """Adds the ``acls`` subcommand to ``raftlog``'s subparsers."""
    parser = commands.add_parser("acls", help="add, list or remove ACLs (kafka-acls.sh)")
    parser.add_argument("action", choices=ACTIONS)
    parser.add_argument("--bootstrap-server", default="127.0.0.1:9092")
    command_config.add_argument(parser)
    parser.add_argument("--allow-principal", action="append", default=[])
    parser.add_argument("--deny-principal", action="append", default=[])
    parser.add_argument("--principal", action="append", default=[],
                        help="list: only the bindings of these principals")
    parser.add_argument("--allow-host", action="append", default=[])
    parser.add_argument("--deny-host", action="append", default=[])
    parser.add_argument("--operation", action="append", default=[],
                        help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, "
                        "DescribeConfigs, AlterConfigs, IdempotentWrite, All")
    parser.add_argument("--topic", action="append", default=[])
    parser.add_argument("--group", action="append", default=[])
    parser.add_argument("--transactional-id", action="append", default=[])
    parser.add_argument("--cluster", action="store_true")
    parser.add_argument("--resource-pattern-type", choices=PATTERNS, default=None)


def run(args: argparse.Namespace) -> int:
    try:
        return trio.run(acls_command, args)
    except (KafkaClientError, ConfigError, OSError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1


def resources(args: argparse.Namespace) -> list[tuple[AclResourceType, str]]:
    found = [(AclResourceType.TOPIC, t) for t in args.topic]
    found += [(AclResourceType.GROUP, g) for g in args.group]
    found += [(AclResourceType.TRANSACTIONAL_ID, t) for t in args.transactional_id]
    if args.cluster:
        found.append((AclResourceType.CLUSTER, CLUSTER_NAME))
    return found


def operations(args: argparse.Namespace) -> list[AclOperation]:
    chosen: list[AclOperation] = []
    for name in args.operation:
        op = OPERATIONS.get(name.replace("-", "").replace("_", "").lower())
        if op is None:
            raise ConfigError("--operation", f"unknown operation {name!r}")
        chosen.append(op)
    return chosen


def entries(args: argparse.Namespace) -> list[tuple[str, str, AclPermission]]:
    """(principal, host, permission) of every principal given, each host of its kind."""
    allow_hosts = args.allow_host or ["*"]
    deny_hosts = args.deny_host or ["*"]
    return ([(p, h, AclPermission.ALLOW) for p, h in product(args.allow_principal, allow_hosts)]
            + [(p, h, AclPermission.DENY) for p, h in product(args.deny_principal, deny_hosts)])


def _pattern(args: argparse.Namespace, default: str) -> PatternType:
    return PatternType[(args.resource_pattern_type or default).upper()]


async def acls_command(args: argparse.Namespace) -> int:
    async with await connect_any(args.bootstrap_server,
                                 security=command_config.from_args(args)) as connection:
        if args.action == "add":
            return await _add(connection, args)
        if args.action == "remove":
            return await _remove(connection, args)
        return await _list(connection, args)


async def _add(connection: Any, args: argparse.Namespace) -> int:
    pattern = _pattern(args, "literal")
    if pattern not in (PatternType.LITERAL, PatternType.PREFIXED):
        print("Error: add needs --resource-pattern-type literal or prefixed", file=sys.stderr)
        return 2
    targets, ops, who = resources(args), operations(args), entries(args)
    if not (targets and ops and who):
        print("Error: add needs a resource, --operation and --allow-principal or"
              " --deny-principal", file=sys.stderr)
        return 2
    creations: list[dict[str, Any]] = [{"resource_type": kind, "resource_name": name,
                  "resource_pattern_type": pattern, "principal": principal, "host": host,
                  "operation": op, "permission_type": permission}
                 for (kind, name), op, (principal, host, permission)
                 in product(targets, ops, who)]
    response = await connection.request(CREATE_ACLS, {"creations": creations})
    failed = 0
    for creation, result in zip(creations, response.results, strict=True):
        text = _binding_text(creation["resource_type"], creation["resource_name"], pattern,
                             creation["principal"], creation["host"], creation["operation"],
                             creation["permission_type"])
        if result.error_code:
            failed += 1
            print(f"{text}: {ErrorCode(result.error_code).name}: {result.error_message}",
                  file=sys.stderr)
        else:
            print(f"Added {text}")
    return 1 if failed else 0


def _filters(args: argparse.Namespace, pattern: PatternType) -> list[dict[str, Any]]:
    targets: list[tuple[AclResourceType, str | None]] = [*resources(args)] or [
        (AclResourceType.ANY, None)]
    base = [{"resource_type_filter": kind, "resource_name_filter": name,
             "pattern_type_filter": pattern} for kind, name in targets]
    who: list[tuple[str | None, str | None, int]] = [
        (p, h, perm) for p, h, perm in entries(args)]
    who += [(p, None, AclPermission.ANY) for p in args.principal]
    if not who:
        who = [(None, None, AclPermission.ANY)]
    ops: list[AclOperation] = operations(args) or [AclOperation.ANY]
    return [{**b, "principal_filter": p, "host_filter": h, "operation": op,
             "permission_type": perm} for b, (p, h, perm), op in product(base, who, ops)]


async def _remove(connection: Any, args: argparse.Namespace) -> int:
    if not resources(args):
        print("Error: remove needs a resource (--topic, --group, --transactional-id or"
              " --cluster)", file=sys.stderr)
        return 2
    filters = _filters(args, _pattern(args, "literal"))
    response = await connection.request(DELETE_ACLS, {"filters": filters})
    failed = 0
    for result in response.filter_results:
        if result.error_code:
            failed += 1
            print(f"Error: {ErrorCode(result.error_code).name}: {result.error_message}",
                  file=sys.stderr)
        for acl in result.matching_acls:
            print("Removed " + _binding_text(acl.resource_type, acl.resource_name,
                                             acl.pattern_type, acl.principal, acl.host,
                                             acl.operation, acl.permission_type))
    return 1 if failed else 0


async def _list(connection: Any, args: argparse.Namespace) -> int:
    pattern = _pattern(args, "literal" if resources(args) else "any")
    status = 0
    for acl_filter in _filters(args, pattern):
        response = await connection.request(DESCRIBE_ACLS, acl_filter)
        if response.error_code:
            print(f"Error: {ErrorCode(response.error_code).name}: {response.error_message}",
                  file=sys.stderr)
            status = 1
            continue
        for resource in response.resources:
            print(f"Current ACLs for resource `ResourcePattern(resourceType="
                  f"{AclResourceType(resource.resource_type).name}, name="
                  f"{resource.resource_name}, patternType="
                  f"{PatternType(resource.pattern_type).name})`:")
            for acl in resource.acls:
                print(f" \t(principal={acl.principal}, host={acl.host}, operation="
                      f"{AclOperation(acl.operation).name}, permissionType="
                      f"{AclPermission(acl.permission_type).name})")
    return status


def _binding_text(kind: int, name: str, pattern: int, principal: str, host: str,
                  operation: int, permission: int) -> str:
    return (f"{AclPermission(permission).name} {principal} from {host}: "
            f"{AclOperation(operation).name} on {AclResourceType(kind).name}:"
            f"{PatternType(pattern).name}:{name}")
