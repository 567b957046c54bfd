"""Issue 18's scale test: many RF 3 partitions on 3 nodes, a restart, and the time until every
partition is led again with a full ISR.

    python bench/scale.py [--topics 100] [--partitions-per-topic 10] [--kill] [--json out.json]

A fresh `raftlog cluster up --nodes 3 --port-base 0` gets `--topics` x `--partitions-per-topic`
partitions (default 100 x 10 = 1,000), RF 3, through AdminClient.create_topics, `--create-batch`
topics per request, one request at a time ("create s"); Metadata is then polled every 0.5 s
until every partition has a leader and an ISR of 3. `--records-per-partition` records
(acks=all) go to every partition, and each node's VmRSS/VmHWM is read from /proc. The cluster
is stopped (SIGTERM to `cluster up`, which stops its nodes one by one as Ctrl-C does; with
`--kill` every node is SIGKILLed first: the restart recovers the logs) and launched again on the
same dir. From the launch, Metadata is polled every 0.5 s (the ports are kept in cluster.json),
with a progress line every 5 s, up to `--restart-timeout`: "cluster up s" is the launch to the
`bootstrap.servers=` line, "all led, full ISR s" the launch to the first poll with every
partition led and an ISR of 3. Then RSS again, every partition's end offset (records lost?), and
the node logs of the restart window: ERROR/Traceback counts, the most frequent messages
(numbers as N), and each log's last lines if the restart timed out.

Target (issue 18, for 1,000 partitions): every partition led with a full ISR within 30 s of a
restart. A benchmark, not a test: the exit status is 0 whatever the figures, 1 if the run
failed, 2 if a prerequisite is missing.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

try:
    from _raftlog_cluster import CLIENT_LOG_LEVEL, RaftlogCluster, pid_alive, rss_kib
    from _support import environment, write_json
    from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec  # type: ignore[attr-defined]
except ImportError as missing:  # the exit status 2: a prerequisite is missing
    print(f"cannot run: {missing}: pip install -e '.[bench]'", file=sys.stderr)
    raise SystemExit(2) from missing

NODES = 3
REPLICATION_FACTOR = 3
TOPIC_PREFIX = "scale-"
TARGET_S = 30.0
TARGET_PARTITIONS = 1000  # the size the 30 s target is stated for
POLL_INTERVAL_S = 0.5
PROGRESS_INTERVAL_S = 5.0
OFFSETS_WAIT_S = 30.0
METADATA_TIMEOUT_S = 20.0  # a starved node took 10 s to answer one Metadata request
READY_TIMEOUT_S = 120.0  # the fresh cluster's launch
MB = 1_000_000
MILESTONE = re.compile(r"the controller for|registered with epoch|is unfenced|ready: Kafka on")
LOG_LINE = re.compile(r"^\S+ \S+ (?P<level>[A-Z]+) (?P<logger>\S+): (?P<message>.*)$")


@dataclass
class Led:
    """One Metadata poll of this run's topics."""

    led: int
    full_isr: int
    total: int
    answered: bool = True  # False: no Metadata answer within METADATA_TIMEOUT_S

    @property
    def done(self) -> bool:
        return self.total > 0 and self.full_isr == self.total

    def __str__(self) -> str:
        if not self.answered:
            return f"no Metadata answer within {METADATA_TIMEOUT_S:.0f} s"
        return f"{self.led:,} led, {self.full_isr:,} with a full ISR, of {self.total:,}"


class Launch:
    """`cluster.up()` in a thread, so Metadata can be polled from the launch on."""

    def __init__(self, cluster: RaftlogCluster, timeout_s: float) -> None:
        self.up_s: float | None = None
        self.error = ""
        self.thread = threading.Thread(target=self._run, args=(cluster, timeout_s), daemon=True)
        self.thread.start()

    def _run(self, cluster: RaftlogCluster, timeout_s: float) -> None:
        try:
            self.up_s = cluster.up(timeout_s)
        except Exception as exc:
            self.error = str(exc).splitlines()[0]

    def state(self) -> str:
        return "failed" if self.error else "waiting" if self.up_s is None else "up"


def topic_names(options: argparse.Namespace) -> list[str]:
    return [f"{TOPIC_PREFIX}{i:05d}" for i in range(options.topics)]


