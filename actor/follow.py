"""``python -m actor.follow``: a weight-sync-only actor that follows its region's versions.

It bootstraps, then brings its weights to each new version as soon as its region's commit wakes
it (the same :class:`~actor.wakeups.Wakeups` listener the RL actor uses, on the commits stream
only), staging and applying at once (there is no engine between batches here), through the same
:class:`~actor.follower.Follower` the RL actor follows with. Used by the multi-process tests and
as the smallest example of following a run.
"""

from __future__ import annotations

import contextlib
import signal
import threading

from actor.config import SyncConfig
from actor.follower import Follower
from actor.metrics import ActorMetrics
from actor.updater import Applied, Updater, open_sync_runs
from actor.wakeups import Wakeups
from aurora_store.cli_parser import Parser
from aurora_store.config.options import add_options, build
from aurora_store.coord.coordinator import Coordinator
from aurora_store.coord.errors import CoordinationError
from aurora_store.coord.workers import Beat
from aurora_store.errors import ChainError

CHECK_S = 0.5
"""How long the follower waits for a commit before it heartbeats and looks at the region again."""


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m actor.follow", description=__doc__)
    add_options(p, SyncConfig)
    args: SyncConfig = build(SyncConfig, p.parse_args(argv))
    coord = Coordinator(args.redis, args.run_id)
    run, fallback = open_sync_runs(args)
    up = Updater(run, region=args.region, coord=coord, fallback=fallback, worker_id=args.worker_id)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    wake = Wakeups(coord, args.worker_id, args.region, block_s=CHECK_S)
    listener = threading.Thread(target=wake.run, args=(stop,), name="aurora-wakeups", daemon=True)
    listener.start()

    def report_applied(applied: Applied) -> None:
        with contextlib.suppress(CoordinationError):
            _report(coord, args.worker_id, applied)

    follower = Follower(
        up,
        wake,
        ActorMetrics(args.region, args.worker_id),
        who=args.worker_id,
        stop=stop,
        check_s=CHECK_S,
        verify_live=args.verify_live,
        on_applied=report_applied,
        on_broken=stop.set,
    )
    applied = up.bootstrap()
    seen, registered = wake.seq, False
    beat = Beat(coord.workers, args.worker_id, 15.0)  # one ZADD a beat; in full only when it must
    while not stop.is_set():
        try:
            if not registered:  # first time, and again after Redis lost its state
                coord.workers.register("actor", args.region, worker_id=args.worker_id, ttl_s=beat.ttl_ms / 1000)
                _report(coord, args.worker_id, applied)
                registered = True
            if beat():  # its state in Redis is gone: register again
                registered = False
                wake.rewind()  # new stream ids may be below the ones it had read
                continue
        except CoordinationError:
            registered = False  # Redis is down or restarted: keep following the bucket meanwhile
        latest = up.latest()  # the region's version in Redis, or the bucket's when Redis has none
        if latest is not None:
            try:
                follower.advance_to(latest, wait_s=0)  # staged and applied at once; reported by applied()
            except ChainError:  # --verify-live: the weights read back are not the version's (logged)
                break
        applied = up.applied or applied
        seen = wake.wait_commit(seen, CHECK_S)  # a commit wakes it at once; else a look every CHECK_S
    listener.join(timeout=5)
    with contextlib.suppress(CoordinationError):
        coord.workers.unregister(args.worker_id)
    return 4 if follower.broken is not None else 0


def _report(coord: Coordinator, worker_id: str, applied: Applied) -> None:
    coord.workers.update(
        worker_id, version=applied.version, version_hash=applied.version_hash, digest=applied.weights_digest
    )


if __name__ == "__main__":
    raise SystemExit(main())
