"""``python -m actor.follow``: a weight-sync-only actor that follows its region's versions.

It bootstraps, then stages each new version as soon as Redis announces it and applies it
at once (there is no engine between batches here). Used by the multi-process tests and as
the smallest example of the updater; the RL worker loop drives the same Updater.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading

from actor.config import SyncConfig
from actor.updater import Held, Updater, open_sync_runs
from aurora_store.coord.coordinator import Coordinator
from aurora_store.coord.errors import CoordinationError
from aurora_store.options import add_options, build


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m actor.follow", description=__doc__)
    add_options(p, SyncConfig)
    args: SyncConfig = build(SyncConfig, p.parse_args(argv))
    coord = Coordinator(args.redis, args.run_id)
    run, fallback = open_sync_runs(args)
    up = Updater(run, region=args.region, coord=coord, fallback=fallback, worker_id=args.worker_id)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    held = up.bootstrap()
    after, registered = "0-0", False
    while not stop.is_set():
        try:
            if not registered:  # first time, and again after Redis lost its state
                coord.workers.register("actor", args.region, worker_id=args.worker_id)
                _report(coord, args.worker_id, held)
                after, registered = coord.regions.last_event_id(args.region), True
            if coord.workers.heartbeat(args.worker_id):  # its state in Redis is gone: register again
                registered = False
                continue
            events = coord.regions.events(args.region, after, block_ms=500)
            if events:
                after = events[-1].id
        except CoordinationError:
            registered = False  # Redis is down or restarted: keep following the bucket meanwhile
            stop.wait(0.5)
        latest = up.latest()  # the region's version in Redis, or the bucket's when Redis has none
        if latest is not None and latest > held.version:
            up.stage(latest)
            held = up.apply() or held
            with contextlib.suppress(CoordinationError):
                _report(coord, args.worker_id, held)
    with contextlib.suppress(CoordinationError):
        coord.workers.unregister(args.worker_id)
    return 0


def _report(coord: Coordinator, worker_id: str, held: Held) -> None:
    coord.workers.update(worker_id, version=held.version, version_hash=held.version_hash, digest=held.weights_digest)


if __name__ == "__main__":
    raise SystemExit(main())
