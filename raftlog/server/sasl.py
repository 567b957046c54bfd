"""SaslHandshake and SaslAuthenticate handlers, and the ClusterAction gate.

The handlers step the connection's ``Session`` (``raftlog.security.session``). The gate wraps
the handler of every API that only nodes send nodes (KRaft's broker-to-controller RPCs,
Envelope, WriteTxnMarkers) so that a request from a principal without ClusterAction on the
cluster gets CLUSTER_AUTHORIZATION_FAILED (the error Kafka's ControllerApis and KafkaApis
return) and a log line naming the peer, and never reaches the handler. Requests that are
cluster actions only for some field values (Fetch and OffsetForLeaderEpoch with a replica
id, AddPartitionsToTxn verify_only) call ``require_cluster_action`` themselves.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import Any, Final

import trio

from raftlog.config.sasl import SaslSettings
from raftlog.metadata.image import MetadataImage
from raftlog.metrics.recorders import CounterMap
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import (
    ALLOCATE_PRODUCER_IDS,
    ALTER_PARTITION,
    BROKER_HEARTBEAT,
    BROKER_REGISTRATION,
    ENVELOPE,
)
from raftlog.protocol.schemas_security import SASL_AUTHENTICATE, SASL_HANDSHAKE
from raftlog.protocol.schemas_txn import WRITE_TXN_MARKERS
from raftlog.security.authorizer import Authorizer, ClusterAuthorizer
from raftlog.security.sasl_server import SaslAuthenticator
from raftlog.security.scram import ScramCredential
from raftlog.security.session import (
    BROKER_EPOCH_EXTENSION,
    CLUSTER_MECHANISM,
    ClusterCredentials,
    KafkaPrincipal,
    Operation,
    ResourceType,
    SaslState,
    Session,
    broker_user,
)
from raftlog.server.authz import Refusals
from raftlog.server.listener import Handler, HandlerResult, RequestContext

log = logging.getLogger(__name__)
Body = dict[str, Any]
_CLUSTER_DENIED: Final = int(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)


class SaslApis:
    """Serves the SASL exchange: with ``authenticator`` (the listener's mechanisms, users and
    cluster credentials, ``raftlog.security.sasl_server``) when given, else with the cluster's
    own credentials alone (None: nobody can authenticate)."""

    def __init__(self, credentials: ClusterCredentials | None,
                 authenticator: Callable[[Session], SaslAuthenticator] | None = None) -> None:
        self._credentials = credentials
        self._authenticator = authenticator
        # (listener, "successful" | "failed") -> completed exchanges, for the metrics.
        self.authentications = CounterMap()

    def handlers(self) -> dict[int, Handler]:
        table: dict[int, Callable[[RequestContext], HandlerResult]] = {
            SASL_HANDSHAKE.key: self.handshake, SASL_AUTHENTICATE.key: self.authenticate}
        return dict(table)

    def handshake(self, ctx: RequestContext) -> HandlerResult:
        server = (self._authenticator(ctx.session) if self._authenticator is not None
                  else self._credentials)
        if isinstance(server, SaslAuthenticator):
            mechanisms = server.mechanisms
        else:
            mechanisms = [CLUSTER_MECHANISM] if server is not None else []
        if ctx.header.api_version == 0:
            # v0 is followed by raw SASL tokens outside Kafka framing: not served (every
            # client raftlog supports sends v1 when the broker advertises it).
            ctx.session.sasl_state = SaslState.FAILED
            log.warning("SaslHandshake v0 from %s refused: raw SASL tokens are not served;"
                        " use SaslHandshake v1", ctx.peer)
            return {"error_code": int(ErrorCode.ILLEGAL_SASL_STATE), "mechanisms": mechanisms}
        error = ctx.session.handshake(ctx.body.mechanism, server)
        if error:
            self.authentications.inc((ctx.session.listener, "failed"))
            log.warning("SaslHandshake from %s refused (%s, mechanism %r; enabled %s)",
                        ctx.peer, ErrorCode(error).name, ctx.body.mechanism, mechanisms)
        return {"error_code": error, "mechanisms": mechanisms}

    def authenticate(self, ctx: RequestContext) -> HandlerResult:
        error, auth_bytes, message = ctx.session.authenticate(bytes(ctx.body.auth_bytes))
        if error:
            self.authentications.inc((ctx.session.listener, "failed"))
        elif ctx.session.authenticated:
            self.authentications.inc((ctx.session.listener, "successful"))
        lifetime = 0
        if not error and ctx.session.authenticated and self._authenticator is not None:
            lifetime = self._authenticator(ctx.session).reauth_ms
        if lifetime > 0:
            # KIP-368: the session ends after the lifetime unless the client re-authenticates.
            ctx.session.clock = trio.current_time
            ctx.session.expires_at = trio.current_time() + lifetime / 1000
        return {"error_code": error, "error_message": message, "auth_bytes": auth_bytes,
                "session_lifetime_ms": lifetime}


def build_authenticators(sasl: SaslSettings, credentials: ClusterCredentials | None,
                         image: Callable[[], MetadataImage]
                         ) -> Callable[[Session], SaslAuthenticator]:
    """One authenticator per listener (PLAIN users may be set per listener), SCRAM users
    read from the node's current image at each exchange."""

    def users(mechanism: str, user: str) -> ScramCredential | None:
        found = image().scram_users.get(user, {}).get(mechanism)
        if found is None:
            return None
        return ScramCredential(found.mechanism, found.salt, found.iterations,
                               found.stored_key, found.server_key)

    decoy = credentials.decoy_key if credentials is not None else secrets.token_bytes(32)
    by_listener: dict[str, SaslAuthenticator] = {}

    def authenticator(session: Session) -> SaslAuthenticator:
        listener = session.listener.upper()
        found = by_listener.get(listener)
        if found is None:
            found = by_listener[listener] = SaslAuthenticator(
                sasl.mechanisms_of(listener), credentials, users, sasl.plain_users_of(listener),
                sasl.reauth_ms, decoy)
        return found

    return authenticator


