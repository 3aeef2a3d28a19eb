"""``aurora relay``: registered with the ``aurora`` command through the ``aurora.commands`` entry point.
Its flags come from :class:`relay.config.RelayConfig`."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from typing import Any

from aurora_store import config as configfile
from aurora_store.config.options import add_options, build
from aurora_store.diagnostics import dump_stacks_on_signal
from aurora_store.redact import setup_logging
from relay.config import CONFIG_FILE, RelayConfig

configfile.declare(CONFIG_FILE)


def register(sub: Any) -> None:
    """Add the ``relay`` subcommand to the ``aurora`` parser."""
    p = sub.add_parser("relay", help="copy a run's versions from one region's bucket to another's, cut-through")
    configfile.add_flag(p)
    add_options(p, RelayConfig, defaults=configfile.defaults("relay"))
    p.set_defaults(handler=main)


def main(ns: argparse.Namespace) -> int:
    from aurora_store.bucket.objectstore import ObjectStore
    from aurora_store.coord.coordinator import Coordinator
    from relay.worker import Relay

    args: RelayConfig = build(RelayConfig, ns)
    setup_logging()
    dump_stacks_on_signal()
    run_id = args.run_id or args.source.rstrip("/").rsplit("/", 1)[-1]
    coord = Coordinator(args.redis, run_id) if args.redis else None
    source = ObjectStore(args.source, args.source_options, concurrency=args.concurrency)
    dest = ObjectStore(args.dest, args.dest_options, concurrency=args.concurrency)
    relay = Relay(
        source, dest, coord, source_region=args.source_region, dest_region=args.dest_region, verify_key=args.verify_key
    )
    relay.metrics.m.serve(args.metrics_port, args.metrics_addr)
    if args.once:
        if not relay.src.versions():
            source.require_run()  # not an empty run: a missing bucket or prefix, an endpoint that does not answer
        done = relay.backfill()
        print(
            json.dumps(
                {
                    "copied_versions": done,
                    "objects_copied": relay.stats.copied,
                    "objects_skipped": relay.stats.skipped,
                    "bytes": relay.stats.bytes,
                }
            )
        )
        return 0
    if coord is None:
        print("aurora: error: a long-running relay needs --redis (or use --once)", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    relay.run(stop, rescan_s=args.rescan_s)
    return 0
