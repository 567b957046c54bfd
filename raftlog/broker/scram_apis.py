"""DescribeUserScramCredentials (50) and AlterUserScramCredentials (51), KIP-554.

Describe is answered by any node from its metadata image (as Kafka's brokers answer it from
their metadata cache): mechanism and iterations per user, never a salt or a key. Alter is
decided by the controller (``raftlog.broker.controller_apis`` routes and forwards it): the
client sends a salt and the salted password, the controller derives the stored and server
keys (RFC 5802) and commits one ``AlterUserScram`` record per user. The password itself never
reaches the server.

Errors, as Kafka's ``ScramControlManager`` answers them, one result per user: a user named
twice for one mechanism DUPLICATE_RESOURCE; an unknown mechanism UNSUPPORTED_SASL_MECHANISM;
an empty name, fewer than 4096 or more than 16384 iterations, an empty salt or a salted
password of the wrong size UNACCEPTABLE_CREDENTIAL; deleting a credential that does not
exist RESOURCE_NOT_FOUND. A user's changes are committed together or not at all. One request
changes at most ``USERS_PER_REQUEST_MAX`` users; the rest get POLICY_VIOLATION.

Without an authorizer every principal may call both (Kafka without ``authorizer.class.name``
allows everything too); the ACL work puts ALTER/DESCRIBE on the cluster in front of them.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Final

from raftlog.controller.service import ControllerService, ControllerUnavailableError
from raftlog.metadata import errors
from raftlog.metadata.image import MetadataImage, ScramCredentialImage
from raftlog.metadata.records import AlterUserScram
from raftlog.metadata.scram_apply import SCRAM_KEY_BYTES, credential_problem, user_problem
from raftlog.protocol.codec import Struct
from raftlog.protocol.errors import ErrorCode
from raftlog.quorum.interface import Quorum
from raftlog.server.listener import Body, HandlerResult, RequestContext

log = logging.getLogger(__name__)

# Kafka's ScramMechanism types on the wire.
MECHANISM_BY_TYPE: Final = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
TYPE_BY_MECHANISM: Final = {name: code for code, name in MECHANISM_BY_TYPE.items()}
_HASH_BY_MECHANISM: Final = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
DUPLICATE_RESOURCE: Final = int(ErrorCode.DUPLICATE_RESOURCE)
# Users one AlterUserScramCredentials may change: each is a metadata commit, so one request of
# socket.request.max.bytes must not turn into thousands of them. Users past the cap are
# refused with POLICY_VIOLATION (the request is not applied for them) and may be sent again.
USERS_PER_REQUEST_MAX: Final = 100


def derive_credential(mechanism: str, salt: bytes, salted_password: bytes,
                      iterations: int) -> ScramCredentialImage:
    """The stored and server keys of RFC 5802 from a salted password."""
    name = _HASH_BY_MECHANISM[mechanism]
    client_key = hmac.new(salted_password, b"Client Key", name).digest()
    return ScramCredentialImage(
        mechanism, salt, hashlib.new(name, client_key).digest(),
        hmac.new(salted_password, b"Server Key", name).digest(), iterations)


def describe_body(image: MetadataImage, users: Sequence[str] | None) -> Body:
    """The DescribeUserScramCredentials answer from ``image`` (None or empty: every user)."""
    if not users:
        names = sorted(image.scram_users)
        return {"throttle_time_ms": 0, "error_code": 0, "error_message": None,
                "results": [_described(image, name) for name in names]}
    copies = Counter(users)
    results = []
    for name in dict.fromkeys(users):
        if copies[name] > 1:
            results.append({"user": name, "error_code": DUPLICATE_RESOURCE, "credential_infos": [],
                            "error_message": "Cannot describe SCRAM credentials for the same"
                                             " user twice in a single request"})
        elif name not in image.scram_users:
            results.append({"user": name, "error_code": errors.RESOURCE_NOT_FOUND,
                            "credential_infos": [], "error_message":
                                "Attempt to describe a user credential that does not exist"})
        else:
            results.append(_described(image, name))
    return {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "results": results}


def _described(image: MetadataImage, name: str) -> Body:
    credentials = image.scram_users[name]
    infos = [{"mechanism": TYPE_BY_MECHANISM[mechanism], "iterations": c.iterations}
             for mechanism, c in sorted(credentials.items())]
    return {"user": name, "error_code": 0, "error_message": None, "credential_infos": infos}


def plan_alterations(image: MetadataImage, request: Struct
                     ) -> tuple[dict[str, tuple[int, str | None]], list[AlterUserScram]]:
    """(refused users with their error, one record per accepted user), in request order."""
    ops: dict[str, list[tuple[int, Struct | None]]] = defaultdict(list)
    for deletion in request.deletions:
        ops[deletion.name].append((deletion.mechanism, None))
    for upsertion in request.upsertions:
        ops[upsertion.name].append((upsertion.mechanism, upsertion))
    refused: dict[str, tuple[int, str | None]] = {}
    records = []
    for index, (user, changes) in enumerate(ops.items()):
        if index >= USERS_PER_REQUEST_MAX:
            refused[user] = (int(ErrorCode.POLICY_VIOLATION),
                             f"At most {USERS_PER_REQUEST_MAX} users per request")
            continue
        try:
            records.append(_user_record(image, user, changes))
        except _Refused as exc:
            refused[user] = (exc.code, exc.message)
    return refused, records


class _Refused(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _user_record(image: MetadataImage, user: str,
                 changes: list[tuple[int, Struct | None]]) -> AlterUserScram:
    mechanisms = [mechanism for mechanism, _ in changes]
    if len(set(mechanisms)) != len(mechanisms):
        raise _Refused(DUPLICATE_RESOURCE,
                       "A user credential cannot be altered twice in the same request")
    problem = user_problem(user)
    if problem is not None:
        raise _Refused(errors.UNACCEPTABLE_CREDENTIAL, problem)
    existing = image.scram_users.get(user, {})
    upserts, deletions = [], []
    for code, upsertion in changes:
        mechanism = MECHANISM_BY_TYPE.get(code)
        if mechanism is None:
            raise _Refused(errors.UNSUPPORTED_SASL_MECHANISM, f"Unknown SCRAM mechanism {code}")
        if upsertion is None:
            if mechanism not in existing:
                raise _Refused(errors.RESOURCE_NOT_FOUND,
                               "Attempt to delete a user credential that does not exist")
            deletions.append(mechanism)
            continue
        if len(upsertion.salted_password) != SCRAM_KEY_BYTES[mechanism]:
            raise _Refused(errors.UNACCEPTABLE_CREDENTIAL,
                           f"A {mechanism} salted password has {SCRAM_KEY_BYTES[mechanism]}"
                           " bytes")
        credential = derive_credential(mechanism, bytes(upsertion.salt),
                                       bytes(upsertion.salted_password), upsertion.iterations)
        found = credential_problem(credential)
        if found is not None:
            raise _Refused(*found)
        upserts.append(credential)
    return AlterUserScram(user, tuple(upserts), tuple(deletions))


def refused_body(request: Struct, code: int, message: str | None) -> Body:
    """Every user of ``request`` answered with ``code``."""
    users = dict.fromkeys([d.name for d in request.deletions]
                          + [u.name for u in request.upsertions])
    return {"throttle_time_ms": 0, "results": [
        {"user": user, "error_code": code, "error_message": message} for user in users]}


class ScramCredentialApis:
    """The two handlers; ``alter`` runs on the controller only (the routing checks that)."""

    def __init__(self, quorum: Quorum, controller: ControllerService) -> None:
        self.quorum = quorum
        self.controller = controller

    def describe(self, ctx: RequestContext) -> HandlerResult:
        users = None if ctx.body.users is None else [u.name for u in ctx.body.users]
        return describe_body(self.quorum.image, users)

    def alter(self, ctx: RequestContext) -> HandlerResult:
        request = ctx.body
        refused, records = plan_alterations(self.quorum.image, request)

        async def commit_all() -> Body:
            outcome = dict(refused)
            for record in records:
                try:
                    outcome[record.user] = await self.controller.commit(record)
                except ControllerUnavailableError as exc:
                    outcome[record.user] = (exc.error_code, str(exc))
                code, message = outcome[record.user]
                if code == errors.NONE:
                    log.info("SCRAM credentials of %r: set %s, deleted %s (from %s)",
                             record.user, [c.mechanism for c in record.upserts],
                             list(record.deletions), ctx.session.principal)
                else:
                    log.info("SCRAM credentials of %r refused: %s", record.user, message)
            body = refused_body(request, 0, None)
            for result in body["results"]:
                result["error_code"], result["error_message"] = outcome[result["user"]]
            return body

        return commit_all