class ClusterActionGate:
    """Answers "does this principal hold ClusterAction on the cluster?" on the request path
    (one instance per node), with the node's authorizer: without ACLs only cluster members do;
    with Kafka's StandardAuthorizer also super users and principals an ACL allows."""

    def __init__(self, authorizer: Authorizer | None = None,
                 refusals: Refusals | None = None) -> None:
        self.authorizer: Authorizer = authorizer or ClusterAuthorizer()
        self.refusals = refusals or Refusals()

    @property
    def denied_requests(self) -> int:
        return self.refusals.count

    def allows(self, ctx: RequestContext) -> bool:
        """Whether ``ctx``'s principal holds ClusterAction; logs and counts a refusal."""
        if self.authorizer.authorize(ctx.session, Operation.CLUSTER_ACTION,
                                     ResourceType.CLUSTER):
            return True
        self.refusals.refused(ctx, "ClusterAction on the cluster (cluster members authenticate"
                                   " with raft.secret)")
        return False

    def wrap(self, handlers: dict[int, Handler]) -> dict[int, Handler]:
        """``handlers`` with every node-to-node API behind the gate."""
        wrapped = dict(handlers)
        for key, denied in _DENIED_BODIES.items():
            inner = handlers.get(key)
            if inner is not None:
                wrapped[key] = self._guard(inner, denied)
        return wrapped

    def _guard(self, inner: Handler, denied: Callable[[RequestContext], Body]) -> Handler:
        def guarded(request: RequestContext) -> HandlerResult:
            if not self.allows(request):
                return denied(request)
            return inner(request)

        return guarded


def _markers_denied(ctx: RequestContext) -> Body:
    return {"markers": [
        {"producer_id": marker.producer_id, "topics": [
            {"name": topic.name, "partitions": [
                {"partition_index": index, "error_code": _CLUSTER_DENIED}
                for index in topic.partition_indexes]}
            for topic in marker.topics]}
        for marker in ctx.body.markers]}


_DENIED_BODIES: Final[dict[int, Callable[[RequestContext], Body]]] = {
    BROKER_REGISTRATION.key: lambda ctx: {
        "throttle_time_ms": 0, "error_code": _CLUSTER_DENIED, "broker_epoch": -1},
    BROKER_HEARTBEAT.key: lambda ctx: {
        "throttle_time_ms": 0, "error_code": _CLUSTER_DENIED, "is_caught_up": False,
        "is_fenced": True, "should_shut_down": False},
    ALTER_PARTITION.key: lambda ctx: {
        "throttle_time_ms": 0, "error_code": _CLUSTER_DENIED, "topics": []},
    ALLOCATE_PRODUCER_IDS.key: lambda ctx: {
        "throttle_time_ms": 0, "error_code": _CLUSTER_DENIED, "producer_id_start": -1,
        "producer_id_len": 0},
    ENVELOPE.key: lambda ctx: {"response_data": None, "error_code": _CLUSTER_DENIED},
    WRITE_TXN_MARKERS.key: _markers_denied,
}


def local_session(node_id: int) -> Session:
    """The session of a request a node makes of itself (no network, no exchange)."""
    return Session("in-process", KafkaPrincipal("User", broker_user(node_id)),
                   broker_id=node_id, sasl_state=SaslState.AUTHENTICATED)


def broker_epoch_extension(image: MetadataImage, node_id: int, incarnation_id: str
                           ) -> dict[str, str]:
    """The SCRAM extension a broker's connections claim (KIP-903's replica epoch): the epoch
    of this incarnation's registration once ``image`` holds it, else -1."""
    me = image.brokers.get(node_id)
    epoch = me.epoch if me is not None and me.incarnation_id == incarnation_id else -1
    return {BROKER_EPOCH_EXTENSION: str(epoch)}
