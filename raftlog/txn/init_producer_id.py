"""The InitProducerId (22) handler.

Handler contract as in ``raftlog.server.listener``: a handler gets a ``RequestContext`` and
returns a body, or an async zero-arg function that returns it. Expected failures are error
codes in the body, never exceptions.

InitProducerId without a transactional id (idempotent producers), versions 0-4:

* ``producer_id``/``producer_epoch`` both -1 (always below v3): a new id from this broker's
  block, epoch 0 (Kafka ``TransactionCoordinator.handleInitProducerId``).
* v3+ with an existing ``(producer_id, producer_epoch)`` (KIP-360 epoch bump): the same id with
  ``epoch + 1``; once the epoch is exhausted (``>= Short.MAX_VALUE - 1``, Kafka's
  ``isEpochExhausted``) a new id with epoch 0. Kafka itself ignores these fields when there is
  no transactional id and always returns a new id; librdkafka, kafka-python and aiokafka
  accept either answer. The bump is not checked against anything: an idempotent producer id
  belongs to one client, and a partition fences the old epoch on the first new-epoch batch.
* exactly one of the two is -1, or either is below -1 → INVALID_REQUEST (42), as Kafka's
  ``KafkaApis.handleInitProducerIdRequest``.
* no id available within ``init_timeout_s`` → COORDINATOR_LOAD_IN_PROGRESS (14), as Kafka's
  ``RPCProducerIdManager``; all three clients retry it.

With a transactional id the request goes to the transaction coordinator
(``raftlog.txn.apis``) when the node gives one; without one the answer is
TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53): it is the one code that all three clients treat as
fatal for InitProducerId, so the application gets an immediate, named error. The "natural"
COORDINATOR_NOT_AVAILABLE (15) and NOT_COORDINATOR (16) are retriable everywhere
(librdkafka ``rd_kafka_idemp_request_pid_failed`` re-arms its timer, kafka-python
``InitProducerIdHandler`` re-looks-up the coordinator and re-enqueues, aiokafka
``InitPIDHandler`` marks the coordinator dead and backs off), so producers would spin forever.
An empty transactional id → INVALID_REQUEST (42), as Kafka.

AllocateProducerIds (67), which fills this broker's ``ProducerIdManager``, is the controller's:
``raftlog.controller.rpcs`` serves it, and a broker sends it with
``BrokerLifecycle.allocate_block``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from raftlog.partition.producer_state import NO_PRODUCER_EPOCH, NO_PRODUCER_ID
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import INIT_PRODUCER_ID
from raftlog.server.listener import Body, Handler, HandlerResult, RequestContext
from raftlog.txn.producer_ids import ProducerIdManager, ProducerIdsUnavailableError

__all__ = [
    "EPOCH_EXHAUSTED",
    "TRANSACTIONAL_ID_ERROR",
    "ProducerApis",
]

log = logging.getLogger(__name__)

# TransactionMetadata.isEpochExhausted: Short.MaxValue - 1 (the last epoch is kept for fencing).
EPOCH_EXHAUSTED: Final = 2**15 - 2
TRANSACTIONAL_ID_ERROR: Final = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


class ProducerApis:
    """InitProducerId, bound to this broker's ``ProducerIdManager``; with a transactional
    id, ``transactional_init`` answers (the transaction coordinator's
    ``TxnApis.init_producer_id``), and without one such requests are refused."""

    def __init__(self, manager: ProducerIdManager, *, init_timeout_s: float = 5.0,
                 transactional_init: Callable[[RequestContext], HandlerResult] | None = None,
                 ) -> None:
        self.manager = manager
        self.init_timeout_s = init_timeout_s
        self.transactional_init = transactional_init

    def handlers(self) -> dict[int, Handler]:
        """InitProducerId only: AllocateProducerIds is the controller's (``ControllerRpcs``)."""
        table: dict[int, Callable[[RequestContext], HandlerResult]] = {
            INIT_PRODUCER_ID.key: self.init_producer_id,
        }
        return dict(table)

    # -- InitProducerId ------------------------------------------------------------------------

    def init_producer_id(self, ctx: RequestContext) -> HandlerResult:
        request = ctx.body
        transactional_id = request.transactional_id
        if transactional_id is not None:
            if transactional_id == "":
                return _init_body(ErrorCode.INVALID_REQUEST)
            if self.transactional_init is not None:
                return self.transactional_init(ctx)
            log.info("InitProducerId from %s for transactional id %r: transactions are not "
                     "supported yet", ctx.peer, transactional_id)
            return _init_body(TRANSACTIONAL_ID_ERROR)
        # Below v3 the codec fills in the defaults (-1, -1).
        producer_id = request.producer_id
        epoch = request.producer_epoch
        if (producer_id == NO_PRODUCER_ID) != (epoch == NO_PRODUCER_EPOCH) or min(
            producer_id, epoch
        ) < -1:
            return _init_body(ErrorCode.INVALID_REQUEST)
        if producer_id >= 0 and epoch < EPOCH_EXHAUSTED:
            return _init_body(ErrorCode.NONE, producer_id, epoch + 1)

        async def allocate() -> Body:
            try:
                new_id = await self.manager.next_producer_id(self.init_timeout_s)
            except ProducerIdsUnavailableError as exc:
                log.warning("InitProducerId from %s: %s", ctx.peer, exc)
                return _init_body(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
            return _init_body(ErrorCode.NONE, new_id, 0)

        return allocate


def _init_body(error: int, producer_id: int = NO_PRODUCER_ID,
               producer_epoch: int = NO_PRODUCER_EPOCH) -> Body:
    return {"throttle_time_ms": 0, "error_code": int(error), "producer_id": producer_id,
            "producer_epoch": producer_epoch}