def leadership(admin: AdminClient, total: int) -> Led:
    try:
        topics = admin.list_topics(timeout=METADATA_TIMEOUT_S).topics
    except KafkaException:
        return Led(0, 0, total, answered=False)
    parts = [p for name, t in topics.items() if name.startswith(TOPIC_PREFIX)
             for p in t.partitions.values()]
    return Led(sum(p.leader >= 0 for p in parts),
               sum(p.leader >= 0 and len(p.isrs) == REPLICATION_FACTOR for p in parts), total)


def wait_led(admin: AdminClient, total: int, timeout_s: float,
             launch: Launch | None = None) -> tuple[float | None, float | None, Led]:
    """Poll until every partition is led with a full ISR, counting only polls after `launch`
    printed its line (before it, a node may answer from the metadata it replayed). Returns
    seconds from the call to that poll and to the first poll of any kind showing it (None:
    not within `timeout_s`), and the last poll."""
    next_progress = PROGRESS_INTERVAL_S
    started = time.monotonic()
    seen_s: float | None = None
    while True:
        state = leadership(admin, total)
        now = time.monotonic() - started
        up = "up" if launch is None else launch.state()
        seen_s = now if seen_s is None and state.done else seen_s
        if state.done and up == "up":
            return now, seen_s, state
        if up == "failed" or now > timeout_s:
            return None, seen_s, state
        if now >= next_progress:
            print(f"    {now:6.1f} s: {state} (cluster up: {up})", flush=True)
            next_progress = now + PROGRESS_INTERVAL_S
        time.sleep(POLL_INTERVAL_S)


# Per-topic CreateTopics errors an operator's script would retry: the controller moved
# (NOT_CONTROLLER: nothing applied) or the commit's outcome is unknown (REQUEST_TIMED_OUT; a
# retry of a topic that was in fact created then answers TOPIC_ALREADY_EXISTS).
RETRIABLE_CREATE_ERRORS = frozenset({KafkaError.NOT_CONTROLLER, KafkaError.REQUEST_TIMED_OUT})
CREATE_ATTEMPTS = 5


def create_topics(admin: AdminClient, options: argparse.Namespace) -> tuple[int, list[str]]:
    """CreateTopics in batches of `--create-batch`, one request at a time, retrying retriable
    per-topic errors; returns (requests, the retried errors as text)."""
    names = topic_names(options)
    requests = 0
    retried: list[str] = []
    for first in range(0, len(names), options.create_batch):
        pending = names[first:first + options.create_batch]
        retrying: set[str] = set()
        for _ in range(CREATE_ATTEMPTS):
            batch = [NewTopic(n, options.partitions_per_topic, REPLICATION_FACTOR)
                     for n in pending]
            failed = []
            for name, future in admin.create_topics(batch, request_timeout=120).items():
                try:
                    future.result(timeout=180)
                except KafkaException as exc:
                    error = exc.args[0]
                    if error.code() == KafkaError.TOPIC_ALREADY_EXISTS and name in retrying:
                        continue  # the earlier attempt did commit
                    if error.code() not in RETRIABLE_CREATE_ERRORS:
                        raise
                    retried.append(f"{name}: {error.name()}")
                    failed.append(name)
            requests += 1
            if not failed:
                break
            pending = failed
            retrying.update(failed)
            time.sleep(1)
        else:
            raise RuntimeError(f"CreateTopics kept failing: {retried[-3:]}")
    return requests, retried


def produce(bootstrap: str, options: argparse.Namespace) -> tuple[int, list[str]]:
    """`--records-per-partition` records to every partition, acks=all; (acked, errors)."""
    errors: list[str] = []

    def on_delivery(error: Any, _message: Any) -> None:
        if error is not None:
            errors.append(str(error))

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                         "log_level": CLIENT_LOG_LEVEL, "on_delivery": on_delivery})
    for topic in topic_names(options):
        for partition in range(options.partitions_per_topic):
            for i in range(options.records_per_partition):
                producer.produce(topic, b"scale-%d" % i, partition=partition)
            producer.poll(0)
    left = producer.flush(180)
    sent = options.topics * options.partitions_per_topic * options.records_per_partition
    return sent - left - len(errors), errors + [f"{left} undelivered after 180 s"] * (left > 0)


