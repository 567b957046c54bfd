"""How a node routes the controller's admin requests: answered here when this node is the
controller, forwarded to it (or refused with NOT_CONTROLLER) everywhere else.

The RPCs brokers send the controller (BrokerRegistration, BrokerHeartbeat, AlterPartition,
AllocateProducerIds) and DescribeQuorum are served by :mod:`raftlog.controller.rpcs`.

* CreateTopics (19), DeleteTopics (20), CreatePartitions (37) stay implemented in
  :mod:`raftlog.broker.apis`; here they are wrapped so that a node that is not the controller
  answers NOT_CONTROLLER per topic (clients re-route using Metadata's ``controller_id``), and
  so that the controller places new topics with its own view of usable brokers.
* AlterConfigs (33), IncrementalAlterConfigs (44): decided and committed by the controller
  (:func:`~raftlog.controller.core.plan_config_change`, one AlterConfigs record per
  resource). Clients send them to any broker, so a node that is not the controller forwards
  the request to it wrapped in an Envelope (KIP-590, :mod:`raftlog.protocol.envelope`) and relays
  the inner answer.
* Envelope (58): on the controller, the inner request goes to the same handler as a client's,
  marked as forwarded: a forwarded request is never forwarded again (a node that lost the
  controllership answers NOT_CONTROLLER, and the forwarding node's channel tries the next
  candidate). Anywhere else the envelope itself is answered NOT_CONTROLLER. Only an Envelope
  counts as forwarded; a client's client.id means nothing.
* DescribeUserScramCredentials (50) is answered from this node's image; AlterUserScramCredentials
  (51) is decided by the controller and forwarded like AlterConfigs
  (:mod:`raftlog.broker.scram_apis`).
* DescribeClientQuotas (48) is answered from this node's image; AlterClientQuotas (49) is
  decided by the controller and forwarded like AlterConfigs (:mod:`raftlog.broker.quota_apis`).
* Metadata (3): on a node that is not the controller, topic auto-creation is forwarded to the
  controller as a CreateTopics request in an Envelope (as Kafka brokers forward it), then
  answered locally.

Handlers follow ``raftlog.server.listener``'s contract: never raise for bad input, return a body or
a coroutine function that produces one, and bound every wait.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol

import trio

from raftlog.broker.acl_apis import AclApis, create_refused, delete_refused
from raftlog.broker.apis import PARTITIONS_PER_REQUEST_MAX
from raftlog.broker.quota_apis import ClientQuotaApis
from raftlog.broker.quota_apis import refused_body as quota_refused_body
from raftlog.broker.scram_apis import ScramCredentialApis, refused_body
from raftlog.config import ServerConfig
from raftlog.controller.core import CONFIG_OP_SET, ConfigAlteration, ConfigOp
from raftlog.controller.service import ControllerService, ControllerUnavailableError
from raftlog.metadata import errors
from raftlog.protocol import codec, envelope
from raftlog.protocol.codec import Api, Struct
from raftlog.protocol.envelope import EnvelopeError
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import (
    ALTER_CONFIGS,
    CREATE_PARTITIONS,
    CREATE_TOPICS,
    DELETE_TOPICS,
    ENVELOPE,
    INCREMENTAL_ALTER_CONFIGS,
    METADATA,
)
from raftlog.protocol.schemas_quota import ALTER_CLIENT_QUOTAS, DESCRIBE_CLIENT_QUOTAS
from raftlog.protocol.schemas_security import (
    ALTER_USER_SCRAM_CREDENTIALS,
    CREATE_ACLS,
    DELETE_ACLS,
    DESCRIBE_ACLS,
    DESCRIBE_USER_SCRAM_CREDENTIALS,
)
from raftlog.quorum.interface import Quorum, QuorumTimeoutError
from raftlog.server.listener import Body, Deferred, Handler, HandlerResult, RequestContext

log = logging.getLogger(__name__)

FORWARD_TIMEOUT_S: Final = 10.0
METADATA_PROPAGATION_TIMEOUT_S: Final = 3.0
CREATE_TOPICS_FORWARD_VERSION: Final = 4
NOT_CONTROLLER_MESSAGE: Final = "This node is not the controller; send the request to it."


class AdminHandlers(Protocol):
    """The broker's own handlers this routing wraps (``raftlog.broker.apis.KafkaApis``)."""

    def create_topics(self, ctx: RequestContext) -> HandlerResult: ...

    def delete_topics(self, ctx: RequestContext) -> HandlerResult: ...

    def create_partitions(self, ctx: RequestContext) -> HandlerResult: ...

    def metadata(self, ctx: RequestContext) -> HandlerResult: ...


