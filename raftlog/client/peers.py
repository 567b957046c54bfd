"""One Kafka connection per peer node, made on first use and dropped when it fails.

The transaction coordinator (markers), the partition leader's KIP-890 verifier and the group
coordinator's end-offset refresher each talk to other nodes' Kafka listeners. They share this
one pool shape instead of each keeping its own dict of connections: ``request`` connects if
needed, and a request that fails or times out closes that peer's connection (its stream may be
mid-frame), so the next request starts on a fresh one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import trio

from raftlog.client.connection import ClusterLogin, KafkaClientError, KafkaConnection
from raftlog.metadata.image import MetadataImage
from raftlog.protocol.codec import Api, Struct

# node id → (host, port) of its Kafka listener, or None when the node is not registered.
AddressOf = Callable[[int], tuple[str, int] | None]


def registered_address(image_of: Callable[[], MetadataImage]) -> AddressOf:
    """Addresses as the latest metadata image registers them."""

    def address_of(node_id: int) -> tuple[str, int] | None:
        broker = image_of().brokers.get(node_id)
        return None if broker is None else (broker.host, broker.port)

    return address_of


class PeerConnections:
    """Connections from this node to its peers' Kafka listeners, keyed by node id."""

    def __init__(self, address_of: AddressOf, *, client_id: str, timeout_s: float,
                 login: ClusterLogin | None = None) -> None:
        self._address_of = address_of
        self._client_id = client_id
        self._timeout_s = timeout_s
        self._login = login
        self._connections: dict[int, KafkaConnection] = {}

    async def request(self, node_id: int, api: Api, body: Mapping[str, Any], *,
                      version: int | None = None, timeout_s: float | None = None) -> Struct:
        """Sends ``body`` to ``node_id`` and returns its answer. Raises ``KafkaClientError``
        (also for a timeout or a socket error) after dropping the peer's connection."""
        timeout_s = self._timeout_s if timeout_s is None else timeout_s
        try:
            with trio.fail_after(timeout_s):
                connection = await self._connection(node_id)
                return await connection.request(api, body, version=version,
                                                timeout_s=timeout_s)
        except (KafkaClientError, OSError, trio.TooSlowError) as exc:
            await self.drop(node_id)
            if isinstance(exc, KafkaClientError):
                raise
            raise KafkaClientError(f"{api.name} to node {node_id}: {exc!r}") from exc

    async def drop(self, node_id: int) -> None:
        connection = self._connections.pop(node_id, None)
        if connection is not None:
            with trio.CancelScope(shield=True):
                await connection.aclose()

    async def aclose(self) -> None:
        """Closes every connection (shielded: callers run it while being cancelled)."""
        connections = list(self._connections.values())
        self._connections.clear()
        with trio.CancelScope(shield=True):
            for connection in connections:
                await connection.aclose()

    async def _connection(self, node_id: int) -> KafkaConnection:
        connection = self._connections.get(node_id)
        if connection is None:
            address = self._address_of(node_id)
            if address is None:
                raise KafkaClientError(f"node {node_id} is not registered")
            connection = await KafkaConnection.connect(
                *address, client_id=self._client_id, timeout_s=self._timeout_s,
                login=self._login)
            self._connections[node_id] = connection
        return connection
