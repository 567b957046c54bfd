"""ACL checks of the group, transaction and cluster-wide APIs (see ``acl_guards``), and the
table of every guard by API key.

Kafka's rules: the group APIs need Read on the group (DescribeGroups and FindCoordinator
Describe, DeleteGroups Delete) and the commits Read on each topic; the transactional APIs need
Write on the transactional id (plus Write on each topic, Read on the group as the request
names them); InitProducerId without a transactional id needs IdempotentWrite on the cluster or
Write on some topic; cluster-wide administration needs Describe or Alter on the cluster.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from raftlog.broker.acl_guards import (
    CLUSTER_DENIED,
    GROUP_DENIED,
    NO_AUTHORIZED_OPERATIONS,
    TOPIC_DENIED,
    TXN_ID_DENIED,
    Check,
    Guard,
    Op,
    Split,
    Verdict,
    alter_configs,
    appending,
    create_partitions,
    create_topics,
    delete_records,
    delete_topics,
    describe_configs,
    describe_producers,
    fetch,
    list_offsets,
    metadata,
    offset_for_leader_epoch,
    produce,
    split_topics,
)
from raftlog.config.authorizer import AuthorizerSettings
from raftlog.metadata.image import MetadataImage
from raftlog.protocol.codec import Struct
from raftlog.protocol.errors import ErrorCode
from raftlog.security.acl import AclResourceType, Binding
from raftlog.security.authorizer import Authorizer, ClusterAuthorizer, StandardAuthorizer
from raftlog.server.listener import Body

_TOPIC: Final = AclResourceType.TOPIC
_GROUP: Final = AclResourceType.GROUP
_CLUSTER: Final = AclResourceType.CLUSTER
_TXN_ID: Final = AclResourceType.TRANSACTIONAL_ID
_NOT_ATTEMPTED: Final = int(ErrorCode.OPERATION_NOT_ATTEMPTED)
# FindCoordinator key types.
_GROUP_KEY: Final = 0
_TXN_KEY: Final = 1

log = logging.getLogger(__name__)


def build_authorizer(settings: AuthorizerSettings, image: Callable[[], MetadataImage]
                     ) -> Authorizer:
    """Kafka's StandardAuthorizer over the image's ACLs when configured, else no ACLs."""
    if not settings.enabled:
        log.info("authorizer: none (every principal may do everything but ClusterAction)")
        return ClusterAuthorizer()
    log.info("authorizer: StandardAuthorizer, super.users=%s, allow.everyone.if.no.acl.found=%s",
             ";".join(settings.super_users) or "(none)",
             str(settings.allow_everyone_if_no_acl_found).lower())

    def acls() -> tuple[int, Mapping[str, Binding]]:
        current = image()
        return current.acl_version, current.acls

    return StandardAuthorizer(acls, settings.super_users,
                              settings.allow_everyone_if_no_acl_found)


def guards() -> dict[int, Guard]:
    """The guards of the APIs that have one (``GUARDS`` without the open ones)."""
    return {key: guard for key, guard in GUARDS.items() if guard is not None}


# -- consumer groups -----------------------------------------------------------------------


def _group_error(check: Check, body: Body) -> Verdict:
    """The whole request refused unless Read on its group."""
    if check.allows(Op.READ, _GROUP, check.ctx.body.group_id):
        return None
    return {"throttle_time_ms": 0, "error_code": GROUP_DENIED, **body}


def join_group(check: Check) -> Verdict:
    return _group_error(check, {"generation_id": -1, "protocol_name": "", "leader": "",
                                "member_id": "", "members": []})


def sync_group(check: Check) -> Verdict:
    return _group_error(check, {"assignment": b""})


def heartbeat(check: Check) -> Verdict:
    return _group_error(check, {})


def leave_group(check: Check) -> Verdict:
    return _group_error(check, {"members": []})


def _all_partitions(topics: Sequence[Struct], code: int) -> list[Body]:
    return [{"name": t.name, "partitions": [
        {"partition_index": p.partition_index, "error_code": code} for p in t.partitions]}
        for t in topics]


def offset_commit(check: Check) -> Verdict:
    body = check.ctx.body
    if not check.allows(Op.READ, _GROUP, body.group_id):
        return {"throttle_time_ms": 0, "topics": _all_partitions(body.topics, GROUP_DENIED)}
    return split_topics(check, Op.READ, "topics", "name", "topics",
                        lambda t, code: _all_partitions([t], code)[0])


def offset_fetch(check: Check) -> Verdict:
    body = check.ctx.body
    version = check.ctx.header.api_version
    if not check.allows(Op.READ, _GROUP, body.group_id):
        if version >= 2:
            return {"throttle_time_ms": 0, "topics": [], "error_code": GROUP_DENIED}
        return {"topics": [_fetched(t, GROUP_DENIED) for t in body.topics or ()]}
    if body.topics is None:  # every committed topic: those it may not describe are left out
        def hide(answer: Body) -> Body:
            answer["topics"] = [t for t in answer.get("topics", ())
                                if check.may(Op.DESCRIBE, _TOPIC, t["name"])]
            return answer

        return Split({}, hide)
    return split_topics(check, Op.DESCRIBE, "topics", "name", "topics", _fetched)


def _fetched(topic: Struct, code: int) -> Body:
    return {"name": topic.name, "partitions": [
        {"partition_index": index, "committed_offset": -1, "committed_leader_epoch": -1,
         "metadata": "", "error_code": code} for index in topic.partition_indexes]}


def describe_groups(check: Check) -> Verdict:
    groups: Sequence[str] = check.ctx.body.groups
    denied = check.denied_names(groups, Op.DESCRIBE, _GROUP)
    if not denied:
        return None
    return Split({"groups": tuple(g for g in groups if g not in denied)},
                 appending("groups", [
                     {"error_code": GROUP_DENIED, "group_id": g, "group_state": "",
                      "protocol_type": "", "protocol_data": "", "members": [],
                      "authorized_operations": NO_AUTHORIZED_OPERATIONS}
                     for g in groups if g in denied]))


def list_groups(check: Check) -> Verdict:
    if check.may(Op.DESCRIBE, _CLUSTER):
        return None

    def visible(answer: Body) -> Body:
        answer["groups"] = [g for g in answer.get("groups", ())
                            if check.may(Op.DESCRIBE, _GROUP, g["group_id"])]
        return answer

    return Split({}, visible)


def delete_groups(check: Check) -> Verdict:
    groups: Sequence[str] = check.ctx.body.groups_names
    denied = check.denied_names(groups, Op.DELETE, _GROUP)
    if not denied:
        return None
    return Split({"groups_names": tuple(g for g in groups if g not in denied)},
                 appending("results", [{"group_id": g, "error_code": GROUP_DENIED}
                                       for g in groups if g in denied]))


def find_coordinator(check: Check) -> Verdict:
    body = check.ctx.body
    key_type = body.key_type if check.ctx.header.api_version >= 1 else _GROUP_KEY
    if key_type == _TXN_KEY:
        allowed, code = check.allows(Op.DESCRIBE, _TXN_ID, body.key), TXN_ID_DENIED
    else:
        allowed, code = check.allows(Op.DESCRIBE, _GROUP, body.key), GROUP_DENIED
    if allowed:
        return None
    return {"throttle_time_ms": 0, "error_code": code, "error_message": "Authorization failed.",
            "node_id": -1, "host": "", "port": -1}


# -- transactions and producer ids ---------------------------------------------------------


def init_producer_id(check: Check) -> Verdict:
    txn_id = check.ctx.body.transactional_id
    denied: Body = {"throttle_time_ms": 0, "producer_id": -1, "producer_epoch": -1}
    if txn_id is not None:
        if check.allows(Op.WRITE, _TXN_ID, txn_id):
            return None
        return {**denied, "error_code": TXN_ID_DENIED}
    session = check.ctx.session
    if check.may(Op.IDEMPOTENT_WRITE, _CLUSTER) or check.authorizer.authorize_any(
            session, Op.WRITE, _TOPIC):
        return None
    check.refused(Op.IDEMPOTENT_WRITE, _CLUSTER)
    return {**denied, "error_code": CLUSTER_DENIED}


def _txn_id_allowed(check: Check) -> bool:
    return check.allows(Op.WRITE, _TXN_ID, check.ctx.body.transactional_id)


def end_txn(check: Check) -> Verdict:
    if _txn_id_allowed(check):
        return None
    return {"throttle_time_ms": 0, "error_code": TXN_ID_DENIED}


def add_offsets_to_txn(check: Check) -> Verdict:
    if not _txn_id_allowed(check):
        return {"throttle_time_ms": 0, "error_code": TXN_ID_DENIED}
    if not check.allows(Op.READ, _GROUP, check.ctx.body.group_id):
        return {"throttle_time_ms": 0, "error_code": GROUP_DENIED}
    return None


def add_partitions_to_txn(check: Check) -> Verdict:
    if check.ctx.header.api_version >= 4:
        return None  # brokers' verify_only requests: ClusterAction, checked by TxnApis
    body = check.ctx.body
    topics: Sequence[Struct] = body.v3_and_below_topics
    if not check.allows(Op.WRITE, _TXN_ID, body.v3_and_below_transactional_id):
        return _add_partitions_answer(topics, lambda name: TXN_ID_DENIED)
    denied = check.denied_names((t.name for t in topics), Op.WRITE)
    if not denied:
        return None
    # Kafka adds nothing when a topic is refused: the others are "not attempted".
    return _add_partitions_answer(
        topics, lambda name: TOPIC_DENIED if name in denied else _NOT_ATTEMPTED)


def _add_partitions_answer(topics: Sequence[Struct], code_of: Callable[[str], int]) -> Body:
    return {"throttle_time_ms": 0, "error_code": 0, "results_by_transaction": [],
            "results_by_topic_v3_and_below": [
                {"name": t.name, "results_by_partition": [
                    {"partition_index": p, "partition_error_code": code_of(t.name)}
                    for p in t.partitions]} for t in topics]}


def txn_offset_commit(check: Check) -> Verdict:
    body = check.ctx.body
    if not _txn_id_allowed(check):
        return {"throttle_time_ms": 0, "topics": _all_partitions(body.topics, TXN_ID_DENIED)}
    if not check.allows(Op.READ, _GROUP, body.group_id):
        return {"throttle_time_ms": 0, "topics": _all_partitions(body.topics, GROUP_DENIED)}
    return split_topics(check, Op.READ, "topics", "name", "topics",
                        lambda t, code: _all_partitions([t], code)[0])


def describe_transactions(check: Check) -> Verdict:
    ids: Sequence[str] = check.ctx.body.transactional_ids
    denied = check.denied_names(ids, Op.DESCRIBE, _TXN_ID)
    if not denied:
        return None
    return Split({"transactional_ids": tuple(i for i in ids if i not in denied)},
                 appending("transaction_states", [
                     {"error_code": TXN_ID_DENIED, "transactional_id": i,
                      "transaction_state": "", "transaction_timeout_ms": 0,
                      "transaction_start_time_ms": -1, "producer_id": -1,
                      "producer_epoch": -1, "topics": []} for i in ids if i in denied]))


def list_transactions(check: Check) -> Verdict:
    def visible(answer: Body) -> Body:
        answer["transaction_states"] = [
            s for s in answer.get("transaction_states", ())
            if check.may(Op.DESCRIBE, _TXN_ID, s["transactional_id"])]
        return answer

    return Split({}, visible)


# -- cluster-wide administration -----------------------------------------------------------


def _cluster(operation: Op, denied: Body) -> Guard:
    def guard(check: Check) -> Verdict:
        return None if check.allows(operation, _CLUSTER) else denied

    return guard


def _cluster_per_item(operation: Op, field: str, entry: Body,
                      items: tuple[str, ...]) -> Guard:
    """Every item of the request (in the fields ``items``) refused alike."""
    def guard(check: Check) -> Verdict:
        if check.allows(operation, _CLUSTER):
            return None
        count = sum(len(check.ctx.body[name] or ()) for name in items)
        return {"throttle_time_ms": 0, field: [dict(entry) for _ in range(count)]}

    return guard


def alter_user_scram_credentials(check: Check) -> Verdict:
    if check.allows(Op.ALTER, _CLUSTER):
        return None
    body = check.ctx.body
    users = dict.fromkeys([d.name for d in body.deletions] + [u.name for u in body.upsertions])
    return {"throttle_time_ms": 0, "results": [
        {"user": u, "error_code": CLUSTER_DENIED, "error_message": "Authorization failed."}
        for u in users]}


def alter_client_quotas(check: Check) -> Verdict:
    if check.allows(Op.ALTER_CONFIGS, _CLUSTER):
        return None
    return {"throttle_time_ms": 0, "entries": [
        {"error_code": CLUSTER_DENIED, "error_message": "Authorization failed.",
         "entity": [e.to_dict() for e in entry.entity]} for entry in check.ctx.body.entries]}


_DENIED = {"error_code": CLUSTER_DENIED, "error_message": "Authorization failed."}
# Every API a node serves, by key: its guard, or None where the API is open to every
# principal (the SASL exchange, ApiVersions) or checked elsewhere (the node-to-node RPCs go
# through ClusterActionGate, which asks the same authorizer for ClusterAction).
GUARDS: Final[dict[int, Guard | None]] = {
    0: produce, 1: fetch, 2: list_offsets, 3: metadata, 8: offset_commit, 9: offset_fetch,
    10: find_coordinator, 11: join_group, 12: heartbeat, 13: leave_group, 14: sync_group,
    15: describe_groups, 16: list_groups, 19: create_topics, 20: delete_topics,
    21: delete_records, 22: init_producer_id, 23: offset_for_leader_epoch,
    24: add_partitions_to_txn, 25: add_offsets_to_txn, 26: end_txn, 28: txn_offset_commit,
    29: _cluster(Op.DESCRIBE, {"throttle_time_ms": 0, **_DENIED, "resources": []}),
    30: _cluster_per_item(Op.ALTER, "results", _DENIED, ("creations",)),
    31: _cluster_per_item(Op.ALTER, "filter_results", {**_DENIED, "matching_acls": []},
                          ("filters",)),
    32: describe_configs, 33: alter_configs, 37: create_partitions, 42: delete_groups,
    44: alter_configs,
    48: _cluster(Op.DESCRIBE_CONFIGS, {"throttle_time_ms": 0, **_DENIED, "entries": None}),
    49: alter_client_quotas,
    50: _cluster(Op.DESCRIBE, {"throttle_time_ms": 0, **_DENIED, "results": []}),
    51: alter_user_scram_credentials,
    55: _cluster(Op.DESCRIBE, {"error_code": CLUSTER_DENIED, "topics": []}),
    61: describe_producers, 65: describe_transactions, 66: list_transactions,
    # Open to everyone, or ClusterAction through ClusterActionGate.
    17: None, 18: None, 36: None, 27: None, 56: None, 58: None, 62: None, 63: None, 67: None,
}
