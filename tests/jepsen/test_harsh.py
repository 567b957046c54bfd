"""The pure parts of the harder harness: kill-two / kill-burst / wipe-disk planning, the
saturating load's operations and the linear stream checker (no cluster, well under 1 s)."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from jepsen import faults_harsh, stream_check
from jepsen.db import NodeProcess
from jepsen.history import HistoryBuilder
from jepsen.nemesis import Fault, parse_kinds, plan
from jepsen.workloads.saturate import check_saturated, next_send


def test_parse_kinds_knows_the_harsh_kinds_and_all_is_unchanged() -> None:
    assert parse_kinds("all", True) == ("kill", "pause", "partition", "clock")
    assert parse_kinds("harsh", True) == ("kill", "kill-two", "kill-burst")
    assert parse_kinds("kill-two,wipe-disk", True) == ("kill-two", "wipe-disk")
    assert parse_kinds("harsh,kill,wipe-disk", True) == (
        "kill", "kill-two", "kill-burst", "wipe-disk")
    with pytest.raises(ValueError, match="harsh"):
        parse_kinds("kill-three", True)


def test_plan_gives_harsh_faults_their_targets() -> None:
    steps = plan(("kill-two", "kill-burst", "wipe-disk"), random.Random(3), 120.0, 3.0)
    faults = {f for s in steps for f in s.faults}
    kinds = {f.kind for f in faults}
    assert kinds == {"kill-two", "kill-burst", "wipe-disk"}
    for f in faults:
        if f.kind == "kill-two":
            assert f.target == "two"
        elif f.kind == "kill-burst":
            assert f.target == "burst"
        else:
            assert f.target in faults_harsh.WIPE_TARGETS and f.offset_s in (0.0, 1.0)
    assert {f.offset_s for f in faults if f.kind == "wipe-disk"} == {0.0, 1.0}
    assert Fault("wipe-disk", "one", 1.0).describe() == {"kind": "wipe-disk", "target": "one",
                                                         "offset_s": 1.0}


def test_pick_two_is_two_distinct_nodes() -> None:
    for seed in range(50):
        two = faults_harsh.pick_two([1, 2, 3], random.Random(seed))
        assert len(set(two)) == 2 and set(two) <= {1, 2, 3}
    assert faults_harsh.pick_two([4], random.Random(0)) == [4]


def test_burst_plan_never_kills_the_same_node_twice_in_a_row() -> None:
    lengths = set()
    for seed in range(100):
        steps = faults_harsh.burst_plan([1, 2, 3], random.Random(seed))
        lengths.add(len(steps))
        lo, hi = faults_harsh.BURST_DOWN_S
        assert all(lo <= down <= hi for _, down in steps)
        assert all(a != b for (a, _), (b, _) in itertools.pairwise(steps))
    assert lengths == set(range(faults_harsh.BURST_KILLS[0], faults_harsh.BURST_KILLS[1] + 1))
    assert faults_harsh.burst_plan([1, 2, 3], random.Random(9)) == \
        faults_harsh.burst_plan([1, 2, 3], random.Random(9))


def test_wipe_deletes_the_data_directory_and_says_what_was_there(tmp_path: Path) -> None:
    node = NodeProcess(1, tmp_path, "127.0.0.1", 9092, [])
    meta = tmp_path / "data" / "__cluster_metadata-0"
    meta.mkdir(parents=True)
    (meta / "raft.journal").write_bytes(b"x" * 10)
    (tmp_path / "data" / "jepsen-0").mkdir()
    (tmp_path / "data" / "jepsen-0" / "00000.log").write_bytes(b"y" * 5)
    (tmp_path / "server.properties").write_text("node.id=1\n")
    out = faults_harsh.wipe(node)
    assert out.pop("at") > 0
    assert out == {"wiped": str(tmp_path / "data"), "files": 2, "bytes": 15}
    assert not (tmp_path / "data").exists()
    assert (tmp_path / "server.properties").exists()  # same node.id on restart


def test_next_send_is_a_batch_of_fresh_values() -> None:
    counter = itertools.count()
    f, value = next_send(random.Random(1), ["k-0", "k-1"], lambda: next(counter), count=7)
    assert f == "send" and [m[2] for m in value] == list(range(7))
    assert {m[1] for m in value} <= {"k-0", "k-1"}


def _stream(sends: list[tuple[int, str, list[tuple[int, int]]]],
            reads: dict[str, list[tuple[int, int]]]) -> HistoryBuilder:
    """sends: (process, key, [(value, acked offset)]); then one final poll of ``reads``."""
    h = HistoryBuilder()
    for process, key, pairs in sends:
        h.invoke(process, "send", [["send", key, v] for v, _ in pairs])
        h.ok(process, "send", [["send", key, [o, v]] for v, o in pairs])
    h.invoke(99, "poll", [["poll"]])
    h.ok(99, "poll", [["poll", {k: [[o, v] for o, v in ps] for k, ps in reads.items()}]])
    return h


def test_stream_check_accepts_a_clean_history() -> None:
    h = _stream([(0, "k", [(1, 0), (2, 1)]), (1, "k", [(3, 2)])],
                {"k": [(0, 1), (1, 2), (2, 3)]})
    out = stream_check.analyze(h.ops)
    assert out["valid"] is True and out["anomaly_counts"] == {}
    assert out["stats"] == {"acknowledged": 3, "unseen": 0}


def test_stream_check_finds_a_duplicated_block() -> None:
    # The shape: a block stored twice, each copy the block's length apart.
    h = _stream([(0, "k", [(10, 0), (11, 1), (12, 2)])],
                {"k": [(0, 10), (1, 11), (2, 12), (3, 10), (4, 11), (5, 12)]})
    out = stream_check.analyze(h.ops)
    assert out["valid"] is False
    assert out["anomaly_counts"] == {"duplicate": 3}
    assert out["anomalies"]["duplicate"][0] == {"key": "k", "value": 10, "offsets": [0, 3],
                                                "distance": 3}
    assert out["per_key"] == {"k": {"duplicate": 3}}


def test_stream_check_finds_a_reordering_within_one_producer() -> None:
    h = HistoryBuilder()
    h.invoke(0, "send", [["send", "k", 1], ["send", "k", 2]])
    h.info(0, "send", [["send", "k", 1], ["send", "k", 2]], error="timeout")
    h.invoke(1, "send", [["send", "k", 3]])
    h.invoke(99, "poll", [["poll"]])
    h.ok(99, "poll", [["poll", {"k": [[0, 3], [1, 2], [2, 1]]}]])
    out = stream_check.analyze(h.ops)
    assert out["valid"] is False
    assert out["anomaly_counts"] == {"reorder": 1}
    assert out["anomalies"]["reorder"][0]["earlier"] == 1
    assert out["anomalies"]["reorder"][0]["later"] == 2
    # Two producers interleaving is not a reordering.
    h2 = _stream([(0, "k", [(1, 1)]), (1, "k", [(2, 0)])], {"k": [(0, 2), (1, 1)]})
    assert stream_check.analyze(h2.ops)["valid"] is True


def test_stream_check_lost_unseen_inconsistent_and_mismatched_offsets() -> None:
    lost = _stream([(0, "k", [(1, 0), (2, 1)])], {"k": [(1, 2)]})
    assert stream_check.analyze(lost.ops)["anomaly_counts"] == {"lost-write": 1}
    unseen = _stream([(0, "k", [(1, 0), (2, 1)])], {"k": [(0, 1)]})
    out = stream_check.analyze(unseen.ops)
    assert out["valid"] == "unknown" and out["stats"]["unseen"] == 1
    h = _stream([(0, "k", [(1, 0)])], {"k": [(0, 1), (0, 2)]})
    h.invoke(1, "send", [["send", "k", 2]])
    assert stream_check.analyze(h.ops)["anomaly_counts"] == {"inconsistent-offsets": 1}
    moved = _stream([(0, "k", [(1, 0)])], {"k": [(4, 1)]})
    assert stream_check.analyze(moved.ops)["anomaly_counts"] == {"offset-mismatch": 1}


def test_check_saturated_runs_the_full_checker_only_on_small_histories() -> None:
    h = _stream([(0, "k", [(1, 0), (2, 1)])], {"k": [(0, 1), (1, 2)]})
    small = check_saturated(h.history())
    assert small["valid"] is True and small["full_check"]["valid"] is True
    big = check_saturated(h.history(), full_max_values=1)
    assert big["full_check"].startswith("skipped: 2 values")


def test_wipe_report_reads_the_restart_after_the_wipe(tmp_path: Path) -> None:
    h = HistoryBuilder()
    h.invoke("nemesis", "start-wipe-disk", {"kind": "wipe-disk", "target": "one"})
    h.info("nemesis", "start-wipe-disk",
           {"kind": "wipe-disk", "nodes": [2], "wiped": [{"node": 2, "at": 100.5}]})
    assert faults_harsh.wiped_starts(h.ops) == [(2, 100.5)]
    log = "\n".join([
        "--- jepsen: start #1 at 50.000", "INFO partition jepsen-0: leader at epoch 1",
        "--- jepsen: start #2 at 101.000", "INFO nothing to see",
        "INFO partition jepsen-0: leader at epoch 3, ISR [2], offsets [0, 0), HW 0",
        "WARNING something", "--- jepsen: start #3 at 200.000", "WARNING later"])
    (tmp_path / "n2.log").write_text(log)
    report = faults_harsh.wipe_report(tmp_path, h.ops)
    assert report == [{"node": 2, "at": 100.5, "restart_log": [
        "--- jepsen: start #2 at 101.000",
        "INFO partition jepsen-0: leader at epoch 3, ISR [2], offsets [0, 0), HW 0",
        "WARNING something"]}]
    assert faults_harsh.restart_lines(log, 300.0) == []


def test_stream_check_trusts_the_final_reads_over_earlier_polls() -> None:
    # A poll saw 1 and 2 at offsets 0 and 1; then the log was rewritten (a wiped leader):
    # the final reads (after the nemesis's heal) find 3 at offset 0 and nothing else.
    h = HistoryBuilder()
    h.invoke(0, "send", [["send", "k", 1], ["send", "k", 2]])
    h.ok(0, "send", [["send", "k", [0, 1]], ["send", "k", [1, 2]]])
    h.invoke(1, "poll", [["poll"]])
    h.ok(1, "poll", [["poll", {"k": [[0, 1], [1, 2]]}]])
    h.invoke(0, "send", [["send", "k", 3]])
    h.ok(0, "send", [["send", "k", [0, 3]]])
    h.invoke("nemesis", "heal", None)
    h.info("nemesis", "heal", None)
    h.invoke(2, "poll", [["poll"]])
    h.ok(2, "poll", [["poll", {"k": [[0, 3]]}]])
    out = stream_check.analyze(h.ops)
    assert out["valid"] is False
    assert out["anomaly_counts"] == {"inconsistent-offsets": 1, "lost-write": 1}
    assert out["anomalies"]["lost-write"][0] == {
        "key": "k", "value": 1, "acked_offset": 0, "final_read_max": 0, "read_earlier_at": [0]}
    assert out["stats"]["unseen"] == 1  # 2, acknowledged at 1, beyond the rewritten log


def test_stream_check_lists_acknowledged_batches_without_offset_the_final_reads_miss() -> None:
    h = HistoryBuilder()
    h.invoke(0, "send", [["send", "k", 1], ["send", "k", 2]])
    h.ok(0, "send", [["send", "k", [0, 1]], ["send", "k", [None, 2]]])
    h.invoke("nemesis", "heal", None)
    h.info("nemesis", "heal", None)
    h.invoke(2, "poll", [["poll"]])
    h.ok(2, "poll", [["poll", {"k": [[0, 1]]}]])
    out = stream_check.analyze(h.ops)
    assert out["valid"] == "unknown" and out["bad_anomaly_types"] == []
    assert out["anomalies"]["unseen-acked-without-offset"] == [
        {"key": "k", "value": 2, "final_read_max": 0}]


def test_saturate_keeps_txn_and_metadata_operations_and_only_drops_the_pacing(
        tmp_path: Path) -> None:
    from jepsen.runner import TestOptions, make_workload
    from jepsen.workloads.metadata import MetadataWorkload
    from jepsen.workloads.saturate import SaturateWorkload
    from jepsen.workloads.txn import TxnWorkload

    def workload(name: str, load: str) -> object:
        return make_workload(TestOptions(store=tmp_path, workload=name, load=load))

    assert isinstance(workload("queue", "saturate"), SaturateWorkload)
    assert isinstance(workload("txn", "saturate"), TxnWorkload)
    assert isinstance(workload("metadata", "saturate"), MetadataWorkload)
    with pytest.raises(ValueError, match="unknown load"):
        workload("txn", "flood")