def short_partitions(admin: AdminClient, options: argparse.Namespace) -> dict[str, str]:
    """Partitions whose end offset (ListOffsets latest: the high watermark) is below the
    records acknowledged to each, with the offset or the error."""
    latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    request = {TopicPartition(t, p): latest for t in topic_names(options)
               for p in range(options.partitions_per_topic)}
    short = {}
    for tp, future in admin.list_offsets(request, request_timeout=60).items():
        try:
            offset = future.result().offset
        except KafkaException as exc:
            offset = exc.args[0]
        if not isinstance(offset, int) or offset < options.records_per_partition:
            short[f"{tp.topic}-{tp.partition}"] = str(offset)
    return short


def check_offsets(admin: AdminClient, options: argparse.Namespace, out: dict[str, Any]) -> None:
    """End offsets right after the restart, and again each second for up to OFFSETS_WAIT_S
    while some are short (a new leader's high watermark may lag for a moment)."""
    started = time.monotonic()
    out["short_partitions_first"] = short = short_partitions(admin, options)
    while short and time.monotonic() - started < OFFSETS_WAIT_S:
        time.sleep(1)
        short = short_partitions(admin, options)
    out.update(short_partitions_last=short, offsets_checked_s=time.monotonic() - started)


def node_rss_mb(cluster: RaftlogCluster) -> dict[str, dict[str, float]]:
    rss = {node_id: rss_kib(pid) for node_id, pid in sorted(cluster.node_pids().items())}
    return {f"node{n}": {"rss_mb": kib["VmRSS"] * 1024 / MB, "hwm_mb": kib["VmHWM"] * 1024 / MB}
            for n, kib in rss.items()}


def stop(cluster: RaftlogCluster, kill: bool) -> float:
    """Clean: SIGTERM to `cluster up` (it stops the nodes). --kill: SIGKILL every node first."""
    started = time.monotonic()
    pids = list(cluster.node_pids().values()) if kill else []
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    while any(pid_alive(pid) for pid in pids):
        time.sleep(0.05)
    seconds = time.monotonic() - started
    cluster.stop()
    return seconds if kill else time.monotonic() - started


def summarize_logs(data_dir: Path, since: dict[str, int], top: int) -> dict[str, Any]:
    """ERROR/Traceback counts (whole log and since `since`) and the most frequent messages
    since `since`, numbers replaced by N."""
    nodes: dict[str, dict[str, int]] = {}
    messages: Counter[str] = Counter()
    milestones: list[str] = []
    for path in sorted(data_dir.glob("node-*/server.log")):
        text = path.read_bytes()
        window = text[since.get(path.parent.name, 0):].decode(errors="replace")
        whole = text.decode(errors="replace")
        nodes[path.parent.name] = {
            "errors": whole.count(" ERROR "), "tracebacks": whole.count("Traceback"),
            "window_lines": window.count("\n"), "window_errors": window.count(" ERROR "),
            "window_tracebacks": window.count("Traceback")}
        for line in window.splitlines():
            if MILESTONE.search(line):
                milestones.append(f"{path.parent.name}: {line[11:]}")
            match = LOG_LINE.match(line)
            if match:
                key = f"{match['level']} {match['logger']}: {match['message']}"
                messages[re.sub(r"\d+", "N", key)[:160]] += 1
    return {"nodes": nodes, "top_messages": messages.most_common(top),
            "milestones": sorted(milestones, key=lambda m: m.split(": ", 1)[1])}


def log_tails(data_dir: Path, lines: int) -> str:
    return "\n".join(f"--- {p.parent.name}/server.log ---\n" + "\n".join(
        p.read_text(errors="replace").splitlines()[-lines:])
        for p in sorted(data_dir.glob("node-*/server.log")))


