"""Helpers for tests and simulations that drive the metadata state machine directly.

Nothing here is used by the broker itself; like ``trio.testing`` it ships so other packages' tests
can build metadata without a quorum.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from raftlog.metadata.records import (
    BecomeController,
    Command,
    CreateTopic,
    Record,
    RegisterBroker,
    UnfenceBroker,
)
from raftlog.metadata.state import ApplyResult, MetadataStateMachine


def make_topic_id(seed: int) -> bytes:
    """A deterministic, non-zero 16-byte topic id."""
    assert 0 <= seed < 2**120
    return (seed + 1).to_bytes(16, "big")


class MachineDriver:
    """Applies records to a state machine at consecutive offsets under a chosen term.

    Request ids are ``"req-<n>"`` so runs are reproducible.
    """

    def __init__(self, machine: MetadataStateMachine | None = None) -> None:
        self.machine = MetadataStateMachine() if machine is None else machine
        self.term = self.machine.image.controller_term
        self._request_count = 0

    def command(
        self,
        record: Record,
        *,
        term: int | None = None,
        expected_version: int | None = None,
        request_id: str | None = None,
    ) -> Command:
        """Wrap ``record`` in an envelope (BecomeController carries its own term)."""
        if request_id is None:
            self._request_count += 1
            request_id = f"req-{self._request_count}"
        if term is None:
            term = record.term if isinstance(record, BecomeController) else self.term
        return Command(record, term, request_id, expected_version)

    def apply(
        self,
        record: Record,
        *,
        term: int | None = None,
        expected_version: int | None = None,
        request_id: str | None = None,
    ) -> ApplyResult:
        """Apply ``record`` at the next offset; a successful BecomeController sets ``term``."""
        command = self.command(
            record, term=term, expected_version=expected_version, request_id=request_id
        )
        return self.apply_command(command)

    def apply_command(self, command: Command) -> ApplyResult:
        """Apply a prepared command at the next offset."""
        result = self.machine.apply(command, self.machine.image.version + 1)
        if result.ok and isinstance(command.record, BecomeController):
            self.term = command.record.term
        return result

    def bootstrap(self, broker_ids: Iterable[int] = (1,), *, term: int = 1) -> None:
        """Become controller for ``term`` and register and unfence ``broker_ids``."""
        self._require_ok(self.apply(BecomeController(term, min(broker_ids, default=1))))
        for node_id in broker_ids:
            register = RegisterBroker(node_id, "127.0.0.1", 9092 + node_id, None, f"inc-{node_id}")
            self._require_ok(self.apply(register))
            self._require_ok(self.apply(UnfenceBroker(node_id)))

    def create_topic(
        self,
        name: str,
        partitions: Sequence[Sequence[int]] = ((1,),),
        configs: Sequence[tuple[str, str]] = (),
        *,
        seed: int | None = None,
    ) -> ApplyResult:
        """Create ``name`` with the given replica lists and a deterministic topic id."""
        topic_id = make_topic_id(self._request_count if seed is None else seed)
        record = CreateTopic(
            name, topic_id, tuple(tuple(replicas) for replicas in partitions), tuple(configs)
        )
        return self.apply(record)

    @staticmethod
    def _require_ok(result: ApplyResult) -> None:
        assert result.ok, result