class ControllerApis:
    """The admin routing wrappers. See the module docstring.

    Args:
        apis: The broker's handlers that answer the requests once routed here.
        forward: Sends a request to the current controller (``ControllerChannel.call``), used
            to forward AlterConfigs, IncrementalAlterConfigs and Metadata's auto-creation in
            an Envelope; None disables forwarding.
    """

    def __init__(
        self,
        config: ServerConfig,
        quorum: Quorum,
        controller: ControllerService,
        apis: AdminHandlers,
        forward: Callable[..., Any] | None = None,
    ) -> None:
        self.config = config
        self.quorum = quorum
        self.controller = controller
        self.apis = apis
        self.forward = forward
        self.scram = ScramCredentialApis(quorum, controller)
        self.acls = AclApis(quorum, controller)
        self.quotas = ClientQuotaApis(quorum, controller)

    def handlers(self) -> dict[int, Handler]:
        table: dict[int, Callable[[RequestContext], HandlerResult]] = {
            CREATE_TOPICS.key: self.create_topics,
            DELETE_TOPICS.key: self.delete_topics,
            CREATE_PARTITIONS.key: self.create_partitions,
            METADATA.key: self.metadata,
            ALTER_CONFIGS.key: self.alter_configs,
            INCREMENTAL_ALTER_CONFIGS.key: self.incremental_alter_configs,
            ENVELOPE.key: self.envelope,
            DESCRIBE_USER_SCRAM_CREDENTIALS.key: self.scram.describe,
            ALTER_USER_SCRAM_CREDENTIALS.key: self.alter_user_scram_credentials,
            DESCRIBE_ACLS.key: self.acls.describe,
            CREATE_ACLS.key: self.create_acls,
            DELETE_ACLS.key: self.delete_acls,
            DESCRIBE_CLIENT_QUOTAS.key: self.quotas.describe,
            ALTER_CLIENT_QUOTAS.key: self.alter_client_quotas,
        }
        return dict(table)

    def _forwarded_handlers(self) -> dict[int, Callable[[RequestContext], HandlerResult]]:
        """The handlers for requests found in an Envelope: never forwarded again."""
        return {
            CREATE_TOPICS.key: self.create_topics,
            DELETE_TOPICS.key: self.delete_topics,
            CREATE_PARTITIONS.key: self.create_partitions,
            ALTER_CONFIGS.key: lambda ctx: self._alter_configs(
                ctx, incremental=False, forwarded=True),
            INCREMENTAL_ALTER_CONFIGS.key: lambda ctx: self._alter_configs(
                ctx, incremental=True, forwarded=True),
            ALTER_USER_SCRAM_CREDENTIALS.key: lambda ctx: self.alter_user_scram_credentials(
                ctx, forwarded=True),
            CREATE_ACLS.key: lambda ctx: self.create_acls(ctx, forwarded=True),
            DELETE_ACLS.key: lambda ctx: self.delete_acls(ctx, forwarded=True),
            ALTER_CLIENT_QUOTAS.key: lambda ctx: self.alter_client_quotas(ctx, forwarded=True),
        }

    # -- Envelope (KIP-590) --------------------------------------------------------------------

    def envelope(self, ctx: RequestContext) -> HandlerResult:
        if not self.quorum.controller_ready:
            return envelope.refusal(errors.NOT_CONTROLLER)
        try:
            inner = envelope.open_request(
                ctx.body, request_bytes_max=self.config.socket_request_max_bytes)
        except EnvelopeError as exc:
            log.info("refusing an Envelope from %s: %s", ctx.peer, exc)
            return envelope.refusal(exc.error_code)
        handler = self._forwarded_handlers().get(inner.api.key)
        if handler is None:  # FORWARDABLE_API_KEYS names an API this table lacks
            return envelope.refusal(errors.INVALID_REQUEST)
        result = handler(RequestContext(inner.api, inner.header, inner.body, inner.client_host))

        async def answer() -> Body:
            body = result
            if body is not None and not isinstance(body, dict):
                body = await body()
            if body is None:
                return envelope.refusal(ErrorCode.UNKNOWN_SERVER_ERROR)
            return envelope.seal_response(inner, body)

        return answer

    async def _forward_enveloped(
        self, ctx: RequestContext, api: Api, version: int, body: Mapping[str, Any],
        is_not_controller: Callable[[Struct], bool],
    ) -> Struct:
        """Send ``body`` (as the client of ``ctx`` asked) to the controller in an Envelope.

        Raises:
            EnvelopeError: refused by the controller or not forwardable.
            ControllerUnreachableError: no controller answered in time.
        """
        assert self.forward is not None
        correlation_id = ctx.header.correlation_id
        wrapped = envelope.wrap_request(
            api, version, body, correlation_id=correlation_id,
            client_id=ctx.header.client_id, client_host=envelope.client_address(ctx.peer),
            request_bytes_max=self.config.socket_request_max_bytes)

        def not_controller(response: Struct) -> bool:
            if response.error_code == errors.NOT_CONTROLLER:
                return True
            try:  # the controller may have lost its role after opening the envelope
                inner = envelope.unwrap_response(api, version, correlation_id, response)
            except EnvelopeError:
                return False
            return is_not_controller(inner)

        response = await self.forward(
            ENVELOPE, wrapped, version=envelope.ENVELOPE_VERSION, timeout_s=FORWARD_TIMEOUT_S,
            is_not_controller=not_controller)
        return envelope.unwrap_response(api, version, correlation_id, response)

    # -- Admin routing -------------------------------------------------------------------------

    def create_topics(self, ctx: RequestContext) -> HandlerResult:
        if not self.quorum.controller_ready:
            names = [t.name for t in ctx.body.topics]
            return {"throttle_time_ms": 0, "topics": _not_controller_results(names)}
        return self.apis.create_topics(self._with_placement(ctx))

    def delete_topics(self, ctx: RequestContext) -> HandlerResult:
        if not self.quorum.controller_ready:
            responses = [{"name": name, "error_code": errors.NOT_CONTROLLER}
                         for name in ctx.body.topic_names]
            return {"throttle_time_ms": 0, "responses": responses}
        return self.apis.delete_topics(ctx)

    def create_partitions(self, ctx: RequestContext) -> HandlerResult:
        if not self.quorum.controller_ready:
            names = [t.name for t in ctx.body.topics]
            return {"throttle_time_ms": 0, "results": _not_controller_results(names)}
        return self.apis.create_partitions(ctx)

    def _with_placement(self, ctx: RequestContext) -> RequestContext:
        """Fill in replica assignments chosen by the controller for topics that have none.

        Only when the controller can place the topic; anything else goes to ``apis`` as it
        came, so its validation and error messages stay the only ones.
        """
        body = ctx.body.to_dict()
        changed = False
        for topic in body["topics"]:
            if topic["assignments"]:
                continue
            count = topic["num_partitions"]
            count = self.config.num_partitions if count == -1 else count
            factor = topic["replication_factor"]
            factor = self.config.default_replication_factor if factor == -1 else factor
            if not (0 < count <= PARTITIONS_PER_REQUEST_MAX and factor > 0):
                continue
            placement = self.controller.place_replicas(topic["name"], count, factor)
            if placement is None:
                continue
            topic["assignments"] = [
                {"partition_index": index, "broker_ids": list(replicas)}
                for index, replicas in enumerate(placement)
            ]
            topic["num_partitions"] = -1
            topic["replication_factor"] = -1
            changed = True
        if not changed:
            return ctx
        return _replace_body(ctx, body)

    # -- AlterConfigs, IncrementalAlterConfigs --------------------------------------------------

    def alter_configs(self, ctx: RequestContext) -> HandlerResult:
        return self._alter_configs(ctx, incremental=False, forwarded=False)

    def incremental_alter_configs(self, ctx: RequestContext) -> HandlerResult:
        return self._alter_configs(ctx, incremental=True, forwarded=False)

    def _alter_configs(self, ctx: RequestContext, *, incremental: bool, forwarded: bool
                       ) -> HandlerResult:
        """``forwarded``: the request came in an Envelope, so it is never forwarded again."""
        request = ctx.body
        if not self.quorum.controller_ready:
            if self.forward is None or forwarded:
                return _config_responses(request.resources, errors.NOT_CONTROLLER,
                                         NOT_CONTROLLER_MESSAGE)
            return self._forward_alter_configs(ctx)
        alterations = [_config_alteration(r, incremental) for r in request.resources]
        copies = Counter((r.resource_type, r.resource_name) for r in request.resources)

        async def alter_all() -> Body:
            cluster = self.quorum.image.broker_configs.get("")
            defaults = self.config.topic_defaults(None if cluster is None else cluster.configs)
            responses = []
            for alteration in alterations:
                key = (alteration.resource_type, alteration.resource_name)
                message: str | None
                if copies[key] > 1:  # Kafka refuses every copy of a duplicate resource
                    code, message = errors.INVALID_REQUEST, "Duplicate resource in request."
                else:
                    code, message = await self._alter_one(alteration, defaults,
                                                          request.validate_only)
                responses.append({"error_code": code, "error_message": message,
                                  "resource_type": key[0], "resource_name": key[1]})
            return {"throttle_time_ms": 0, "responses": responses}

        return alter_all

    async def _alter_one(self, alteration: ConfigAlteration, defaults: Mapping[str, str],
                         validate_only: bool) -> tuple[int, str | None]:
        try:
            code, message = await self.controller.alter_configs(
                alteration, defaults, validate_only=validate_only)
        except ControllerUnavailableError as exc:
            return exc.error_code, str(exc)
        if code != errors.NONE:
            log.info("%s of %r refused: %s", "IncrementalAlterConfigs" if alteration.incremental
                     else "AlterConfigs", alteration.resource_name, message)
        return code, message

    def _forward_alter_configs(self, ctx: RequestContext) -> HandlerResult:
        resources = ctx.body.resources
        return self._forward_or_refuse(
            ctx, _any_config_not_controller,
            lambda code, message: _config_responses(resources, code, message))

    def _forward_or_refuse(self, ctx: RequestContext, not_controller: Callable[[Struct], bool],
                           refuse: Callable[[int, str], Body]) -> Deferred:
        """Forwards ``ctx`` to the controller in an Envelope; what cannot be forwarded is
        refused per item with ``refuse(code, message)`` (REQUEST_TIMED_OUT, retriable, when the
        controller cannot be reached)."""

        async def forward_to_controller() -> Body:
            try:
                response = await self._forward_enveloped(
                    ctx, ctx.api, ctx.header.api_version, ctx.body.to_dict(), not_controller)
            except EnvelopeError as exc:
                log.info("forwarding %s to the controller failed: %s", ctx.api.name, exc)
                return refuse(exc.error_code, str(exc))
            except Exception as exc:  # unreachable controller: retriable for the client
                log.info("forwarding %s to the controller failed: %s", ctx.api.name, exc)
                return refuse(errors.REQUEST_TIMED_OUT,
                              f"The controller could not be reached: {exc}")
            body: Body = response.to_dict()
            return body

        return forward_to_controller

    # -- AlterUserScramCredentials ---------------------------------------------------------

    def alter_user_scram_credentials(self, ctx: RequestContext, forwarded: bool = False
                                     ) -> HandlerResult:
        if self.quorum.controller_ready:
            return self.scram.alter(ctx)
        if self.forward is None or forwarded:
            return refused_body(ctx.body, errors.NOT_CONTROLLER, NOT_CONTROLLER_MESSAGE)

        request = ctx.body
        return self._forward_or_refuse(
            ctx, lambda inner: any(r.error_code == errors.NOT_CONTROLLER for r in inner.results),
            lambda code, message: refused_body(request, code, message))

    # -- CreateAcls, DeleteAcls (raftlog.broker.acl_apis) ---------------------------------------

    def create_acls(self, ctx: RequestContext, forwarded: bool = False) -> HandlerResult:
        if self.quorum.controller_ready:
            return self.acls.create(ctx)
        request = ctx.body
        if self.forward is None or forwarded:
            return create_refused(request, errors.NOT_CONTROLLER, NOT_CONTROLLER_MESSAGE)
        return self._forward_or_refuse(
            ctx, lambda inner: any(r.error_code == errors.NOT_CONTROLLER for r in inner.results),
            lambda code, message: create_refused(request, code, message))

    def delete_acls(self, ctx: RequestContext, forwarded: bool = False) -> HandlerResult:
        if self.quorum.controller_ready:
            return self.acls.delete(ctx)
        request = ctx.body
        if self.forward is None or forwarded:
            return delete_refused(request, errors.NOT_CONTROLLER, NOT_CONTROLLER_MESSAGE)
        return self._forward_or_refuse(
            ctx, lambda inner: any(r.error_code == errors.NOT_CONTROLLER
                                   for r in inner.filter_results),
            lambda code, message: delete_refused(request, code, message))

    # -- AlterClientQuotas -------------------------------------------------------------------

    def alter_client_quotas(self, ctx: RequestContext, forwarded: bool = False
                            ) -> HandlerResult:
        if self.quorum.controller_ready:
            return self.quotas.alter(ctx)
        if self.forward is None or forwarded:
            return quota_refused_body(ctx.body, errors.NOT_CONTROLLER, NOT_CONTROLLER_MESSAGE)
        request = ctx.body
        return self._forward_or_refuse(
            ctx, lambda inner: any(e.error_code == errors.NOT_CONTROLLER for e in inner.entries),
            lambda code, message: quota_refused_body(request, code, message))

    # -- Metadata: forward auto-creation to the controller ---------------------------------

    def metadata(self, ctx: RequestContext) -> HandlerResult:
        request = ctx.body
        version = ctx.header.api_version
        if self.quorum.controller_ready or self.forward is None or request.topics is None:
            return self.apis.metadata(ctx)
        allow = self.config.auto_create_topics_enable and (
            version < 4 or request.allow_auto_topic_creation
        )
        image = self.quorum.image
        # A null name (a lookup by topic id) names nothing to create.
        missing = [t.name for t in request.topics
                   if t.name is not None and t.name not in image.topics]
        if not (allow and missing):
            return self.apis.metadata(ctx)
        local = ctx
        if version >= 4:
            # The topics are created by the controller; never propose them from here.
            local = _replace_body(ctx, {**request.to_dict(), "allow_auto_topic_creation": False})

        async def forward_then_describe() -> Body:
            await self._forward_creation(ctx, missing)
            result = self.apis.metadata(local)
            if result is not None and not isinstance(result, dict):
                result = await result()
            assert result is not None
            return result

        return forward_then_describe

    async def _forward_creation(self, ctx: RequestContext, names: Sequence[str]) -> None:
        """CreateTopics for ``names`` in an Envelope carrying the Metadata client's id and
        correlation id (as Kafka's AutoTopicCreationManager does)."""
        body = {
            "topics": [{"name": name, "num_partitions": -1, "replication_factor": -1,
                        "assignments": [], "configs": []} for name in names],
            "timeout_ms": int(FORWARD_TIMEOUT_S * 1000),
            "validate_only": False,
        }
        try:
            response = await self._forward_enveloped(
                ctx, CREATE_TOPICS, CREATE_TOPICS_FORWARD_VERSION, body,
                _any_topic_not_controller)
        except Exception as exc:  # unreachable controller: the client retries Metadata
            log.info("forwarding auto-creation of %s to the controller failed: %s", names, exc)
            return
        created = {t.name for t in response.topics
                   if t.error_code in (errors.NONE, errors.TOPIC_ALREADY_EXISTS)}
        with trio.move_on_after(METADATA_PROPAGATION_TIMEOUT_S):
            while not created <= set(self.quorum.image.topics):
                with contextlib.suppress(QuorumTimeoutError):
                    await self.quorum.wait_changed(self.quorum.image.version, timeout_s=0.5)


