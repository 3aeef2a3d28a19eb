"""``aurora bench transfer``: time from a trainer's step to the weights applied in every region, over emulated WANs.

Home and three regions each run an S3 server (moto) on loopback; every cross-region read goes through
a `bench.wan.WanProxy` link (its own process) in front of home's server; Redis is the embedded server.
On the same reference trace, three modes: deltas through relays (cut-through), full versions through
relays, and deltas read by every actor straight from home. Also: fetch throughput over one link with
1 vs N connections, bytes that cross each link per version, and the cut-through publish check
(publish time against max and sum of extraction and upload). Emulation, not a WAN: the JSON says so.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from aurora_store.coord import Coordinator, RegionAnnouncer
from aurora_store.delta import DeltaBuilder, SealedObject
from aurora_store.digest import Digest, tensor_keys
from aurora_store.embedded_redis import EmbeddedRedis
from aurora_store.limits import Limits
from aurora_store.manifest import Manifest, TensorSpec
from aurora_store.objectstore import ObjectStore, RangeRequest
from aurora_store.run import Run, VersionInfo, open_run
from bench.output import emit, overridden, positive
from bench.s3 import S3Server, peak_rss_mb, start_moto
from bench.wan import Link, WanProxy, describe
from relay.worker import Relay

if TYPE_CHECKING:
    from actor.updater import Updater

MIB = 2**20
MODES = ("delta_relay", "full_relay", "delta_direct")
INTRA_PART_BYTES = 1 << 30
"""Reads inside a region fetch each object in one GET: no per-connection cap to beat there, and moto
reads a whole object to serve any range of it, so parts would only multiply its work."""
INTRA_CONCURRENCY = 8
"""Objects a reader fetches at once from its own region's server."""
RELAY_OBJECTS = 16
"""Objects a relay copies at once when it copies a committed version (each in parts across the link)."""
BLOCK_MS = 200
"""How long relays and actors block on Redis per wait; bounds how long they take to stop."""
TARGETS = {"link_bytes_per_delta": 1.1, "fetch_fraction": 0.85, "delta_vs_full": 20.0}


class BenchError(RuntimeError):
    """A relay or actor failed, or a version did not reach every actor in time."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    """One benchmark run: workload, links, actors and I/O sizes."""

    layers: int = 28
    """Decoder layers of the Qwen3-0.6B-shaped trace."""
    vocab: int | None = None
    """Embedding rows; None for Qwen3's 151936."""
    seed: int = 0
    first_step: int = 3
    """Trace step published as version 0 (Adam's moments have warmed up past it); later steps follow."""
    versions: int = 3
    """Timed versions per mode, after the untimed version 0."""
    rtts_s: tuple[float, ...] = (0.04, 0.09, 0.15)
    """One region per link to home, by round-trip time."""
    bandwidth_bps: float | None = 1e9
    """Each link's capacity per direction, shared by all its connections."""
    loss: float = 1e-4
    """Packet loss of each link: sets the Mathis per-connection cap."""
    jitter_frac: float = 0.025
    """Jitter as a fraction of each link's RTT."""
    connect_rtts: float = 0.0
    """Round trips charged per new connection. moto closes every connection after one response, where
    S3 clients keep theirs alive, so charging a handshake per request would overstate every GET."""
    actors: int = 2
    """Actors per region."""
    connections: int = 64
    """Parallel ranged GETs of a reader across a link (relays, direct actors, the N-connection fetch)."""
    part_bytes: int = 1 * MIB
    """Ranged-GET size for delta segments read across a link."""
    full_part_bytes: int = 16 * MIB
    """Ranged-GET size for full versions read across a link. moto serves each range by reading the whole
    object, one request at a time per object, and the embedding is one ~311 MB object: smaller parts would
    cost moto more than they gain on the link."""
    segment_bytes: int = 4 * MIB
    """Target size of a delta segment."""
    shard_bytes: int = 16 * MIB
    """Target size of a full version's shard (a tensor never splits: the embedding is one object)."""
    fetch_bytes: int = 128 * MIB
    """Bytes the fetch-throughput check reads through the first link, in objects of ``fetch_object_bytes``."""
    fetch_object_bytes: int = 4 * MIB
    modes: tuple[str, ...] = MODES
    version_timeout_s: float = 1800.0
    """Longest wait for one version to reach every actor before the run fails."""
    verify_live: bool = True
    """Also recompute every actor's weights digest from its live tensors at the end (O(model))."""

    def links(self) -> list[tuple[str, Link]]:
        return [
            (
                f"r{i + 1}-{round(rtt * 1000)}ms",
                Link(
                    rtt_s=rtt,
                    jitter_s=rtt * self.jitter_frac,
                    bandwidth_bps=self.bandwidth_bps,
                    loss=self.loss,
                    connect_rtts=self.connect_rtts,
                ),
            )
            for i, rtt in enumerate(self.rtts_s)
        ]


FULL = Config()
QUICK = Config(layers=2, vocab=16384, versions=2, fetch_bytes=64 * MIB, full_part_bytes=2 * MIB)
"""A full quick version is ~100 MB in a few shards: 2 MiB parts keep enough of them in flight to fill a link."""


# ---------------------------------------------------------------- workload


