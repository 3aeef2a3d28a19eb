"""The modes of ``aurora bench e2e --world four-regions``: the step loop of `bench.e2e.loop` over the world of
`bench.emulation.regions`, with spot churn.

Each mode that moves weights starts from fresh buckets: the trainer publishes version 0 full at home, it
reaches every region and every actor untimed and around the links, then the loop runs with the seeded churn
schedule. ``ours``: deltas (cut-through at home) through the relay tree; ``star``: the same deltas, every
region fed from home; ``full``: every version full, relayed from home (the full-broadcast baseline);
``direct``: deltas without relays, every actor reading home through its region's link; ``ideal``: actors
hold each version the moment it is published. A joining actor bootstraps from its region's bucket (latest
full plus the deltas after it), or from home through the link in ``direct``; in ``ideal`` at once.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aurora_store.bucket.limits import Limits
from aurora_store.coord.coordinator import Coordinator, RegionAnnouncer
from bench.codec.workload import Workload
from bench.e2e.loop import Churn, Instant, Synced, Timing, VersionBox, Weights, run_steps
from bench.emulation import links
from bench.emulation.phase import CommitOnly, Opener, Tracker, await_relays, final_check, relay_loop, start_thread
from bench.emulation.regions import Regions
from bench.emulation.world import BLOCK_MS, INTRA_CONCURRENCY, INTRA_PART_BYTES, RELAY_OBJECTS
from bench.fleet.churn import Event

if TYPE_CHECKING:
    from actor.updater import Updater
    from relay.worker import Relay

MODES = ("ideal", "ours", "star", "full", "direct")
HOW = {
    "ideal": "actors hold each version the moment the trainer has trained it: no publish, relay, fetch or apply",
    "ours": "deltas published cut-through at home; relays in a tree (gcp-eu fed from eu-west, the rest from home) "
    "copy each version once per region; actors stage while generating and apply at batch boundaries",
    "star": "as ours, but every region's relay copies from home",
    "full": "every version full, relayed from home to every region after its commit (full broadcast); actors "
    "stage the newest full version while generating and apply it at a batch boundary",
    "direct": "deltas without relays: every actor reads home through its region's link (one copy per actor)",
}


def topology(mode: str) -> str | None:
    return {"ours": "tree", "star": "star", "full": "star"}.get(mode)


@dataclass(frozen=True, kw_only=True, slots=True)
class Sizes:
    connections: int
    part_bytes: int
    full_part_bytes: int
    segment_bytes: int
    shard_bytes: int
    verify_live: bool
    timeout_s: float


@dataclass(slots=True)
class _Mode:
    """What one mode opened, closed by ``stack``; the actors and their followers, joiners included."""

    name: str
    world: Regions
    sizes: Sizes
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    stop: threading.Event = field(default_factory=threading.Event)
    tracker: Tracker = field(default_factory=Tracker)
    threads: list[threading.Thread] = field(default_factory=list)
    actors: dict[str, tuple[str, Updater, Synced]] = field(default_factory=dict)
    """actor -> (region, updater, follower)."""
    commits: dict[str, dict[int, float]] = field(default_factory=dict)
    """region -> version -> when the region committed it (its relay's Redis commit)."""
    opener: Opener = field(init=False)

    def __post_init__(self) -> None:
        s = self.sizes
        self.opener = Opener(self.stack, self.world.redis.url, f"e2e4-{self.name}", s.segment_bytes, s.shard_bytes)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)
        self.stack.close()

    def local(self, site: str) -> tuple[str, dict[str, Any]]:
        b = self.world.sites[site]
        return b.uri(self.name), b.options()

    def relay(self, source: str, dest: str, via_link: bool, part_bytes: int) -> Relay:
        from relay.worker import Relay

        if via_link:
            hop = links.hop(source, dest)
            src = self.opener.store(*self.world.via(hop, self.name, self.sizes.connections), self.sizes.connections)
        else:
            src = self.opener.store(*self.local(source), INTRA_CONCURRENCY)
        dst = self.opener.store(*self.local(dest), RELAY_OBJECTS)
        limits = Limits(part_bytes=part_bytes)
        return Relay(src, dst, self.opener.coordinator(), source_region=source, dest_region=dest, limits=limits)

    def updater(self, name: str, region: str, direct: bool, home_local: bool = False) -> tuple[Updater, Coordinator]:
        """An actor of ``region`` reading its region's bucket, or (``direct``) home through the region's link
        (``home_local``: home without the link, for the untimed version 0)."""
        from actor.updater import Updater

        if home_local:
            run = self.opener.run(*self.local(links.HOME), INTRA_CONCURRENCY, INTRA_PART_BYTES)
        elif direct:
            run = self.opener.run(
                *self.world.via(links.hop(links.HOME, region), self.name, self.sizes.connections),
                self.sizes.connections,
                self.sizes.part_bytes,
            )
        else:
            run = self.opener.run(*self.local(region), INTRA_CONCURRENCY, INTRA_PART_BYTES)
        coord = self.opener.coordinator()
        follows = links.HOME if direct else region
        return Updater(run, region=follows, coord=coord, worker_id=name), coord

    def watch_commits(self, region: str) -> None:
        """Record when ``region`` commits each version (a thread until the mode stops)."""
        coord = self.opener.coordinator()
        seen = self.commits.setdefault(region, {})
        after = coord.regions.last_event_id(region)

        def loop() -> None:
            nonlocal after
            while not self.stop.is_set():
                for e in coord.regions.events(region, after, block_ms=BLOCK_MS):
                    after = e.id
                    if e.type == "commit":
                        seen.setdefault(e.version, time.perf_counter())

        self.threads.append(start_thread(f"commits {region}", loop, self.tracker))