# -- Bodies and helpers ------------------------------------------------------------------------


def _replace_body(ctx: RequestContext, body: dict[str, Any]) -> RequestContext:
    """A copy of ``ctx`` carrying ``body`` (re-encoded, so it is a proper decoded request)."""
    version = ctx.header.api_version
    raw = codec.encode_bytes(ctx.api, version, body, is_request=True)
    decoded = codec.decode(ctx.api, version, raw, is_request=True)
    return RequestContext(ctx.api, ctx.header, decoded, ctx.peer)


def _not_controller_results(names: Sequence[str]) -> list[Body]:
    return [{"name": name, "error_code": errors.NOT_CONTROLLER,
             "error_message": NOT_CONTROLLER_MESSAGE} for name in names]


def _config_alteration(resource: Struct, incremental: bool) -> ConfigAlteration:
    ops = tuple(
        ConfigOp(c.name, c.config_operation if incremental else CONFIG_OP_SET, c.value)
        for c in resource.configs
    )
    return ConfigAlteration(resource.resource_type, resource.resource_name, ops, incremental)


def _config_responses(resources: Sequence[Struct], code: int, message: str | None) -> Body:
    responses = [{"error_code": code, "error_message": message,
                  "resource_type": r.resource_type, "resource_name": r.resource_name}
                 for r in resources]
    return {"throttle_time_ms": 0, "responses": responses}


def _any_config_not_controller(response: Struct) -> bool:
    return any(r.error_code == errors.NOT_CONTROLLER for r in response.responses)


def _any_topic_not_controller(response: Struct) -> bool:
    return any(t.error_code == errors.NOT_CONTROLLER for t in response.topics)