@dataclass(slots=True)
class Workload:
    """The trace's bits at version 0, and for each later version the elements that changed.

    One copy of the model: `versions` moves it forward in place and back when the iteration ends."""

    specs: tuple[TensorSpec, ...]
    words: dict[str, np.ndarray]
    """Flat BF16 words of version 0 (of a later version while `versions` is being iterated)."""
    diffs: list[dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]]
    """Per version from 1 on: name -> (flat positions, old words, new words)."""
    steps: list[int]
    """Trace step of each version."""

    @property
    def full_bytes(self) -> int:
        return sum(a.nbytes for a in self.words.values())

    def versions(self) -> Generator[tuple[int, dict[str, np.ndarray]], None, None]:
        """``(version, words)`` from 0 on; ``words`` is `words`, moved forward in place (publish a version
        before taking the next), and back to version 0 when the iterator is closed. One at a time."""
        done = 0
        try:
            yield 0, self.words
            for diff in self.diffs:
                for name, (pos, _, new) in diff.items():
                    self.words[name][pos] = new
                done += 1
                yield done, self.words
        finally:
            for diff in reversed(self.diffs[:done]):
                for name, (pos, old, _) in diff.items():
                    self.words[name][pos] = old


def make_workload(
    layers: int, vocab: int | None, seed: int, first_step: int, versions: int, tick: Callable[[], None]
) -> Workload:
    """Run the trace, keeping only BF16 bits (the optimizer is gone when this returns)."""
    from bench import trace  # torch loads here, not when the CLI parses its arguments

    base: dict[str, np.ndarray] = {}
    prev: dict[str, np.ndarray] = {}
    specs: tuple[TensorSpec, ...] = ()
    diffs: list[dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]] = []
    for step, bits in trace.steps(layers, first_step + versions, seed, vocab=vocab):
        tick()
        flat = {k: a.reshape(-1) for k, a in bits.items()}
        if step == first_step:
            base = flat
            specs = tuple(sorted((TensorSpec(k, "BF16", a.shape) for k, a in bits.items()), key=lambda s: s.name))
        elif step > first_step:
            diff = {}
            for k, a in flat.items():
                pos = np.flatnonzero(prev[k] != a)
                if pos.size:
                    diff[k] = (pos, prev[k][pos], a[pos])
            diffs.append(diff)
        prev = flat
    return Workload(specs, base, diffs, list(range(first_step, first_step + versions + 1)))


# ---------------------------------------------------------------- the emulated world


def serve_proxy() -> None:
    """Child-process side of `_ProxyProcess`: one JSON line in (target, link), then ``stats`` requests."""
    spec = json.loads(sys.stdin.readline())
    with WanProxy(spec["host"], spec["port"], Link(**spec["link"]), seed=spec["seed"]) as proxy:
        print(json.dumps({"port": proxy.port}), flush=True)
        for line in sys.stdin:
            if line.strip() != "stats":
                break
            print(json.dumps(proxy.stats()), flush=True)


