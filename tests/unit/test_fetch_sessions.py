"""Incremental fetch sessions (KIP-227): the leader's cache and the follower's session."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from raftlog.broker.fetch_sessions import FetchSession, FetchSessionCache
from raftlog.protocol.errors import ErrorCode
from raftlog.replication.fetch_session import FollowerSession, PartitionFetch

Key = tuple[str, int]


def fetch(offset: int, epoch: int = 0) -> PartitionFetch:
    return PartitionFetch(epoch, offset, 0, 1 << 20)


class Wire:
    """A request's partitions as the leader decodes them (attribute access)."""

    def __init__(self, index: int, f: PartitionFetch) -> None:
        self.partition = index
        self.current_leader_epoch = f.current_leader_epoch
        self.fetch_offset = f.fetch_offset
        self.log_start_offset = f.log_start_offset
        self.partition_max_bytes = f.partition_max_bytes


def send(cache: FetchSessionCache, follower: FollowerSession,
         wanted: dict[Key, PartitionFetch], replica_id: int = 2
         ) -> tuple[int, FetchSession | None]:
    request = follower.build(wanted)
    topics: dict[str, list[Wire]] = {}
    for (topic, index), f in request.partitions.items():
        topics.setdefault(topic, []).append(Wire(index, f))
    forgotten: dict[str, list[int]] = {}
    for topic, index in request.forgotten:
        forgotten.setdefault(topic, []).append(index)
    return cache.begin(replica_id=replica_id, session_id=request.session_id,
                       session_epoch=request.session_epoch, topics=list(topics.items()),
                       forgotten=list(forgotten.items()))


def held(session: FetchSession) -> dict[Key, PartitionFetch]:
    return {key: PartitionFetch(p.current_leader_epoch, p.fetch_offset, p.log_start_offset,
                                p.partition_max_bytes)
            for key, p in session.partitions.items()}


def result(index: int, hw: int, records: bytes = b"", error: int = 0) -> dict[str, Any]:
    return {"partition_index": index, "error_code": error, "high_watermark": hw,
            "last_stable_offset": hw, "log_start_offset": 0, "records": records}


def test_a_session_sends_only_what_changed() -> None:
    cache, follower = FetchSessionCache(), FollowerSession()
    wanted = {("t", i): fetch(10) for i in range(100)}
    error, session = send(cache, follower, wanted)
    assert error == 0 and session is not None and held(session) == wanted
    follower.answered(0, session.session_id)
    assert follower.epoch == 1
    # Idle: nothing to say.
    request = follower.build(wanted)
    assert (request.session_id, request.session_epoch) == (session.session_id, 1)
    assert not request.partitions and not request.forgotten
    follower.answered(0, session.session_id)
    # One partition moved on, one is no longer fetched.
    changed = dict(wanted)
    changed[("t", 3)] = fetch(11)
    del changed[("t", 7)]
    request = follower.build(changed)
    assert dict(request.partitions) == {("t", 3): fetch(11)}
    assert request.forgotten == (("t", 7),)
    # A failure (or a lost answer) makes the next request full, naming the old id.
    follower.failed()
    request = follower.build(changed)
    assert request.full and len(request.partitions) == 99
    assert request.session_id == session.session_id


def test_epochs_and_ids_are_checked() -> None:
    cache, follower = FetchSessionCache(), FollowerSession()
    wanted = {("t", 0): fetch(1)}
    _, session = send(cache, follower, wanted)
    assert session is not None
    follower.answered(0, session.session_id)

    def again(epoch: int) -> int:
        assert session is not None
        return cache.begin(replica_id=2, session_id=session.session_id, session_epoch=epoch,
                           topics=[], forgotten=[])[0]

    assert again(1) == ErrorCode.NONE
    # A replayed epoch (a lost answer) ends the session; the follower starts over.
    assert again(1) == ErrorCode.INVALID_FETCH_SESSION_EPOCH
    assert again(2) == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    # Another broker cannot use or close someone's session.
    _, mine = cache.begin(replica_id=2, session_id=0, session_epoch=0, topics=[], forgotten=[])
    assert mine is not None
    assert cache.begin(replica_id=3, session_id=mine.session_id, session_epoch=1, topics=[],
                       forgotten=[])[0] == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    cache.begin(replica_id=3, session_id=mine.session_id, session_epoch=-1, topics=[],
                forgotten=[])
    assert cache.begin(replica_id=2, session_id=mine.session_id, session_epoch=1, topics=[],
                       forgotten=[])[0] == ErrorCode.NONE
    # Its own final request closes it.
    assert cache.begin(replica_id=2, session_id=mine.session_id, session_epoch=-1, topics=[],
                       forgotten=[]) == (ErrorCode.NONE, None)
    assert cache.begin(replica_id=2, session_id=mine.session_id, session_epoch=2, topics=[],
                       forgotten=[])[0] == ErrorCode.FETCH_SESSION_ID_NOT_FOUND