def fleet(actors: int) -> dict[str, str]:
    """The starting fleet, ``{actor: region}``."""
    return {f"{r.name}/a{j}": r.name for r in links.regions() for j in range(actors)}


def ideal(actors: int, timing: Timing, events: list[Event]) -> dict[str, Any]:
    box = VersionBox()
    weights: dict[str, Weights] = {name: Instant(box) for name in fleet(actors)}

    def publish(step: int) -> dict[str, Any]:
        box.publish(step)
        return {"version": step}

    def join(actor: str, region: str) -> Weights:
        w = Instant(box)
        w.boundary(0, threading.Event())  # holds the newest version at once
        return w

    return {"how": HOW["ideal"], **run_steps(weights, publish, timing, churn=Churn(events, join))}


def synced(
    mode: str, world: Regions, work: Workload, sizes: Sizes, actors: int, timing: Timing, events: list[Event]
) -> dict[str, Any]:
    """One mode that moves weights: setup (untimed version 0), then the loop with churn; its raw record."""
    full, direct, topo = mode == "full", mode == "direct", topology(mode)
    world.reset()
    m = _Mode(mode, world, sizes)
    try:
        coord = m.opener.coordinator()
        trainer = m.opener.run(*m.local(links.HOME), INTRA_CONCURRENCY, INTRA_PART_BYTES)
        trainer.announcer = CommitOnly(coord, links.HOME) if full else RegionAnnouncer(coord, links.HOME)
        versions = m.stack.enter_context(contextlib.closing(work.versions()))
        _, words = next(versions)
        trainer.publish_words(work.specs, words, kind="full", step=work.steps[0])
        relays: dict[str, Relay] = {}
        if topo is not None:  # version 0 into every region, around the links, parents first
            for name in links.depth_order(topo):
                m.relay(links.source_of(name, topo), name, False, INTRA_PART_BYTES).backfill()
        for actor, region in fleet(actors).items():
            up, c = m.updater(actor, region, direct, home_local=direct)
            m.actors[actor] = (region, up, Synced(up, c, up.region))
        with ThreadPoolExecutor(len(m.actors)) as pool:
            for _ in pool.map(lambda a: a[1].bootstrap(0), m.actors.values()):
                pass
        if direct:  # from here on a direct actor reads home through its region's link
            for actor, (_, up, _) in list(m.actors.items()):
                region = actor.split("/", 1)[0]
                hop = links.hop(links.HOME, region)
                up.run = m.opener.run(*world.via(hop, mode, sizes.connections), sizes.connections, sizes.part_bytes)
                up.run.versions()  # makes its client now, not while the first version is timed
                m.actors[actor] = (region, up, Synced(up, up.coord or m.opener.coordinator(), links.HOME))
        if topo is not None:
            for name in links.depth_order(topo):
                src = links.source_of(name, topo)
                relay = m.relay(src, name, True, sizes.full_part_bytes if full else sizes.part_bytes)
                relay.backfill()  # nothing to copy: makes its clients now, not while a version is timed
                m.threads.append(start_thread(f"relay {name}", relay_loop(relay, m.stop), m.tracker))
                relays[name] = relay
                m.watch_commits(name)
            await_relays(coord, len(relays), m.tracker)
        published: dict[int, float] = {}

        def publish(step: int) -> dict[str, Any]:
            v, words = next(versions)
            assert v == step, (v, step)
            published[v] = time.perf_counter()
            info = trainer.publish_words(work.specs, words, kind="full" if full else "auto", step=work.steps[v])
            return {"version": v, "kind": info.kind, "bytes": info.bytes, "changed": info.changed}

        def join(actor: str, region: str) -> Weights:
            up, c = m.updater(actor, region, direct)
            up.bootstrap(None)  # the region's latest: nearest full plus the deltas after it
            f = Synced(up, c, up.region)
            f.joined_at = time.perf_counter()
            m.actors[actor] = (region, up, f)
            return f

        weights: dict[str, Weights] = {a: f for a, (_, _, f) in m.actors.items()}
        before = world.snapshot()
        start = {n: (rl.stats.versions, rl.stats.bytes) for n, rl in relays.items()}
        t0 = time.perf_counter()
        loop = run_steps(weights, publish, timing, check=m.tracker.check, churn=Churn(events, join))
        wall = time.perf_counter() - t0
        after = world.snapshot()
        relayed = {n: (rl.stats.versions - start[n][0], rl.stats.bytes - start[n][1]) for n, rl in relays.items()}
        gone = {c["actor"] for c in loop.get("churn", ()) if c["kind"] == "preempt"}
        final = []
        last = trainer.manifest(timing.total_steps)
        for actor, (_, up, _) in m.actors.items():
            if actor in gone or up.applied is None:
                continue
            deadline = time.monotonic() + sizes.timeout_s
            while up.applied.version < last.version and time.monotonic() < deadline:  # still on its way: untimed
                m.tracker.check()
                if (up.latest() or 0) >= last.version:
                    up.stage(last.version)
                    up.apply()
                else:
                    time.sleep(0.05)
            final.append(final_check(actor, up, trainer.manifest(up.applied.version), sizes.verify_live))
        for name in relays:  # every region holds the last version (its actors do): the links are settled
            while (rv := coord.regions.version(name)) is None or rv.version < last.version:
                m.tracker.check()
                time.sleep(0.05)
        settled = world.snapshot()
        m.tracker.check()
        return {
            "how": HOW[mode],
            **loop,
            "wall_s": wall,
            "published_at": published,
            "followers": {a: (r, f) for a, (r, _, f) in m.actors.items() if a not in gone},
            "commits": m.commits,
            "relayed": relayed,
            "before": before,
            "after": after,
            "settled": settled,
            "payload_bytes": sum(st["bytes"] for st in loop["steps"]),
            "final": final,
            "bit_exact": all(f["bit_exact"] for f in final),
        }
    finally:
        m.close()


def run_all(
    modes: tuple[str, ...],
    world_factory: Callable[[], Regions],
    work: Workload,
    sizes: Sizes,
    actors: int,
    timing: Timing,
    events: list[Event],
    tick: Callable[[str], None],
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    world: Regions | None = None
    for mode in modes:
        tick(f"{mode}: {timing.total_steps} steps")
        t0 = time.perf_counter()
        if mode == "ideal":
            out[mode] = ideal(actors, timing, events)
        else:
            world = world or world_factory()
            out[mode] = synced(mode, world, work, sizes, actors, timing, events)
        out[mode]["seconds"] = time.perf_counter() - t0
    return out
