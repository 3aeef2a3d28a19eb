"""``aurora relay``: registered with the ``aurora`` command through the ``aurora.commands`` entry point."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from typing import Any


def register(sub: Any) -> None:
    """Add the ``relay`` subcommand to the ``aurora`` parser."""
    p = sub.add_parser("relay", help="copy a run's versions from one region's bucket to another's, cut-through")
    p.add_argument("--source", required=True, help="the source region's run URI (home, or an upstream relay's)")
    p.add_argument("--dest", required=True, help="this region's run URI")
    p.add_argument("--redis", default=os.environ.get("AURORA_REDIS"), help="Redis URL (or $AURORA_REDIS)")
    p.add_argument("--run-id", help="the run's name in Redis (default: last part of --source)")
    p.add_argument("--source-region", default="home", help="the source's region name in Redis (default: home)")
    p.add_argument("--dest-region", required=True, help="this region's name in Redis")
    p.add_argument("--once", action="store_true", help="copy every committed version the destination lacks, then exit")
    p.add_argument("--verify-key", metavar="FILE", help="refuse versions not signed by this Ed25519 public key")
    p.add_argument("--source-options", type=json.loads, default={}, help="fsspec storage options (JSON)")
    p.add_argument("--dest-options", type=json.loads, default={}, help="fsspec storage options (JSON)")
    p.add_argument("--concurrency", type=int, default=8, help="parallel object copies")
    p.add_argument("--rescan-s", type=float, default=30.0, help="also scan the buckets this often (seconds)")
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    from aurora_store.coord import Coordinator
    from aurora_store.objectstore import ObjectStore
    from relay.worker import Relay

    run_id = args.run_id or args.source.rstrip("/").rsplit("/", 1)[-1]
    coord = Coordinator(args.redis, run_id) if args.redis else None
    source = ObjectStore(args.source, args.source_options, concurrency=args.concurrency)
    dest = ObjectStore(args.dest, args.dest_options, concurrency=args.concurrency)
    relay = Relay(
        source, dest, coord, source_region=args.source_region, dest_region=args.dest_region, verify_key=args.verify_key
    )
    if args.once:
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