def restart(cluster: RaftlogCluster, options: argparse.Namespace, total: int,
            out: dict[str, Any], launches: list[Launch]) -> None:
    """Launch `cluster up` on the same dir and poll from the launch until all is led."""
    since = {p.parent.name: p.stat().st_size for p in cluster.data_dir.glob("node-*/server.log")}
    admin = cluster.admin()  # same ports as before: cluster.json keeps them
    launches.append(launch := Launch(cluster, options.restart_timeout_s))
    led_s, seen_s, state = wait_led(admin, total, options.restart_timeout_s, launch)
    launch.thread.join(10)
    out.update(restart_up_s=launch.up_s, restart_up_error=launch.error, restart_led_s=led_s,
               restart_led_any_poll_s=seen_s, restart_last_poll=asdict(state))
    print(f"  restart: cluster up {_s(launch.up_s)} s{' ' + launch.error if launch.error else ''}"
          f", all led with a full ISR {_s(led_s)} s after the launch ({state})", flush=True)
    out["restart_logs"] = summarize_logs(cluster.data_dir, since, options.top_messages)
    out["rss_after_restart_mb"] = node_rss_mb(cluster)
    if led_s is None:
        print(f"  the restart did not converge; last lines of the node logs:\n"
              f"{log_tails(cluster.data_dir, options.tail_lines)}", flush=True)
    elif options.records_per_partition > 0:
        check_offsets(cluster.admin(), options, out)