def test_consumers_get_no_session_and_the_cache_is_bounded() -> None:
    cache = FetchSessionCache(max_sessions=2)
    assert cache.begin(replica_id=-1, session_id=0, session_epoch=0, topics=[],
                       forgotten=[]) == (ErrorCode.NONE, None)
    ids = []
    for _ in range(3):
        _, session = cache.begin(replica_id=2, session_id=0, session_epoch=0, topics=[],
                                 forgotten=[])
        assert session is not None
        ids.append(session.session_id)
    assert len(cache) == 2 and cache.evicted == 1
    assert cache.begin(replica_id=2, session_id=ids[0], session_epoch=1, topics=[],
                       forgotten=[])[0] == ErrorCode.FETCH_SESSION_ID_NOT_FOUND


def test_an_incremental_answer_carries_only_news_and_rotates_partitions_with_data() -> None:
    session = FetchSession(1, 2)
    session.update([("t", [Wire(i, fetch(0)) for i in range(3)])], [])
    full = session.answered([{"topic": "t", "partitions": [result(i, 5) for i in range(3)]}],
                            incremental=False)
    assert [p["partition_index"] for p in full[0]["partitions"]] == [0, 1, 2]
    # Same HW everywhere, records for 0, an error for 2: 1 is left out; 0 goes last.
    answer = session.answered([{"topic": "t", "partitions": [
        result(0, 5, b"x"), result(1, 5), result(2, 5, error=6)]}], incremental=True)
    assert [p["partition_index"] for p in answer[0]["partitions"]] == [0, 2]
    assert [key[1] for key in session.partitions] == [1, 2, 0]
    # A new HW is news; nothing at all leaves the topic out.
    answer = session.answered([{"topic": "t", "partitions": [result(1, 6)]}], incremental=True)
    assert [p["partition_index"] for p in answer[0]["partitions"]] == [1]
    assert session.answered([{"topic": "t", "partitions": [result(1, 6)]}],
                            incremental=True) == []
    assert [t for t, _ in session.plan()] == ["t"]


keys = st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 5))
wanted_maps = st.dictionaries(keys, st.builds(fetch, st.integers(0, 3), st.integers(0, 2)),
                              max_size=8)
steps = st.lists(st.tuples(wanted_maps, st.sampled_from(["ok", "lost", "leader-restart"])),
                 max_size=30)


@given(steps)
def test_after_every_answer_the_leader_holds_exactly_what_the_follower_wants(
        plan: list[tuple[dict[Key, PartitionFetch], str]]) -> None:
    cache, follower = FetchSessionCache(), FollowerSession()
    for wanted, fate in plan:
        if fate == "leader-restart":
            cache = FetchSessionCache(first_id=len(plan) + 7)
        error, session = send(cache, follower, wanted)
        if fate == "lost":
            follower.failed()
            continue
        follower.answered(error, 0 if session is None else session.session_id)
        if error == ErrorCode.NONE:
            assert session is not None
            assert held(session) == wanted
        else:
            assert follower.epoch == 0, "an error starts a new session"


def test_what_a_broker_can_make_the_cache_hold_is_bounded() -> None:
    cache = FetchSessionCache(partitions_max=3)
    # A full request naming more partitions than a session may hold is answered sessionless.
    many = [("t", [Wire(i, fetch(0)) for i in range(4)])]
    assert cache.begin(replica_id=2, session_id=0, session_epoch=0, topics=many,
                       forgotten=[]) == (ErrorCode.NONE, None)
    assert len(cache) == 0
    # An incremental one growing a session past it ends the session.
    _, session = cache.begin(replica_id=2, session_id=0, session_epoch=0,
                             topics=[("t", [Wire(0, fetch(0))])], forgotten=[])
    assert session is not None
    grown = [("t", [Wire(i, fetch(0)) for i in range(1, 4)])]
    assert cache.begin(replica_id=2, session_id=session.session_id, session_epoch=1,
                       topics=grown, forgotten=[])[0] == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    assert len(cache) == 0
    # One broker keeps at most two sessions; others' are untouched.
    _, theirs = cache.begin(replica_id=3, session_id=0, session_epoch=0, topics=[],
                            forgotten=[])
    for _ in range(5):
        cache.begin(replica_id=2, session_id=0, session_epoch=0, topics=[], forgotten=[])
    assert len(cache) == 3
    assert theirs is not None and cache.begin(
        replica_id=3, session_id=theirs.session_id, session_epoch=1, topics=[],
        forgotten=[])[0] == ErrorCode.NONE
