"""The demo pipeline (`make demo`): website activity tracking on a local 3-node raftlog cluster.

1. `raftlog cluster up` in a temporary directory on free localhost ports (3 nodes).
2. A generator produces page-view events (JSON) into `pageviews` with an idempotent producer.
   Event time is compressed: the events of a ~30 s run carry timestamps spread over several
   minutes, so several one-minute windows fill up while you watch. A last "end of stream"
   event, far ahead in event time, moves the watermark past the last window.
3. A Spark Structured Streaming job (local[2]) reads them through the `raftlog` source,
   counts views per page in one-minute event-time windows (append mode with a one-minute
   watermark: a window's counts are written once, when it closes; Python data source sinks
   do not support update mode) and writes them to `pageview-counts` through the exactly-once
   sink.
4. While it runs, a live table of the top pages is printed, read back from `pageview-counts`
   (read_committed): the output of the sink, not Spark's memory.
5. At the end: a plot of views over time (PNG), a check of the output, and a clean stop.

The check: every (window, page) appears exactly once in `pageview-counts`, with the number of
events generated for it. The exit status is non-zero on any mismatch.

`run_pipeline()` is the core, usable against any cluster (the test suite runs it small).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

REPO_ROOT = Path(__file__).resolve().parents[1]
EVENTS_TOPIC = "pageviews"
COUNTS_TOPIC = "pageview-counts"
PAGES = ["/", "/pricing", "/docs", "/blog", "/signup", "/login", "/docs/quickstart", "/about",
         "/careers", "/status"]
PAGE_WEIGHTS = [30, 8, 20, 12, 5, 10, 9, 4, 1, 1]
WINDOW_MS = 60_000
END_PAGE = "(end of stream)"  # the watermark-moving last event; not counted
END_AHEAD_MS = 5 * WINDOW_MS
CLUSTER_START_TIMEOUT_S = 90.0
CLUSTER_STOP_TIMEOUT_S = 60.0
WindowKey = tuple[int, str]  # (window start in ms since the epoch, page)


@dataclass(frozen=True)
class DemoSettings:
    events: int = 24_000
    generate_s: float = 30.0  # wall-clock seconds over which the events are produced
    event_span_s: float = 300.0  # event-time seconds they cover: five one-minute windows
    partitions: int = 3
    replication_factor: int = 3
    trigger_s: float = 2.0
    refresh_s: float = 4.0  # live table period
    catch_up_timeout_s: float = 90.0  # after the generator: until the counts are complete
    seed: int = 7


@dataclass
class DemoResult:
    expected: dict[WindowKey, int]
    latest: dict[WindowKey, int]
    problems: list[str]
    output_records: int
    batches: int
    input_rows: int
    seconds: float
    plot: Path | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


# -- the cluster ----------------------------------------------------------------------------


@contextmanager
def local_cluster(workdir: Path, nodes: int = 3) -> Iterator[str]:
    """`raftlog cluster up` as a child process; yields its bootstrap servers; SIGTERM at the
    end (the supervisor then stops the nodes one by one, the controller last)."""
    log_path = workdir / "cluster.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "raftlog", "--log-level", "WARNING", "cluster", "up",
             "--nodes", str(nodes), "--data-dir", str(workdir / "cluster"), "--port-base", "0"],
            stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL)
    try:
        assert process.stdout is not None
        bootstrap = _read_bootstrap(process, process.stdout, log_path)
        yield bootstrap
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(CLUSTER_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _read_bootstrap(process: subprocess.Popen[bytes], stdout: IO[bytes], log: Path) -> str:
    found: list[str] = []

    def read() -> None:
        line = stdout.readline().decode().strip()
        if line.startswith("bootstrap.servers="):
            found.append(line.split("=", 1)[1])

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(CLUSTER_START_TIMEOUT_S)
    if not found:
        raise RuntimeError(f"the cluster did not come up in {CLUSTER_START_TIMEOUT_S:.0f} s"
                           f" (exit code {process.poll()}); see {log}")
    return found[0]


def create_topics(bootstrap: str, settings: DemoSettings) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    wanted = [NewTopic(EVENTS_TOPIC, settings.partitions, settings.replication_factor),
              NewTopic(COUNTS_TOPIC, 2, settings.replication_factor)]
    for name, future in admin.create_topics(wanted).items():
        try:
            future.result(timeout=30)
        except Exception as exc:
            error = exc.args[0] if exc.args else None
            if not (isinstance(error, KafkaError)
                    and error.code() == KafkaError.TOPIC_ALREADY_EXISTS):
                raise RuntimeError(f"creating topic {name!r} failed: {exc}") from None


# -- the generator --------------------------------------------------------------------------


class Generator(threading.Thread):
    """Produces `settings.events` page views at an even pace over `generate_s` seconds, with
    event times spread evenly over `event_span_s` seconds that start on a minute boundary."""

    def __init__(self, bootstrap: str, settings: DemoSettings) -> None:
        super().__init__(name="pageview-generator", daemon=True)
        self.bootstrap = bootstrap
        self.settings = settings
        now_ms = int(time.time() * 1000)
        self.base_ms = (now_ms - int(settings.event_span_s * 1000)) // WINDOW_MS * WINDOW_MS
        self.expected: Counter[WindowKey] = Counter()
        self.produced = 0
        self.error: BaseException | None = None
        self.failures: list[str] = []

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:
            self.error = exc

    @staticmethod
    def _weights(progress: float) -> list[float]:
        """Page popularity at a point of the run (0..1): steady, except that a blog post
        goes viral in the middle of the run and fades again."""
        viral = max(0.0, 1.0 - abs(progress - 0.55) / 0.2)
        weights = [float(w) for w in PAGE_WEIGHTS]
        weights[PAGES.index("/blog")] *= 1.0 + 3.0 * viral
        return weights

    def _delivered(self, error: KafkaError | None, _message: Any) -> None:
        if error is not None:
            self.failures.append(error.str())

    def _run(self) -> None:
        settings = self.settings
        producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True,
                             "acks": "all", "linger.ms": 10, "on_delivery": self._delivered})
        rng = random.Random(settings.seed)
        started = time.monotonic()
        span_ms = settings.event_span_s * 1000
        for i in range(settings.events):
            ts_ms = self.base_ms + int(i * span_ms / settings.events)
            page = rng.choices(PAGES, weights=self._weights(i / settings.events))[0]
            user = f"user-{rng.randrange(1000)}"
            event = {"page": page, "user": user, "ts": ts_ms}
            producer.produce(EVENTS_TOPIC, json.dumps(event).encode(), user.encode())
            self.expected[(ts_ms // WINDOW_MS * WINDOW_MS, page)] += 1
            self.produced = i + 1
            if i % 200 == 0:
                producer.poll(0)
                ahead_s = started + settings.generate_s * i / settings.events - time.monotonic()
                if ahead_s > 0:
                    time.sleep(ahead_s)
        # Far ahead in event time: the watermark passes the last window, which then closes.
        end_ms = self.base_ms + int(span_ms) + END_AHEAD_MS
        for partition in range(settings.partitions):
            event = {"page": END_PAGE, "user": "-", "ts": end_ms}
            producer.produce(EVENTS_TOPIC, json.dumps(event).encode(), partition=partition)
        if producer.flush(60) != 0 or self.failures:
            raise RuntimeError(f"the generator could not deliver every event: {self.failures[:3]}")


# -- reading the output ---------------------------------------------------------------------


class CountsView:
    """Everything in `pageview-counts` as committed so far (read_committed), latest per key."""

    def __init__(self, bootstrap: str) -> None:
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": f"pageview-view-{os.getpid()}",
            "enable.auto.commit": False, "isolation.level": "read_committed",
            "enable.partition.eof": False})
        self.history: dict[WindowKey, list[int]] = {}
        self.records = 0
        self._assigned = False

    def poll(self, wait_s: float = 0.2) -> None:
        if not self._assigned:
            metadata = self.consumer.list_topics(COUNTS_TOPIC, timeout=10)
            partitions = sorted(metadata.topics[COUNTS_TOPIC].partitions)
            self.consumer.assign([KafkaTopicPartition(COUNTS_TOPIC, p, 0) for p in partitions])
            self._assigned = True
        while True:
            messages = self.consumer.consume(5000, timeout=wait_s)
            for message in messages:
                if message.error() is not None:
                    continue
                row = json.loads(message.value() or b"{}")
                key = (int(row["window_start_ms"]), str(row["page"]))
                self.history.setdefault(key, []).append(int(row["views"]))
                self.records += 1
            if not messages:
                return
            wait_s = 0.0

    @property
    def latest(self) -> dict[WindowKey, int]:
        return {key: values[-1] for key, values in self.history.items()}

    def close(self) -> None:
        self.consumer.close()


def verify(expected: dict[WindowKey, int], history: dict[WindowKey, list[int]]) -> list[str]:
    """Every (window, page) is in the output exactly once (append mode writes a window when
    it closes; a second record means a micro-batch was written twice), with its generated
    count."""
    problems: list[str] = []
    for key in sorted(set(expected) | set(history)):
        values = history.get(key, [])
        want = expected.get(key, 0)
        label = f"{_clock(key[0])} {key[1]}"
        if len(values) > 1:
            problems.append(f"{label}: written {len(values)} times: {values}")
        if not values:
            problems.append(f"{label}: missing from {COUNTS_TOPIC} ({want} generated)")
        elif values[-1] != want:
            problems.append(f"{label}: {values[-1]} views in {COUNTS_TOPIC}, {want} generated")
    return problems


def _clock(ms: int) -> str:
    return time.strftime("%H:%M", time.localtime(ms / 1000))


def print_table(view: CountsView, produced: int, input_rows: int, batches: int,
                top: int = 6) -> None:
    latest = view.latest
    totals: Counter[str] = Counter()
    for (_, page), views in latest.items():
        totals[page] += views
    windows = sorted({w for w, _ in latest})
    last = windows[-1] if windows else None
    lines = [f"-- {time.strftime('%H:%M:%S')}  generated {produced:,}  read by Spark"
             f" {input_rows:,} in {batches} micro-batches  windows {len(windows)} --",
             f"   {'page':<18}{'views':>8}{'last window' if last is None else _clock(last):>13}"]
    for page, views in totals.most_common(top):
        in_last = latest.get((last, page), 0) if last is not None else 0
        lines.append(f"   {page:<18}{views:>8,}{in_last:>13,}")
    print("\n".join(lines), flush=True)


def save_plot(latest: dict[WindowKey, int], path: Path, top: int = 6) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    totals: Counter[str] = Counter()
    for (_, page), views in latest.items():
        totals[page] += views
    windows = sorted({w for w, _ in latest})
    figure, axes = plt.subplots(figsize=(9, 4.8))
    for page, _ in totals.most_common(top):
        axes.plot([_clock(w) for w in windows], [latest.get((w, page), 0) for w in windows],
                  marker="o", label=page)
    axes.set_xlabel("one-minute window (event time)")
    axes.set_ylabel("views")
    axes.set_title("Page views per minute: raftlog -> Spark -> raftlog (exactly-once)")
    axes.legend(loc="upper left", fontsize="small")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


# -- the Spark job --------------------------------------------------------------------------


def local_spark() -> Any:
    """A local[2] SparkSession with the settings from the connector's reference notes."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # pyspark_raftlog (the auto-registration module) sits at the repository root.
    paths = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("raftlog-pageviews")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
             .config("spark.sql.streaming.stopTimeout", "10s")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def start_counting(spark: Any, bootstrap: str, checkpoint: Path, trigger_s: float) -> Any:
    """pageviews -> views per page per one-minute window -> pageview-counts (exactly-once)."""
    from pyspark.sql import functions as F

    events = (spark.readStream.format("raftlog")
              .option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", EVENTS_TOPIC)
              .option("startingOffsets", "earliest")
              .load()
              .select(F.from_json(F.col("value").cast("string"),
                                  "page STRING, user STRING, ts LONG").alias("e"))
              .select(F.col("e.page").alias("page"),
                      F.timestamp_millis(F.col("e.ts")).alias("event_time"))
              .withWatermark("event_time", "1 minute"))
    # The END_PAGE event is counted too, but its window lies beyond the watermark it sets,
    # so it never closes and is never written. (Filtering it out instead would not work:
    # Spark pushes such a filter below the watermark, which then never moves.)
    counts = events.groupBy(F.window("event_time", "1 minute"), "page").count()
    start_ms = F.unix_millis(F.col("window.start"))
    out = counts.select(
        F.concat_ws("|", start_ms.cast("string"), F.col("page")).alias("key"),
        F.to_json(F.struct(start_ms.alias("window_start_ms"),
                           F.unix_millis(F.col("window.end")).alias("window_end_ms"),
                           F.col("page"), F.col("count").alias("views"))).alias("value"))
    return (out.writeStream.format("raftlog").outputMode("append")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", COUNTS_TOPIC)
            .option("raftlog.sink.guarantee", "exactly_once")  # the default, spelled out
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime=f"{trigger_s} seconds")
            .start())


