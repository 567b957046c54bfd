"""``raftlog format --config server.properties --add-scram 'SCRAM-SHA-512=[name=admin,
password=...]'``: the SCRAM users a new cluster starts with (Kafka's ``kafka-storage format
--add-scram``, KIP-900); see :mod:`raftlog.controller.scram_bootstrap`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from raftlog.config import ConfigError, ServerConfig, load_properties
from raftlog.controller.scram_bootstrap import BootstrapError, parse_add_scram, write_bootstrap

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("format", help="write the SCRAM users a new cluster starts"
                                 " with (kafka-storage format --add-scram)")
    parser.add_argument("--config", required=True, help="server.properties file")
    parser.add_argument("--add-scram", action="append", default=[], required=True,
                        metavar="'SCRAM-SHA-512=[name=N,password=P]'")


def run(args: argparse.Namespace) -> int:
    try:
        config = ServerConfig.from_properties(load_properties(args.config))
        entries = [parse_add_scram(text) for text in args.add_scram]
        path = write_bootstrap(config.metadata_log_dir, entries)
    except (BootstrapError, ConfigError, OSError) as exc:
        print(f"raftlog format: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(entries)} SCRAM credential(s) to {path}; the first controller"
          " commits them on a cluster without SCRAM users")
    return 0
