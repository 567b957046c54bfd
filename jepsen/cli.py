"""Command line: ``python -m jepsen test`` runs one test, ``python -m jepsen campaign`` many.

Exit status of ``test``: 0 valid, 1 invalid, 2 unknown, 3 the harness itself failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from jepsen.runner import WORKLOADS, TestOptions, run_test


def _test_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=3, choices=(3, 5))
    p.add_argument("--time-limit", type=float, default=30.0, metavar="S",
                   help="seconds of client operations (faults included)")
    p.add_argument("--rate", type=float, default=20.0, metavar="OPS",
                   help="target operations per second, all clients together")
    p.add_argument("--load", choices=("paced", "saturate"), default="paced",
                   help="paced: --rate operations a second; saturate: --rate unused, queue: "
                        "idempotent producers sending batches as fast as the cluster takes; "
                        "txn, metadata: each worker's next operation as soon as its last ends")
    p.add_argument("--concurrency", type=int, default=4, metavar="N",
                   help="client threads (processes in the history)")
    p.add_argument("--interval", type=float, default=5.0, metavar="S",
                   help="mean seconds between (and of) faults")
    p.add_argument("--store", type=Path, default=Path("store"))
    p.add_argument("--unsafe", action="store_true",
                   help="harness-only unsafe cluster: acks=1, unclean leader election, "
                        "no fsync before acknowledging (the checker must catch it)")
    p.add_argument("--unsafe-fsync", action="store_true",
                   help="harness-only: acknowledge without fsync (acks=all, clean elections): "
                        "only --nemesis power-loss should lose acknowledged writes")
    p.add_argument("--secure", action="store_true",
                   help="secured cluster: SASL_SSL (TLS with a local CA, SCRAM-SHA-512 users,"
                        " node-to-node TLS+SCRAM) on every node's only Kafka listener")
    p.add_argument("--no-netns", dest="netns", action="store_false",
                   help="run on loopback without network namespaces (no partitions)")
    p.add_argument("--sub-via", choices=("both", "assign", "subscribe"), default="both",
                   help="queue workload: how consumers get partitions")
    p.add_argument("--final-time", type=float, default=30.0, metavar="S",
                   help="upper bound for the final reads")
    p.add_argument("--keep-data", action="store_true", help="keep the nodes' data dirs")
    p.add_argument("--client-debug", action="store_true",
                   help="write librdkafka's eos and msg debug lines of every producer to the "
                        "run's clients.log (epoch bumps, retries, implicit acks)")
    p.add_argument("--quiet", action="store_true", help="no progress line")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {value}")
    return value


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m jepsen", description=__doc__)
    sub = top.add_subparsers(dest="command", required=True)
    t = sub.add_parser("test", help="run one test")
    t.add_argument("--workload", choices=WORKLOADS, default="queue")
    t.add_argument("--nemesis", default="none",
                   help="none, all, harsh (kill, kill-two, kill-burst), or a comma-separated "
                        "list of kill, pause, partition, clock, kill-two, kill-burst, "
                        "wipe-disk, power-loss (LazyFS: `make lazyfs`)")
    t.add_argument("--seed", type=int, default=0)
    _test_args(t)
    c = sub.add_parser("campaign", help="many seeded runs, one table of anomalies")
    c.add_argument("--runs", type=int, default=3, help="runs per workload x nemesis")
    c.add_argument("--workloads", default="queue,txn,metadata")
    c.add_argument("--nemeses", default="none,kill,pause,partition,clock,all")
    c.add_argument("--seed", type=int, default=1, help="first seed")
    c.add_argument("--out", type=Path, default=None,
                   help="table directory (default: STORE/campaign-<time>); one that already "
                        "holds a campaign.json is resumed: only runs not yet recorded are run")
    c.add_argument("--until", default=None, metavar="HH:MM",
                   help="start no run that would end after this UTC time (today), or an ISO "
                        "date-time; judged by the mean run time so far")
    c.add_argument("--deadline-s", type=float, default=None, metavar="S",
                   help="like --until, S seconds after the campaign starts")
    c.add_argument("--keep-store", choices=("invalid", "all"), default="invalid",
                   help="invalid: shrink the store dir of a valid run to results.json and "
                        "history.jsonl.gz (others keep logs and plots); all: keep everything")
    c.add_argument("--workers", type=_positive_int, default=1, metavar="N",
                   help="runs at once (each its own cluster and namespaces); 2 on a 2-core "
                        "box roughly doubles the runs per hour, and loads the nodes more")
    c.add_argument("--no-retry-errors", dest="retry_errors", action="store_false",
                   help="on resume, do not rerun runs that hit a harness error")
    _test_args(c)
    return top


def _options(args: argparse.Namespace, workload: str, nemesis: str, seed: int) -> TestOptions:
    return TestOptions(
        workload=workload, nemesis=nemesis, nodes=args.nodes, time_limit_s=args.time_limit,
        rate=args.rate, concurrency=args.concurrency, seed=seed, store=args.store,
        unsafe=args.unsafe, unsafe_fsync=args.unsafe_fsync, secure=args.secure,
        interval_s=args.interval, netns=args.netns, sub_via=args.sub_via, load=args.load,
        final_time_s=args.final_time, keep_data=args.keep_data, progress=not args.quiet,
        client_debug=args.client_debug)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "campaign":
        from jepsen.campaign import run_campaign

        return int(run_campaign(args, _options))
    opts = _options(args, args.workload, args.nemesis, args.seed)
    try:
        results = run_test(opts)
    except ValueError as exc:  # bad --nemesis / --workload
        print(f"python -m jepsen: {exc}", file=sys.stderr)
        return 64
    except KeyboardInterrupt:
        print("\ninterrupted; cluster stopped and namespaces removed", file=sys.stderr)
        return 130
    except Exception as exc:
        logging.exception("the harness failed: %s", exc)
        return 3
    summary = {k: results.get(k) for k in ("valid", "anomaly_counts", "unknown_reasons")}
    summary["store"] = str(results.get("test", {}).get("store_dir", ""))
    print(json.dumps(summary))
    valid = results["valid"]
    return 0 if valid is True else 1 if valid is False else 2