def _progress(query: Any) -> tuple[int, int]:
    """(input rows, micro-batches with input) over the query's recent progress (the last
    100 reports, which covers this demo's run)."""
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    return sum(p["numInputRows"] for p in progress), len(progress)


def run_pipeline(spark: Any, bootstrap: str, settings: DemoSettings, workdir: Path,
                 plot: Path | None, *, quiet: bool = False) -> DemoResult:
    """Topics, generator, streaming job, live table, verification, plot."""
    started = time.monotonic()
    create_topics(bootstrap, settings)
    query = start_counting(spark, bootstrap, workdir / "checkpoint", settings.trigger_s)
    generator = Generator(bootstrap, settings)
    view = CountsView(bootstrap)
    input_rows = batches = 0
    try:
        generator.start()
        input_rows, batches = _follow(query, generator, view, settings, quiet)
    finally:
        query.stop()
        generator.join(5)
        view.close()
    # A fresh reader for the verdict: everything committed in pageview-counts, from offset 0.
    final = CountsView(bootstrap)
    try:
        final.poll(wait_s=2.0)
    finally:
        final.close()
    if not quiet:
        print_table(final, generator.produced, input_rows, batches)
    expected = dict(generator.expected)
    result = DemoResult(expected, final.latest, verify(expected, final.history),
                        final.records, batches, input_rows, time.monotonic() - started)
    if plot is not None and final.latest:
        result.plot = save_plot(final.latest, plot)
    return result