def run(options: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
    total = options.topics * options.partitions_per_topic
    cluster_args = [f"--override={kv}" for kv in options.override]
    cluster_args += ["--ready-timeout", str(options.restart_timeout_s)]
    cluster = RaftlogCluster(workdir / "cluster", NODES, options.log_level, cluster_args)
    launches: list[Launch] = []
    try:
        out["fresh_up_s"] = cluster.up(READY_TIMEOUT_S)
        print(f"  fresh cluster up {out['fresh_up_s']:.1f} s", flush=True)
        admin = cluster.admin()
        started = time.monotonic()
        out["create_requests"], out["create_retried"] = create_topics(admin, options)
        out["create_s"] = time.monotonic() - started
        if out["create_retried"]:
            print(f"  CreateTopics retried {len(out['create_retried'])} topic(s): "
                  f"{', '.join(out['create_retried'][:5])}", flush=True)
        out["created_led_s"], _, state = wait_led(admin, total, options.restart_timeout_s)
        print(f"  created {total:,} partitions in {out['create_s']:.1f} s "
              f"({out['create_requests']} CreateTopics); all led with a full ISR "
              f"{_s(out['created_led_s'])} s later ({state})", flush=True)
        if out["created_led_s"] is None:
            raise RuntimeError("the created partitions never all got a leader and a full ISR")
        started = time.monotonic()
        out["produced"], out["produce_errors"] = produce(cluster.bootstrap, options)
        out["produce_s"] = time.monotonic() - started
        print(f"  produced {out['produced']:,} records in {out['produce_s']:.1f} s, "
              f"{len(out['produce_errors'])} errors", flush=True)
        out["rss_before_restart_mb"] = node_rss_mb(cluster)
        out["data_mb"] = cluster.data_bytes() / MB
        out["stop_s"] = stop(cluster, options.kill)
        print(f"  {'SIGKILL' if options.kill else 'clean stop'}: {out['stop_s']:.1f} s", flush=True)
        restart(cluster, options, total, out, launches)
    finally:
        cluster.stop()
        if any(launch.thread.is_alive() for launch in launches):  # launched after that stop
            launches[0].thread.join(options.restart_timeout_s)
            cluster.stop()


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def report(options: argparse.Namespace, out: dict[str, Any]) -> None:
    total = options.topics * options.partitions_per_topic
    rows = [("cluster up (fresh)", out.get("fresh_up_s")),
            (f"create ({out.get('create_requests', '?')} CreateTopics)", out.get("create_s")),
            ("led, full ISR after create", out.get("created_led_s")),
            (f"produce {out.get('produced', 0):,} records", out.get("produce_s")),
            ("SIGKILL all nodes" if options.kill else "clean stop", out.get("stop_s")),
            ("cluster up (restart)", out.get("restart_up_s")),
            ("all led, full ISR (restart)", out.get("restart_led_s")),
            ("  the same in any poll (info)", out.get("restart_led_any_poll_s"))]
    print(f"\n{total:,} partitions RF {REPLICATION_FACTOR} on {NODES} nodes"
          f" ({options.topics} topics x {options.partitions_per_topic}), data "
          f"{out.get('data_mb', 0):.1f} MB\n{'phase':<32}{'s':>8}")
    for name, seconds in rows:
        print(f"{name:<32}{_s(seconds):>8}")
    for key in ("rss_before_restart_mb", "rss_after_restart_mb"):
        print(f"{key.removesuffix('_mb').replace('_', ' ')} MB: " + ", ".join(
            f"{n} {v['rss_mb']:.0f} (peak {v['hwm_mb']:.0f})" for n, v in out.get(key, {}).items()))
    if "short_partitions_last" in out:
        print(f"partitions with an end offset below the records acked: "
              f"{len(out['short_partitions_first'])} right after the restart, "
              f"{len(out['short_partitions_last'])} {out['offsets_checked_s']:.0f} s later "
              f"{dict(list(out['short_partitions_last'].items())[:5]) or ''}")
    logs = out.get("restart_logs", {})
    for node, counts in logs.get("nodes", {}).items():
        print(f"{node}: {counts['errors']} ERROR, {counts['tracebacks']} Traceback in the log; "
              f"restart window {counts['window_lines']:,} lines, {counts['window_errors']} "
              f"ERROR, {counts['window_tracebacks']} Traceback")
    if logs.get("milestones"):
        print("restart milestones:\n  " + "\n  ".join(logs["milestones"]))
    if logs.get("top_messages"):
        print("most frequent log messages of the restart window (all nodes):")
        for message, count in logs["top_messages"]:
            print(f"  {count:7,}  {message}")
    led_s = out.get("restart_led_s")
    verdict = "PASS" if led_s is not None and led_s <= TARGET_S else "MISS"
    note = "" if total == TARGET_PARTITIONS else f" (the target is for {TARGET_PARTITIONS:,})"
    print(f"{verdict}: restart: every partition led with a full ISR in <= {TARGET_S:.0f} s "
          f"({_s(led_s)} s){note}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--partitions-per-topic", type=int, default=10)
    parser.add_argument("--create-batch", type=int, default=10, help="topics per CreateTopics")
    parser.add_argument("--records-per-partition", type=int, default=1)
    parser.add_argument("--restart-timeout", dest="restart_timeout_s", type=float, default=300.0,
                        help="also the wait for the created partitions and cluster up's")
    parser.add_argument("--kill", action="store_true", help="SIGKILL the nodes, not a clean stop")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a server property for every node (cluster up --override)")
    parser.add_argument("--log-level", default="INFO", help="the nodes' log level")
    parser.add_argument("--top-messages", type=int, default=15)
    parser.add_argument("--tail-lines", type=int, default=15)
    parser.add_argument("--workdir", type=Path, default=None,
                        help="kept afterwards (default: a temp dir, deleted unless --keep)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--json", dest="json_path", type=Path, default=None)
    return parser.parse_args(argv)


def _raise_on_sigterm(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # so that the finally blocks stop the cluster


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    try:
        env = environment()
    except (OSError, RuntimeError) as exc:
        env = {"error": str(exc)}
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="raftlog-scale-"))
    if (workdir / "cluster").exists():
        print(f"{workdir}/cluster exists: the run needs a fresh cluster", file=sys.stderr)
        return 1
    out: dict[str, Any] = {}
    status = 0
    print(f"scale: {options.topics} topics x {options.partitions_per_topic} partitions, RF "
          f"{REPLICATION_FACTOR}, {NODES} nodes, {'SIGKILL' if options.kill else 'clean'} "
          f"restart; {env.get('cpus')} CPUs, load avg {os.getloadavg()[0]:.2f}; in {workdir}",
          flush=True)
    try:
        run(options, workdir, out)
    except Exception as exc:
        traceback.print_exc()
        out["error"] = f"{type(exc).__name__}: {exc}"
        print(f"the run failed; last lines of the node logs:\n"
              f"{log_tails(workdir / 'cluster', options.tail_lines)}", flush=True)
        status = 1
    finally:
        if not options.keep and options.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    report(options, out)
    env["loadavg_at_end"] = os.getloadavg()
    write_json(options.json_path, {"options": vars(options), "environment": env,
                                   "target_s": TARGET_S, **out})
    return status


if __name__ == "__main__":
    raise SystemExit(main())
