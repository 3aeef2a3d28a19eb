"""One benchmark phase in the emulated world: the trainer, relays and actors as threads, and when
each actor applied each version."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aurora_store.bucket.limits import Limits
from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.bucket.run import Run, open_run
from aurora_store.coord.coordinator import Coordinator, RegionAnnouncer
from aurora_store.format.manifest import Manifest
from bench.emulation.world import (
    BLOCK_MS,
    INTRA_CONCURRENCY,
    INTRA_PART_BYTES,
    RELAY_OBJECTS,
    BenchError,
    Config,
    Region,
    World,
    s3_options,
)
from relay.worker import Relay

if TYPE_CHECKING:
    from actor.updater import Updater


class Tracker:
    """When each actor applied each version, and the first failure of any relay or actor thread."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._applied: dict[str, dict[int, tuple[float, float]]] = {}
        self._error: tuple[str, BaseException] | None = None

    def expect(self, actor: str) -> None:
        with self._cond:
            self._applied[actor] = {}

    def applied(self, actor: str, version: int, seen: float, done: float) -> None:
        """``actor`` learned of ``version`` at ``seen`` (the region had committed it) and applied it at ``done``."""
        with self._cond:
            self._applied[actor][version] = (seen, done)
            self._cond.notify_all()

    def failed(self, who: str, exc: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = (who, exc)
            self._cond.notify_all()

    def check(self) -> None:
        if self._error is not None:
            who, exc = self._error
            raise BenchError(f"{who} failed: {type(exc).__name__}: {exc}") from exc

    def wait(self, version: int, timeout_s: float) -> dict[str, tuple[float, float]]:
        """Every actor's (seen, applied) times of ``version``; raises on any thread's failure or the timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                self.check()
                if all(version in d for d in self._applied.values()):
                    return {a: d[version] for a, d in self._applied.items()}
                left = deadline - time.monotonic()
                if left <= 0:
                    late = sorted(a for a, d in self._applied.items() if version not in d)
                    raise BenchError(f"version {version} did not reach {late} within {timeout_s:.0f} s")
                self._cond.wait(left)


def start_thread(name: str, fn: Callable[[], None], tracker: Tracker) -> threading.Thread:
    def body() -> None:
        try:
            fn()
        except BaseException as exc:  # reported to the main thread, which raises it
            tracker.failed(name, exc)

    t = threading.Thread(target=body, name=name, daemon=True)
    t.start()
    return t


def follow(
    name: str, up: Updater, coord: Coordinator, region: str, stop: threading.Event, tracker: Tracker, reload: bool
) -> None:
    """An actor's sync loop: wake on the region's events, load what is newer, report when applied."""
    after = coord.regions.last_event_id(region)
    while not stop.is_set():
        events = coord.regions.events(region, after, block_ms=BLOCK_MS)
        if events:
            after = events[-1].id
        latest = up.latest()
        assert up.applied is not None
        if latest is None or latest <= up.applied.version:
            continue
        seen = time.perf_counter()
        if reload:
            from actor.live import TensorWeights

            up.live = TensorWeights(device=up.device)  # drop the old copy first: one model per actor, not two
            up.bootstrap(latest)
        else:
            up.stage(latest)
            up.apply()
        tracker.applied(name, latest, seen, time.perf_counter())


class CommitOnly:
    """An announcer that commits a version in Redis without announcing its objects: relays copy a full
    version after its commit with all their connections, where announced objects are copied one by one."""

    def __init__(self, coord: Coordinator, region: str) -> None:
        self._announcer = RegionAnnouncer(coord, region)

    def segment(self, version: int, entry: Any) -> None:
        pass

    def commit(self, manifest: Manifest) -> None:
        self._announcer.commit(manifest)


@dataclass(slots=True)
class Opener:
    """The clients one mode of a bench world opens, each closed by ``stack``: coordinators of one Redis
    run id, runs with the mode's segment and shard sizes, object stores."""

    stack: contextlib.ExitStack
    redis_url: str
    run_id: str
    segment_bytes: int
    shard_bytes: int

    def coordinator(self) -> Coordinator:
        c = Coordinator(self.redis_url, self.run_id)
        self.stack.callback(c.close)
        return c

    def run(self, uri: str, options: dict[str, Any], concurrency: int, part_bytes: int) -> Run:
        r = open_run(
            uri,
            storage_options=options,
            concurrency=concurrency,
            segment_bytes=self.segment_bytes,
            shard_bytes=self.shard_bytes,
            limits=Limits(part_bytes=part_bytes),
        )
        self.stack.callback(r.close)
        return r

    def store(self, uri: str, options: dict[str, Any], concurrency: int) -> ObjectStore:
        s = ObjectStore(uri, options, concurrency=concurrency)
        self.stack.callback(s.close)
        return s


class Phase:
    """Everything one mode opens (clients, coordinators, threads), closed in the right order by ``close``."""

    def __init__(self, mode: str, world: World, cfg: Config) -> None:
        self.mode, self.world, self.cfg = mode, world, cfg
        self.stack = contextlib.ExitStack()
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.tracker = Tracker()
        self.opener = Opener(self.stack, world.redis.url, f"transfer-{mode}", cfg.segment_bytes, cfg.shard_bytes)

    def close(self) -> None:
        """Stop and join the threads first, then close what they were using."""
        self.stop.set()
        for t in self.threads:
            t.join(30)
        self.stack.close()

    def start(self, name: str, fn: Callable[[], None]) -> None:
        self.threads.append(start_thread(name, fn, self.tracker))

    def home_via(self, r: Region) -> tuple[str, dict[str, Any]]:
        """Home's run, as seen from region ``r``: through its link."""
        n = self.cfg.connections
        return self.world.home_uri(self.mode), s3_options(self.world.home, 2 * n, r.proxy.endpoint)

    def home_direct(self) -> tuple[str, dict[str, Any]]:
        """Home's run without a link: for the trainer, and for version 0, which is distributed untimed."""
        return self.world.home_uri(self.mode), s3_options(self.world.home, 64)

    def relay(self, r: Region, part_bytes: int, *, via_link: bool = True) -> Relay:
        if via_link:
            src = self.opener.store(*self.home_via(r), self.cfg.connections)
        else:
            src = self.opener.store(*self.home_direct(), INTRA_CONCURRENCY)
        dst = self.opener.store(self.world.region_uri(r, self.mode), s3_options(r.server, 64), RELAY_OBJECTS)
        limits = Limits(part_bytes=part_bytes)
        return Relay(src, dst, self.opener.coordinator(), source_region="home", dest_region=r.name, limits=limits)


@dataclass(slots=True)
class Actor:
    name: str
    region: str
    """The region whose Redis version and events it follows ("home" for a direct actor)."""
    updater: Updater
    coord: Coordinator


def bootstrap(phase: Phase) -> tuple[list[Actor], dict[str, float]]:
    """Version 0 everywhere, untimed and around the links (only timed versions cross them): relays backfill
    it into every region, then every actor loads it."""
    from actor.updater import Updater

    world, cfg, mode = phase.world, phase.cfg, phase.mode
    direct = mode == "delta_direct"
    boot: dict[str, float] = {}
    t0 = time.perf_counter()
    if not direct:
        relays = [phase.relay(r, INTRA_PART_BYTES, via_link=False) for r in world.regions]
        with ThreadPoolExecutor(len(relays)) as pool:
            for _ in pool.map(Relay.backfill, relays):
                pass
        boot["relays_s"] = time.perf_counter() - t0
    actors: list[Actor] = []
    for r in world.regions:
        for j in range(cfg.actors):
            if direct:
                run = phase.opener.run(*phase.home_direct(), INTRA_CONCURRENCY, INTRA_PART_BYTES)
            else:
                region = world.region_uri(r, mode), s3_options(r.server, 64)
                run = phase.opener.run(*region, INTRA_CONCURRENCY, INTRA_PART_BYTES)
            coord = phase.opener.coordinator()
            follows = "home" if direct else r.name
            name = f"{r.name}/a{j}"
            actors.append(Actor(name, follows, Updater(run, region=follows, coord=coord, worker_id=name), coord))
    t1 = time.perf_counter()
    with ThreadPoolExecutor(len(actors)) as pool:
        for _ in pool.map(lambda a: a.updater.bootstrap(0), actors):
            pass
    boot["actors_s"] = time.perf_counter() - t1
    for a in actors:  # the steady state: what a load starts in the background (rank indexes) is done
        warmed = getattr(a.updater.live, "warmed", None)
        if warmed is not None and not warmed(120):
            raise BenchError(f"actor {a.name}: its rank indexes were not built in 120 s")
    boot["actors_warm_s"] = time.perf_counter() - t1
    if direct:  # from here on a direct actor reads home through its link, in parts of part_bytes as relays do
        for a, r in zip(actors, [r for r in world.regions for _ in range(cfg.actors)], strict=True):
            a.updater.run = phase.opener.run(*phase.home_via(r), cfg.connections, cfg.part_bytes)
            a.updater.run.versions()  # makes its client now, not while the first version is timed
    return actors, boot


def relay_loop(rl: Relay, stop: threading.Event) -> Callable[[], None]:
    return lambda: rl.run(stop, block_ms=BLOCK_MS, rescan_s=1e9)


def bind_follow(a: Actor, stop: threading.Event, tracker: Tracker, reload: bool) -> Callable[[], None]:
    return lambda: follow(a.name, a.updater, a.coord, a.region, stop, tracker, reload)


def await_relays(coord: Coordinator, count: int, tracker: Tracker, timeout_s: float = 60.0) -> None:
    """Until every relay has caught up with its startup backfill and serves events (its registration
    says ``serving``): a version published earlier would be timed through that backfill's listings."""
    deadline = time.monotonic() + timeout_s
    while sum(w["role"] == "relay" and w.get("serving") is True for w in coord.workers.registrations().values()) < (
        count
    ):
        tracker.check()
        if time.monotonic() > deadline:
            raise BenchError(f"relays did not start within {timeout_s:.0f} s")
        time.sleep(0.01)


def final_check(name: str, up: Updater, manifest: Manifest, verify_live: bool) -> dict[str, Any]:
    """Each actor must hold the last version, bit for bit: its digest against the trainer's manifest."""
    applied = up.applied
    assert applied is not None
    live = up.live_digest() if verify_live else None
    ok = (applied.version, applied.weights_digest) == (manifest.version, manifest.weights_digest)
    return {
        "actor": name,
        "version": applied.version,
        "weights_digest": applied.weights_digest,
        "live_digest": live,
        "manifest_digest": manifest.weights_digest,
        "bit_exact": ok and (live is None or live == manifest.weights_digest),
    }