class _ProxyProcess:
    """A `WanProxy` in a child process, so that the link's timing never waits on this process's GIL."""

    def __init__(self, target: S3Server, link: Link, seed: int) -> None:
        self.link = link
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(
            [sys.executable, "-c", "from bench.transfer import serve_proxy; serve_proxy()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            spec = {"host": target.host, "port": target.port, "link": dataclasses.asdict(link), "seed": seed}
            self.port = int(self._ask(json.dumps(spec))["port"])
        except BaseException:
            self.stop()
            raise

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _ask(self, line: str) -> dict[str, Any]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        with self._lock:
            self._proc.stdin.write(line + "\n")
            self._proc.stdin.flush()
            reply = self._proc.stdout.readline()
        if not reply:
            raise BenchError(f"WAN proxy process exited (status {self._proc.poll()})")
        out: dict[str, Any] = json.loads(reply)
        return out

    def stats(self) -> dict[str, Any]:
        return self._ask("stats")

    def peak_rss_mb(self) -> float | None:
        return peak_rss_mb(self._proc.pid)

    def stop(self) -> None:
        """Close the proxy (its stdin) and wait for the process; idempotent."""
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(10)
        if self._proc.stdout is not None:
            self._proc.stdout.close()


@dataclass(slots=True)
class _Region:
    name: str
    link: Link
    server: S3Server
    proxy: _ProxyProcess
    bucket: str = ""


def _options(server: S3Server, connections: int, endpoint: str | None = None) -> dict[str, Any]:
    """s3fs options: a client of its own (as a separate process would have) with ``connections`` sockets."""
    return {
        **server.options(endpoint),
        "config_kwargs": {"max_pool_connections": connections, "read_timeout": 300},
        "skip_instance_cache": True,
    }


class _World:
    """Home and the regions: an S3 server each, a WAN link from each region to home, and Redis."""

    def __init__(self, cfg: Config, stack: contextlib.ExitStack) -> None:
        self.cfg = cfg
        links = cfg.links()
        with ThreadPoolExecutor(len(links) + 1) as pool:
            futures = [pool.submit(start_moto) for _ in range(len(links) + 1)]
        for f in futures:  # every server that started is stopped, even if another failed to
            if f.exception() is None:
                stack.callback(f.result().stop)
        servers = [f.result() for f in futures]
        self.home = servers[0]
        self.home_bucket = ""
        self.regions: list[_Region] = []
        for i, ((name, link), server) in enumerate(zip(links, servers[1:], strict=True)):
            proxy = _ProxyProcess(self.home, link, seed=cfg.seed + i)
            stack.callback(proxy.stop)
            self.regions.append(_Region(name, link, server, proxy))
        self.redis = EmbeddedRedis()
        stack.callback(self.redis.close)

    def reset(self) -> None:
        """Drop every object of the last phase (moto keeps them in memory or temp files) and make buckets."""
        for s in (self.home, *(r.server for r in self.regions)):
            s.reset()
        self.home_bucket = self.home.new_bucket()
        for r in self.regions:
            r.bucket = r.server.new_bucket()

    def home_uri(self, name: str) -> str:
        return f"s3://{self.home_bucket}/runs/{name}"

    def region_uri(self, r: _Region, name: str) -> str:
        return f"s3://{r.bucket}/runs/{name}"

    def snapshot(self) -> dict[str, Any]:
        """Bytes each link has carried so far, and CPU seconds every process of the benchmark has used."""
        pids = [self.home.process.pid, *(r.server.process.pid for r in self.regions)]
        pids += [r.proxy.pid for r in self.regions]
        return {"links": {r.name: r.proxy.stats() for r in self.regions}, "cpu_s": _cpu_seconds(pids)}


# ---------------------------------------------------------------- threads


class _Tracker:
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


def _start(name: str, fn: Callable[[], None], tracker: _Tracker) -> threading.Thread:
    def body() -> None:
        try:
            fn()
        except BaseException as exc:  # reported to the main thread, which raises it
            tracker.failed(name, exc)

    t = threading.Thread(target=body, name=name, daemon=True)
    t.start()
    return t


def _follow(
    name: str, up: Updater, coord: Coordinator, region: str, stop: threading.Event, tracker: _Tracker, reload: bool
) -> None:
    """An actor's sync loop: wake on the region's events, load what is newer, report when applied."""
    after = coord.last_event_id(region)
    while not stop.is_set():
        events = coord.events(region, after, block_ms=BLOCK_MS)
        if events:
            after = events[-1].id
        latest = up.latest()
        assert up.held is not None
        if latest is None or latest <= up.held.version:
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


class _CommitOnly:
    """An announcer that commits a version in Redis without announcing its objects: relays copy a full
    version after its commit with all their connections, where announced objects are copied one by one."""

    def __init__(self, coord: Coordinator, region: str) -> None:
        self._announcer = RegionAnnouncer(coord, region)

    def segment(self, version: int, entry: Any) -> None:
        pass

    def commit(self, manifest: Manifest) -> None:
        self._announcer.commit(manifest)


# ---------------------------------------------------------------- one mode


class _Phase:
    """Everything one mode opens (clients, coordinators, threads), closed in the right order by ``close``."""

    def __init__(self, mode: str, world: _World, cfg: Config) -> None:
        self.mode, self.world, self.cfg = mode, world, cfg
        self.stack = contextlib.ExitStack()
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.tracker = _Tracker()

    def close(self) -> None:
        """Stop and join the threads first, then close what they were using."""
        self.stop.set()
        for t in self.threads:
            t.join(30)
        self.stack.close()

    def start(self, name: str, fn: Callable[[], None]) -> None:
        self.threads.append(_start(name, fn, self.tracker))

    def coordinator(self) -> Coordinator:
        c = Coordinator(self.world.redis.url, f"transfer-{self.mode}")
        self.stack.callback(c.close)
        return c

    def run(self, uri: str, options: dict[str, Any], concurrency: int, part_bytes: int) -> Run:
        r = open_run(
            uri,
            storage_options=options,
            concurrency=concurrency,
            segment_bytes=self.cfg.segment_bytes,
            shard_bytes=self.cfg.shard_bytes,
            limits=Limits(part_bytes=part_bytes),
        )
        self.stack.callback(r.close)
        return r

    def store(self, uri: str, options: dict[str, Any], concurrency: int) -> ObjectStore:
        s = ObjectStore(uri, options, concurrency=concurrency)
        self.stack.callback(s.close)
        return s

    def home_via(self, r: _Region) -> tuple[str, dict[str, Any]]:
        """Home's run, as seen from region ``r``: through its link."""
        n = self.cfg.connections
        return self.world.home_uri(self.mode), _options(self.world.home, 2 * n, r.proxy.endpoint)

    def home_direct(self) -> tuple[str, dict[str, Any]]:
        """Home's run without a link: for the trainer, and for version 0, which is distributed untimed."""
        return self.world.home_uri(self.mode), _options(self.world.home, 64)

    def relay(self, r: _Region, part_bytes: int, *, via_link: bool = True) -> Relay:
        if via_link:
            src = self.store(*self.home_via(r), self.cfg.connections)
        else:
            src = self.store(*self.home_direct(), INTRA_CONCURRENCY)
        dst = self.store(self.world.region_uri(r, self.mode), _options(r.server, 64), RELAY_OBJECTS)
        limits = Limits(part_bytes=part_bytes)
        return Relay(src, dst, self.coordinator(), source_region="home", dest_region=r.name, limits=limits)


@dataclass(slots=True)
class _Actor:
    name: str
    region: str
    """The region whose Redis version and events it follows ("home" for a direct actor)."""
    updater: Updater
    coord: Coordinator


def _run_mode(mode: str, world: _World, work: Workload, cfg: Config, tick: Callable[[str], None]) -> dict[str, Any]:
    """Version 0 everywhere (untimed), then ``cfg.versions`` timed versions; returns the mode's record."""
    world.reset()
    full = mode == "full_relay"
    phase = _Phase(mode, world, cfg)
    try:
        coord = phase.coordinator()
        trainer = phase.run(*phase.home_direct(), INTRA_CONCURRENCY, INTRA_PART_BYTES)
        trainer.announcer = _CommitOnly(coord, "home") if full else RegionAnnouncer(coord, "home")
        versions = phase.stack.enter_context(contextlib.closing(work.versions()))
        _, words = next(versions)
        tick(f"{mode}: version 0")
        v0 = trainer.publish_words(work.specs, words, kind="full", step=work.steps[0])
        actors, boot = _bootstrap(phase)

        # the steady state: relays stream, actors follow
        part_bytes = cfg.full_part_bytes if full else cfg.part_bytes
        if mode != "delta_direct":
            for r in world.regions:
                relay = phase.relay(r, part_bytes)
                relay.backfill()  # nothing to copy: makes its clients now, not while the first version is timed
                phase.start(f"relay {r.name}", _relay_loop(relay, phase.stop))
            _await_relays(coord, len(world.regions), phase.tracker)
        for a in actors:
            phase.tracker.expect(a.name)
            phase.start(f"actor {a.name}", _bind_follow(a, phase.stop, phase.tracker, reload=full))

        records = []
        last: VersionInfo = v0
        for v, words in versions:
            if v > cfg.versions:
                break
            tick(f"{mode}: version {v}")
            before = world.snapshot()
            t_step = time.perf_counter()  # the trainer's step has ended: publishing starts now
            last = trainer.publish_words(work.specs, words, kind="full" if full else "delta", step=work.steps[v])
            published = time.perf_counter()
            applied = phase.tracker.wait(v, cfg.version_timeout_s)
            after = world.snapshot()
            records.append(_version_record(v, work.steps[v], last, t_step, published, applied, before, after))
        manifest = trainer.manifest(last.version)
        final = [_final_check(a.name, a.updater, manifest, cfg.verify_live) for a in actors]
        phase.tracker.check()
    finally:
        phase.close()
    return _mode_record(mode, v0, records, final, boot, part_bytes, len(manifest.to_bytes()))


def _bootstrap(phase: _Phase) -> tuple[list[_Actor], dict[str, float]]:
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
    actors: list[_Actor] = []
    for r in world.regions:
        for j in range(cfg.actors):
            if direct:
                run = phase.run(*phase.home_direct(), INTRA_CONCURRENCY, INTRA_PART_BYTES)
            else:
                region = world.region_uri(r, mode), _options(r.server, 64)
                run = phase.run(*region, INTRA_CONCURRENCY, INTRA_PART_BYTES)
            coord = phase.coordinator()
            follows = "home" if direct else r.name
            name = f"{r.name}/a{j}"
            actors.append(_Actor(name, follows, Updater(run, region=follows, coord=coord, worker_id=name), coord))
    t1 = time.perf_counter()
    with ThreadPoolExecutor(len(actors)) as pool:
        for _ in pool.map(lambda a: a.updater.bootstrap(0), actors):
            pass
    boot["actors_s"] = time.perf_counter() - t1
    if direct:  # from here on a direct actor reads home through its link, in parts of part_bytes as relays do
        for a, r in zip(actors, [r for r in world.regions for _ in range(cfg.actors)], strict=True):
            a.updater.run = phase.run(*phase.home_via(r), cfg.connections, cfg.part_bytes)
            a.updater.run.versions()  # makes its client now, not while the first version is timed
    return actors, boot


def _relay_loop(rl: Relay, stop: threading.Event) -> Callable[[], None]:
    return lambda: rl.run(stop, block_ms=BLOCK_MS, rescan_s=1e9)


def _bind_follow(a: _Actor, stop: threading.Event, tracker: _Tracker, reload: bool) -> Callable[[], None]:
    return lambda: _follow(a.name, a.updater, a.coord, a.region, stop, tracker, reload)


def _await_relays(coord: Coordinator, count: int, tracker: _Tracker, timeout_s: float = 60.0) -> None:
    """Until every relay has registered (it then reads the event stream from that point on)."""
    deadline = time.monotonic() + timeout_s
    while sum(w["role"] == "relay" for w in coord.workers().values()) < count:
        tracker.check()
        if time.monotonic() > deadline:
            raise BenchError(f"relays did not start within {timeout_s:.0f} s")
        time.sleep(0.01)


def _version_record(
    version: int,
    step: int,
    info: VersionInfo,
    t_step: float,
    published: float,
    applied: dict[str, tuple[float, float]],
    before: dict[str, Any],
    after: dict[str, Any],
) -> dict[str, Any]:
    per_region: dict[str, float] = {}
    seen: dict[str, float] = {}
    for actor, (at_seen, at_done) in applied.items():
        region = actor.split("/", 1)[0]
        per_region[region] = max(per_region.get(region, 0.0), at_done - t_step)
        seen[region] = min(seen.get(region, math.inf), at_seen - t_step)
    slowest = max(per_region.values())
    links_before, links_after = before["links"], after["links"]
    cpu = after["cpu_s"] - before["cpu_s"] if after["cpu_s"] is not None and before["cpu_s"] is not None else None
    return {
        "version": version,
        "step": step,
        "kind": info.kind,
        "bytes": info.bytes,
        "changed": info.changed,
        "density": info.density,
        "publish_s": published - t_step,
        "per_region_s": per_region,
        "slowest_s": slowest,
        "region_has_it_s": seen,
        "per_actor_s": {a: done - t_step for a, (_, done) in sorted(applied.items())},
        "link_bytes_down": {r: links_after[r]["bytes_down"] - links_before[r]["bytes_down"] for r in links_after},
        "link_bytes_up": {r: links_after[r]["bytes_up"] - links_before[r]["bytes_up"] for r in links_after},
        "cpu_s": cpu,
        "cpu_busy_cores": cpu / slowest if cpu is not None else None,
    }


def _final_check(name: str, up: Updater, manifest: Manifest, verify_live: bool) -> dict[str, Any]:
    """Each actor must hold the last version, bit for bit: its digest against the trainer's manifest."""
    held = up.held
    assert held is not None
    live = up.live_digest() if verify_live else None
    ok = (held.version, held.weights_digest) == (manifest.version, manifest.weights_digest)
    return {
        "actor": name,
        "version": held.version,
        "weights_digest": held.weights_digest,
        "live_digest": live,
        "manifest_digest": manifest.weights_digest,
        "bit_exact": ok and (live is None or live == manifest.weights_digest),
    }


def _cpu_seconds(pids: list[int]) -> float | None:
    """User + system CPU seconds of this process (every thread) and of ``pids`` (Linux; None elsewhere)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    total = me.ru_utime + me.ru_stime
    tick = os.sysconf("SC_CLK_TCK")
    try:
        for pid in pids:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    except (OSError, IndexError, ValueError):
        return None
    return total


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _mode_record(
    mode: str,
    v0: VersionInfo,
    records: list[dict[str, Any]],
    final: list[dict[str, Any]],
    boot: dict[str, float],
    part_bytes: int,
    manifest_bytes: int,
) -> dict[str, Any]:
    regions = list(records[0]["per_region_s"]) if records else []
    how = {
        "delta_relay": "trainer publishes deltas, announcing each segment (cut-through); a relay per region "
        "copies it home->region as it appears; actors stage from their region's bucket and apply",
        "full_relay": "trainer publishes every version full; relays copy it after its commit; each actor drops "
        "its weights and bootstraps the new full version (no second staged copy)",
        "delta_direct": "no relays: every actor reads deltas from home through its region's link, stages, applies",
    }[mode]
    return {
        "how": how,
        "version0_bytes": v0.bytes,
        "bootstrap_s": boot,
        "cross_link_part_bytes": part_bytes,
        "manifest_bytes": manifest_bytes,
        "versions": records,
        "time_to_apply_s": _mean([r["slowest_s"] for r in records]),
        "per_region_s": {g: _mean([r["per_region_s"][g] for r in records]) for g in regions},
        "region_has_it_s": {g: _mean([r["region_has_it_s"][g] for r in records]) for g in regions},
        "link_bytes_per_version": {g: _mean([r["link_bytes_down"][g] for r in records]) for g in regions},
        "publish_s": _mean([r["publish_s"] for r in records]),
        "cpu_busy_cores": _mean([r["cpu_busy_cores"] for r in records if r["cpu_busy_cores"] is not None]),
        "payload_bytes": _mean([r["bytes"] for r in records]),
        "final": final,
        "bit_exact": all(f["bit_exact"] for f in final),
    }


# ---------------------------------------------------------------- fetch throughput, publish check


def _fetch_throughput(world: _World, cfg: Config) -> dict[str, Any]:
    """The same objects from home through one link: one connection, whole objects one after another,
    then ``connections`` ranged GETs at once (the objects cut into as many equal parts)."""
    r = world.regions[0]
    size = cfg.fetch_object_bytes
    count = max(1, cfg.fetch_bytes // size)
    keys = [f"fetch/{i:05d}" for i in range(count)]
    rng = np.random.default_rng(cfg.seed)
    with contextlib.ExitStack() as stack:
        home = ObjectStore(world.home_uri("fetch"), _options(world.home, 16), concurrency=8)
        stack.callback(home.close)
        for _ in home.map(lambda k: home.put_if_absent(k, rng.bytes(size)), keys):
            pass
        total = count * size
        seconds = {}
        requests: dict[str, int] = {}
        for label, n in (("1", 1), ("N", cfg.connections)):
            s = ObjectStore(world.home_uri("fetch"), _options(world.home, n, r.proxy.endpoint), concurrency=n)
            stack.callback(s.close)
            s.get_range(RangeRequest(keys[0], 0, 1))  # the client's one-time setup, untimed
            part = size if n == 1 else max(1, math.ceil(total / n))
            reqs = [RangeRequest(k, lo, min(lo + part, size)) for k in keys for lo in range(0, size, part)]
            requests[label] = len(reqs)
            t0 = time.perf_counter()
            got = sum(len(b) for b in s.map(s.get_range, reqs))
            seconds[label] = time.perf_counter() - t0
            if got != total:
                raise BenchError(f"fetch through {r.name}: got {got} bytes, expected {total}")
        # what serving that many requests costs moto and this client with no link and no bytes (both are
        # Python, with a GIL each): time the N-connection fetch spends before every request has started
        direct = ObjectStore(
            world.home_uri("fetch"), _options(world.home, cfg.connections), concurrency=cfg.connections
        )
        stack.callback(direct.close)
        direct.get_range(RangeRequest(keys[0], 0, 1))
        tiny = [RangeRequest(keys[i % count], 0, 1) for i in range(requests["N"])]
        t0 = time.perf_counter()
        for _ in direct.map(direct.get_range, tiny):
            pass
        overhead_s = time.perf_counter() - t0
    bw = r.link.bandwidth_bps

    def fraction(label: str) -> float | None:
        return total * 8 / seconds[label] / bw if bw else None

    return {
        "1": fraction("1"),
        "N": fraction("N"),
        "connections": cfg.connections,
        "link": r.name,
        "bytes": total,
        "objects": count,
        "object_bytes": size,
        "seconds": seconds,
        "requests": requests,
        "same_requests_1_byte_no_link_s": overhead_s,
        "bps": {k: total * 8 / v for k, v in seconds.items()},
        "per_connection_cap_bps": r.link.per_connection_bps,
    }


def _publish_once(
    uri: str, options: dict[str, Any], specs: tuple[TensorSpec, ...], words: dict[str, np.ndarray], cfg: Config
) -> None:
    with open_run(uri, storage_options=options, shard_bytes=cfg.shard_bytes) as run:
        run.publish_words(specs, words, kind="full")


def _publish_check(world: _World, work: Workload, cfg: Config) -> dict[str, Any]:
    """Publish a delta to home through a link, and time extraction alone and upload alone beside it."""
    r = world.regions[0]
    n = cfg.connections
    uri = world.home_uri("publish")
    with contextlib.ExitStack() as stack:
        versions = stack.enter_context(contextlib.closing(work.versions()))

        def run_at(options: dict[str, Any], concurrency: int) -> Run:
            run = open_run(
                uri,
                storage_options=options,
                concurrency=concurrency,
                segment_bytes=cfg.segment_bytes,
                shard_bytes=cfg.shard_bytes,
                limits=Limits(part_bytes=cfg.full_part_bytes),
            )
            stack.callback(run.close)
            return run

        _publish_once(uri, _options(world.home, 16), work.specs, next(versions)[1], cfg)  # version 0, inside home
        remote = run_at(_options(world.home, 2 * n, r.proxy.endpoint), n)
        _, words = next(versions)
        remote.publish_words(work.specs, words, kind="delta")  # untimed: loads version 0 through the link first
        old = {k: a.copy() for k, a in words.items()}
        v, new = next(versions)
        t0 = time.perf_counter()
        info = remote.publish_words(work.specs, new, kind="delta")
        publish_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        builder = DeltaBuilder(v, work.specs, cfg.segment_bytes)
        sealed: list[SealedObject] = []
        for s in work.specs:
            sealed.extend(builder.add_tensor(s, old[s.name], new[s.name]))
        sealed.extend(builder.finish())
        extract_s = time.perf_counter() - t0
        del old
        t0 = time.perf_counter()  # what a publisher does after extraction, besides uploading
        digest = Digest()
        by_name = {s.name: s for s in work.specs}
        for c in builder.changes:
            spec = by_name[c.name]
            digest.update(tensor_keys(spec.name, spec.dtype, spec.shape), c.positions, c.old, c.new)
        digest_s = time.perf_counter() - t0

        scratch_options = _options(world.home, 2 * n, r.proxy.endpoint)
        scratch = ObjectStore(world.home_uri("publish-upload"), scratch_options, concurrency=n)
        stack.callback(scratch.close)
        scratch.exists("warm-up")  # the client's one-time setup, untimed (the run's client is warm too)
        t0 = time.perf_counter()
        for _ in scratch.map(lambda o: scratch.put_if_absent(o.entry.key, o.data), sealed):
            pass
        upload_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        remote.publish_words(work.specs, new, kind="delta")  # nothing changed: the commit's round trips alone
        empty_s = time.perf_counter() - t0
    return {
        "link": r.name,
        "version": v,
        "bytes": info.bytes,
        "segments": info.segments,
        "extract_s": extract_s,
        "upload_s": upload_s,
        "publish_s": publish_s,
        "vs_max": publish_s / max(extract_s, upload_s),
        "vs_sum": publish_s / (extract_s + upload_s),
        "digest_s": digest_s,
        "empty_publish_s": empty_s,
        "note": "extract_s: DeltaBuilder alone; upload_s: its sealed objects uploaded at once through the link; "
        "publish_s also pays the weight-digest update (digest_s) and the commit's fixed round trips over the link "
        "(next-version check, parent manifest, attachments listing, manifest put: empty_publish_s is a publish "
        "with nothing changed), and the last sealed segment can only start uploading when extraction ends",
    }


# ---------------------------------------------------------------- the whole benchmark


def _peak_rss_mb() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10


def measure(cfg: Config, progress: bool = False) -> dict[str, Any]:
    """Run the whole benchmark in-process and return its JSON-ready result."""
    from bench import trace

    unknown = set(cfg.modes) - set(MODES)
    if unknown:
        raise ValueError(f"unknown modes {sorted(unknown)}; known: {list(MODES)}")
    started = time.perf_counter()
    steps = max(cfg.versions, 2)  # the publish check needs two deltas
    console = Console(stderr=True)
    with (
        Progress(console=console, disable=not (progress and console.is_terminal), transient=True) as bar,
        contextlib.ExitStack() as stack,
    ):
        task = bar.add_task("trace", total=cfg.first_step + steps + 1 + len(cfg.modes) * (cfg.versions + 1) + 2)

        def tick(what: str | None = None) -> None:
            bar.update(task, advance=1, description=what)

        work = make_workload(cfg.layers, cfg.vocab, cfg.seed, cfg.first_step, steps, tick)
        bar.update(task, description="starting S3 servers, WAN links, Redis")
        world = _World(cfg, stack)
        modes = {mode: _run_mode(mode, world, work, cfg, tick) for mode in cfg.modes}
        world.reset()
        tick("fetch: 1 vs N connections")
        fetch = _fetch_throughput(world, cfg)
        tick("publish: cut-through check")
        publish = _publish_check(world, work, cfg)
        servers = {"home": world.home.peak_rss_mb(), **{r.name: r.server.peak_rss_mb() for r in world.regions}}
        proxies = {r.name: r.proxy.peak_rss_mb() for r in world.regions}
        links = [{"region": r.name, "link_to": "home", **describe(r.link)} for r in world.regions]
    shape = trace.Shape(layers=cfg.layers, vocab=trace.QWEN3_0_6B.vocab if cfg.vocab is None else cfg.vocab)
    result = {
        "bench": "transfer",
        "emulated": True,
        "emulation": "one machine, loopback only: an S3 server (moto) per region; each region reads home through "
        "a userspace WAN proxy (bench.wan) in its own process; relays write and actors read their own region's "
        "server directly (no emulation inside a region); Redis is the embedded server; all on "
        f"{_cpus()} CPU cores shared by every process",
        "model": "Qwen3-0.6B"
        if shape == trace.QWEN3_0_6B
        else f"Qwen3-0.6B-shaped ({cfg.layers} layers, vocab {shape.vocab})",
        "params": trace.parameter_count(cfg.layers, shape.vocab),
        "trace_steps": {"version_0": work.steps[0], "timed": work.steps[1 : cfg.versions + 1]},
        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(cfg).items()},
        "links": links,
        "regions": [r["region"] for r in links],
        "actors_per_region": cfg.actors,
        "full_bytes": work.full_bytes,
        "modes": modes,
        "fetch_link_fraction": fetch,
        "publish": publish,
        "peak_rss_mb": {"bench": _peak_rss_mb(), "s3_servers": servers, "wan_proxies": proxies},
        "seconds": time.perf_counter() - started,
        "limits": _limits(cfg, work),
    }
    return summarize(result)


def _limits(cfg: Config, work: Workload) -> list[str]:
    """What, besides the emulated links, shapes these numbers."""
    largest = max(s.numel * s.width for s in work.specs)
    return [
        f"{_cpus()} CPU cores run everything: {len(cfg.rtts_s) + 1} moto servers, {len(cfg.rtts_s)} proxies, and "
        f"in this process the trainer, {len(cfg.rtts_s)} relays and {len(cfg.rtts_s) * cfg.actors} actors as "
        "threads under one GIL; each version's cpu_busy_cores near the core count means the mode is CPU-bound",
        "moto (a Python server) costs a few ms of CPU per request and reads a whole object to serve any range "
        f"of it, one request at a time per object; the largest object is {largest / 1e6:.0f} MB (the embedding, "
        "a tensor the store never splits); fetch_link_fraction.same_requests_1_byte_no_link_s shows the "
        "request cost with no link",
        "moto closes every connection after one response, where S3 clients keep theirs alive: links charge "
        f"{cfg.connect_rtts} round trips per new connection",
        "the WAN proxy models delay, jitter, shared bandwidth and the Mathis per-connection cap, not real loss, "
        "retransmission or slow start",
        "version 0 reaches every region and actor untimed, around the links; only timed versions cross them",
        "relays copy announced objects one at a time, so full_relay's trainer commits without announcing its "
        "shards and relays copy each full version after its commit with all their connections",
        "full_relay actors drop their weights and load the new full version (no second staged copy), and "
        "verify it with an O(model) digest; delta actors stage and verify O(changed)",
    ]


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers (slowest region, per version, mean over timed versions) and the targets."""
    modes = result["modes"]
    times = {m: modes[m]["time_to_apply_s"] if m in modes else None for m in MODES}
    delta = modes.get("delta_relay") or modes.get("delta_direct")
    delta_bytes = delta["payload_bytes"] if delta else None
    cross = {m: modes[m]["link_bytes_per_version"] for m in MODES if m in modes}
    per_delta = None
    if "delta_relay" in modes and delta_bytes:
        overhead = modes["delta_relay"]["manifest_bytes"]
        per_delta = max(b / (delta_bytes + overhead) for b in cross["delta_relay"].values())
    fetch = result["fetch_link_fraction"]
    full_over_delta = (
        times["full_relay"] / times["delta_relay"] if times["full_relay"] and times["delta_relay"] else None
    )
    result |= {
        "delta_bytes": delta_bytes,
        "cross_region_bytes_per_version_per_region": {
            **cross,
            "delta_payload_bytes": delta_bytes,
            "link_bytes_per_delta_delta_relay": per_delta,
            "note": "bytes delivered down each link (home -> region) around each timed version, HTTP included; "
            "delta_relay should be about one delta (plus its manifest, which a relay reads twice), "
            "delta_direct about actors_per_region deltas",
        },
        "time_to_apply_s": times,
        "per_region": {m: modes[m]["per_region_s"] for m in modes},
        "full_vs_delta_time": full_over_delta,
        "full_vs_delta_bytes": result["full_bytes"] / delta_bytes if delta_bytes else None,
        "bit_exact": all(m["bit_exact"] for m in modes.values()),
    }
    result["targets"] = {
        "one_delta_per_region": per_delta is not None and per_delta <= TARGETS["link_bytes_per_delta"],
        "fetch_N_ge_0.85": fetch["N"] is not None and fetch["N"] >= TARGETS["fetch_fraction"],
        "delta_vs_full_ge_20x": full_over_delta is not None and full_over_delta >= TARGETS["delta_vs_full"],
    }
    result["target_definitions"] = {
        "one_delta_per_region": "max over regions of delta_relay link bytes per version / (delta payload + manifest) "
        f"<= {TARGETS['link_bytes_per_delta']}",
        "fetch_N_ge_0.85": f"N-connection fetch through the first link >= {TARGETS['fetch_fraction']} of its bandwidth",
        "delta_vs_full_ge_20x": "time_to_apply_s full_relay / delta_relay (slowest region, mean per version) "
        f">= {TARGETS['delta_vs_full']}",
    }
    return result


# ---------------------------------------------------------------- CLI


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def render(result: dict[str, Any], console: Console) -> None:
    """The human table: time to apply per mode and region, bytes per link, then the targets."""
    regions = result["regions"]
    table = Table(
        title=f"transfer: {result['model']}, {result['actors_per_region']} actors per region (emulated WAN)",
        caption="seconds from the trainer's step end to applied, slowest actor of the region, mean per version; "
        "MB: bytes down each link per version",
    )
    for col in ("mode", *regions, "slowest", "publish s", *(f"MB {r}" for r in regions)):
        table.add_column(col, justify="right")
    for mode, m in result["modes"].items():
        table.add_row(
            mode,
            *(_fmt(m["per_region_s"].get(r), ".2f") for r in regions),
            _fmt(m["time_to_apply_s"], ".2f"),
            _fmt(m["publish_s"], ".2f"),
            *(_fmt(m["link_bytes_per_version"].get(r, 0) / 1e6, ".1f") for r in regions),
        )
    console.print(table)
    f, p = result["fetch_link_fraction"], result["publish"]
    console.print(
        f"delta {_fmt(result['delta_bytes'] and result['delta_bytes'] / 1e6, '.1f')} MB, full "
        f"{result['full_bytes'] / 1e6:.0f} MB; fetch over {f['link']}: 1 connection {_fmt(f['1'], '.3f')}, "
        f"{f['connections']} connections {_fmt(f['N'], '.3f')} of the link; publish {p['publish_s']:.2f} s "
        f"(extract {p['extract_s']:.2f} s, upload {p['upload_s']:.2f} s: {p['vs_max']:.2f}x max, "
        f"{p['vs_sum']:.2f}x sum); peak RSS {result['peak_rss_mb']['bench']:.0f} MB"
    )
    for name, met in result["targets"].items():
        console.print(f"  {'[green]met[/]' if met else '[red]missed[/]'}  {name}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout, nothing else")
    parser.add_argument(
        "--quick", action="store_true", help=f"{QUICK.layers} layers, vocab {QUICK.vocab}, {QUICK.versions} versions"
    )
    parser.add_argument("--layers", type=positive, help=f"decoder layers (default {FULL.layers})")
    parser.add_argument("--vocab", type=positive, help="embedding rows (default 151936, Qwen3's)")
    parser.add_argument("--versions", type=positive, help=f"timed versions per mode (default {FULL.versions})")
    parser.add_argument("--actors", type=positive, help=f"actors per region (default {FULL.actors})")
    parser.add_argument(
        "--connections", type=positive, help=f"parallel GETs across a link (default {FULL.connections})"
    )
    parser.add_argument("--modes", help=f"comma-separated subset of {','.join(MODES)}")
    parser.add_argument("--seed", type=int, default=0, help="trace seed (default 0)")


def config_from(args: argparse.Namespace) -> Config:
    return overridden(QUICK if args.quick else FULL, args, ("layers", "vocab", "versions", "actors", "connections"))


def run(args: argparse.Namespace) -> int:
    return emit(measure(config_from(args), progress=True), args, lambda r: render(r, Console()))
