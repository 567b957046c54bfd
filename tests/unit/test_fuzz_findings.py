"""Handler defects found by protocol fuzzing (``tests/integration/test_fuzz.py``), each pinned
down here deterministically, without the race the fuzzer needed to hit it.

The encoding defects (a request value echoed into a response field that cannot hold it) are
pinned in ``tests/unit/test_codec_responses.py``.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

import raftlog.broker.topic_admin as topic_admin_module
from raftlog.broker.apis import PARTITIONS_PER_REQUEST_MAX, KafkaApis
from raftlog.config import ServerConfig
from raftlog.metadata.image import MetadataImage, PartitionImage, TopicImage, frozen_mapping
from raftlog.metadata.placement import assign_replicas
from raftlog.partition.manager import PartitionManager
from raftlog.protocol import codec
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import CREATE_PARTITIONS
from raftlog.quorum.interface import Quorum
from raftlog.server.listener import RequestContext


def _request(api: codec.Api, version: int, body: dict[str, Any]) -> RequestContext:
    raw = codec.encode_bytes(api, version, body, is_request=True)
    header = codec.RequestHeader(api.key, version, 1, "fuzz-finding")
    return RequestContext(api, header, codec.decode(api, version, raw), "127.0.0.1:1")


async def test_create_partitions_checks_the_count_on_the_image_it_plans_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CreatePartitions refused a huge count only for topics in the image the request arrived
    with. Fuzzing asked for 2**31-1 partitions of a topic that was being re-created: the up-front
    check did not see it, the deferred part did, and placement built two billion replica lists
    on the event loop (the node froze and grew to 14 GB)."""
    placed: list[int] = []

    def placement_spy(num_partitions: int, *args: Any, **kwargs: Any) -> Any:
        placed.append(num_partitions)
        assert num_partitions <= PARTITIONS_PER_REQUEST_MAX, "placement of a huge count"
        return assign_replicas(num_partitions, *args, **kwargs)

    monkeypatch.setattr(topic_admin_module, "assign_replicas", placement_spy)
    config = ServerConfig.from_properties({"node.id": "1", "log.dirs": str(tmp_path)})
    manager = PartitionManager(tmp_path, node_id=1)
    quorum = SimpleNamespace(image=MetadataImage())  # the topic does not exist yet
    apis = KafkaApis(config, cast(Quorum, quorum), manager)
    try:
        deferred = apis.create_partitions(_request(CREATE_PARTITIONS, 1, {
            "topics": [{"name": "grow", "count": 2**31 - 1, "assignments": None}],
            "timeout_ms": 1000, "validate_only": False}))
        assert callable(deferred)
        # The topic appears (auto-created, or re-created) before the deferred part runs.
        partition = PartitionImage(0, (1,), (1,), 1, 0, 0)
        quorum.image = MetadataImage(topics=frozen_mapping({
            "grow": TopicImage("grow", b"\x01" * 16, (partition,), frozen_mapping(), 3)}))
        body = await deferred()
    finally:
        manager.close()
    assert body is not None
    assert [r["error_code"] for r in body["results"]] == [ErrorCode.POLICY_VIOLATION]
    assert placed == []
