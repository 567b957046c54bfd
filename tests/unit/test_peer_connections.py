"""``PeerConnections``: one connection per peer, made on first use, replaced after a failure."""

from __future__ import annotations

import pytest
import trio

from raftlog.client.connection import KafkaClientError
from raftlog.client.peers import PeerConnections
from raftlog.protocol.schemas import API_VERSIONS, METADATA
from raftlog.server.listener import HandlerResult, RequestContext, serve_listener
from tests.unit.test_server import LIMITS, with_api_versions


async def test_a_peer_is_asked_on_one_connection_and_a_failure_replaces_it() -> None:
    peers_seen: list[str] = []
    stall = trio.Event()

    def metadata(request: RequestContext) -> HandlerResult:
        peers_seen.append(request.peer)

        async def never() -> None:
            await stall.wait()  # the caller's timeout fires first

        return never  # type: ignore[return-value]

    async with trio.open_nursery() as nursery:
        port: int = await nursery.start(serve_listener, "127.0.0.1", 0,
                                        with_api_versions({METADATA.key: metadata}), LIMITS)
        addresses = {1: ("127.0.0.1", port)}
        pool = PeerConnections(addresses.get, client_id="test", timeout_s=5.0)
        first = await pool.request(1, API_VERSIONS, {}, version=0)
        second = await pool.request(1, API_VERSIONS, {}, version=0)
        assert first.error_code == second.error_code == 0
        with pytest.raises(KafkaClientError):
            await pool.request(1, METADATA, {"topics": []}, version=1, timeout_s=0.2)
        with pytest.raises(KafkaClientError, match="not registered"):
            await pool.request(2, API_VERSIONS, {}, version=0)
        # The timed-out connection was dropped: the next request comes from a new one.
        with pytest.raises(KafkaClientError):
            await pool.request(1, METADATA, {"topics": []}, version=1, timeout_s=0.2)
        assert len(peers_seen) == 2 and peers_seen[0] != peers_seen[1], peers_seen
        await pool.aclose()
        stall.set()
        nursery.cancel_scope.cancel()
