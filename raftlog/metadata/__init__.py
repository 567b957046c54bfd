"""Cluster metadata: records and the pure state machine that applies them.

``records`` (what can change) -> ``state`` (pure, deterministic apply, producing immutable
``image`` snapshots). The quorum that orders commands is ``raftlog.quorum``.
"""

from raftlog.metadata.image import BrokerImage as BrokerImage
from raftlog.metadata.image import ConfigResourceImage as ConfigResourceImage
from raftlog.metadata.image import MetadataImage as MetadataImage
from raftlog.metadata.image import PartitionImage as PartitionImage
from raftlog.metadata.image import TopicImage as TopicImage
from raftlog.metadata.image import image_from_bytes as image_from_bytes
from raftlog.metadata.image import image_to_bytes as image_to_bytes
from raftlog.metadata.placement import PlacementError as PlacementError
from raftlog.metadata.placement import assign_replicas as assign_replicas
from raftlog.metadata.records import Command as Command
from raftlog.metadata.records import Record as Record
from raftlog.metadata.state import ApplyResult as ApplyResult
from raftlog.metadata.state import MetadataStateMachine as MetadataStateMachine

__all__ = [
    "ApplyResult",
    "BrokerImage",
    "Command",
    "ConfigResourceImage",
    "MetadataImage",
    "MetadataStateMachine",
    "PartitionImage",
    "PlacementError",
    "Record",
    "TopicImage",
    "assign_replicas",
    "image_from_bytes",
    "image_to_bytes",
]