def _follow(query: Any, generator: Generator, view: CountsView, settings: DemoSettings,
            quiet: bool) -> tuple[int, int]:
    """Print the live table until the output is complete (or the catch-up time is over)."""
    input_rows = batches = 0
    next_table = time.monotonic() + settings.refresh_s
    catch_up_deadline: float | None = None
    while True:
        if query.exception() is not None:
            raise RuntimeError(f"the streaming query failed: {query.exception()}")
        if generator.error is not None:
            raise RuntimeError(f"the generator failed: {generator.error}")
        view.poll()
        input_rows, batches = _progress(query)
        if time.monotonic() >= next_table:
            if not quiet:
                print_table(view, generator.produced, input_rows, batches)
            next_table = time.monotonic() + settings.refresh_s
        if not generator.is_alive():
            if view.latest == dict(generator.expected):
                break
            if catch_up_deadline is None:
                catch_up_deadline = time.monotonic() + settings.catch_up_timeout_s
            elif time.monotonic() > catch_up_deadline:
                break  # verification below reports what is missing
        time.sleep(0.3)
    return input_rows, batches


# -- main -----------------------------------------------------------------------------------


@dataclass
class _Timer:
    started: float = field(default_factory=time.monotonic)

    def __str__(self) -> str:
        return f"{time.monotonic() - self.started:5.1f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spark_connector.demo",
        description="Page views -> raftlog (3 nodes) -> Spark windowed counts -> raftlog,"
                    " exactly-once; prints a live table, saves a plot, checks the output.")
    parser.add_argument("--events", type=int, default=DemoSettings.events)
    parser.add_argument("--seconds", type=float, default=DemoSettings.generate_s,
                        help="how long the generator runs (wall clock)")
    parser.add_argument("--plot", type=Path, default=Path("pageviews.png"),
                        help="where to save the plot (default ./pageviews.png)")
    args = parser.parse_args(argv)
    if shutil.which("java") is None:
        print("the demo runs Spark, which needs a Java runtime (17+) on PATH", file=sys.stderr)
        return 2
    settings = DemoSettings(events=args.events, generate_s=args.seconds)
    timer = _Timer()
    with tempfile.TemporaryDirectory(prefix="raftlog-pageviews-") as tmp:
        workdir = Path(tmp)
        print(f"[{timer}] starting a 3-node raftlog cluster (data in {workdir}) ...", flush=True)
        with local_cluster(workdir) as bootstrap:
            print(f"[{timer}] cluster up: bootstrap.servers={bootstrap}", flush=True)
            print(f"[{timer}] starting Spark (local[2]) ...", flush=True)
            spark = local_spark()
            try:
                print(f"[{timer}] streaming {settings.events:,} page views over"
                      f" {settings.generate_s:.0f} s (event time spread over"
                      f" {settings.event_span_s / 60:.0f} minutes) ...", flush=True)
                result = run_pipeline(spark, bootstrap, settings, workdir, args.plot.resolve())
            finally:
                spark.stop()
            print(f"[{timer}] Spark stopped; stopping the cluster ...", flush=True)
        print(f"[{timer}] cluster stopped", flush=True)
    windows = len({w for w, _ in result.expected})
    print(f"{sum(result.expected.values()):,} events in {windows} windows x pages ->"
          f" {result.output_records:,} window counts in {COUNTS_TOPIC} from"
          f" {result.batches} micro-batches")
    if result.plot is not None:
        print(f"plot saved to {result.plot}")
    if result.ok:
        print(f"OK: every (window, page) count in {COUNTS_TOPIC} (read_committed) matches the"
              " generated events, and no micro-batch was written twice")
        return 0
    print(f"MISMATCH ({len(result.problems)}):")
    for problem in result.problems[:20]:
        print(f"  {problem}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
