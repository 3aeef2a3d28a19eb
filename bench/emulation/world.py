"""The emulated world of the transfer and e2e benchmarks: home and regions on one machine.

Each region and home run an S3 server (moto) on loopback; every cross-region read goes through a
`bench.emulation.wan.WanProxy` link in a process of its own in front of home's server; Redis is a real
``redis-server`` process where one is installed (:func:`bench_redis`). Emulation, not a WAN: the
benchmarks' JSON says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import resource
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from aurora_store.coord.embedded import EmbeddedRedis
from aurora_store.testing.moto import S3Server, start_moto
from aurora_store.testing.processes import peak_rss_mb
from bench.emulation.wan import Link, WanProxy

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


def serve_proxy() -> None:
    """Child-process side of `ProxyProcess`: one JSON line in (target, link), then ``stats`` requests."""
    spec = json.loads(sys.stdin.readline())
    with WanProxy(spec["host"], spec["port"], Link(**spec["link"]), seed=spec["seed"]) as proxy:
        print(json.dumps({"port": proxy.port}), flush=True)
        for line in sys.stdin:
            if line.strip() != "stats":
                break
            print(json.dumps(proxy.stats()), flush=True)


class ProxyProcess:
    """A `WanProxy` in a child process, so that the link's timing never waits on this process's GIL."""

    def __init__(self, target: S3Server, link: Link, seed: int) -> None:
        self.link = link
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(
            [sys.executable, "-c", "from bench.emulation.world import serve_proxy; serve_proxy()"],
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
class Region:
    name: str
    link: Link
    server: S3Server
    proxy: ProxyProcess
    bucket: str = ""


def s3_options(server: S3Server, connections: int, endpoint: str | None = None) -> dict[str, Any]:
    """s3fs options: a client of its own (as a separate process would have) with ``connections`` sockets."""
    return {
        **server.options(endpoint),
        "config_kwargs": {"max_pool_connections": connections, "read_timeout": 300},
        "skip_instance_cache": True,
    }


class World:
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
        self.regions: list[Region] = []
        for i, ((name, link), server) in enumerate(zip(links, servers[1:], strict=True)):
            proxy = ProxyProcess(self.home, link, seed=cfg.seed + i)
            stack.callback(proxy.stop)
            self.regions.append(Region(name, link, server, proxy))
        self.redis = bench_redis(stack)

    def reset(self) -> None:
        """Drop every object of the last phase (moto keeps them in memory or temp files) and make buckets."""
        for s in (self.home, *(r.server for r in self.regions)):
            s.reset()
        self.home_bucket = self.home.new_bucket()
        for r in self.regions:
            r.bucket = r.server.new_bucket()

    def home_uri(self, name: str) -> str:
        return f"s3://{self.home_bucket}/runs/{name}"

    def region_uri(self, r: Region, name: str) -> str:
        return f"s3://{r.bucket}/runs/{name}"

    def snapshot(self) -> dict[str, Any]:
        """Bytes each link has carried so far, and CPU seconds every process of the benchmark has used."""
        pids = [self.home.process.pid, *(r.server.process.pid for r in self.regions)]
        pids += [r.proxy.pid for r in self.regions] + redis_pids(self.redis)
        return {"links": {r.name: r.proxy.stats() for r in self.regions}, "cpu_s": cpu_seconds(pids)}


class BenchRedis(Protocol):
    @property
    def url(self) -> str: ...


def bench_redis(stack: contextlib.ExitStack) -> BenchRedis:
    """The Redis of a bench world, closed by ``stack``: a real ``redis-server`` (its own process, as in a
    deployment) where one is installed, else the embedded server. The embedded server answers from a
    thread of the benchmark's own process: its CPU time (a fifth of that process's samples in the
    four-regions world) then competes under one GIL with the relays and actors it serves."""
    from aurora_store.testing.redis_server import RedisServer, RedisUnavailable

    try:
        server = RedisServer().start()
    except RedisUnavailable:
        embedded = EmbeddedRedis()
        stack.callback(embedded.close)
        return embedded
    stack.callback(server.stop)
    return server


def redis_kind(redis: BenchRedis) -> str:
    """What the JSON says the world's Redis was."""
    return "embedded (fakeredis, in the benchmark's process)" if isinstance(redis, EmbeddedRedis) else "redis-server"


def redis_pids(redis: BenchRedis) -> list[int]:
    """The Redis server's process, where it has one of its own (the embedded one is counted in ours)."""
    pid = getattr(redis, "pid", None)
    return [pid] if isinstance(pid, int) else []


def cpu_seconds(pids: list[int]) -> float | None:
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


def cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def own_peak_rss_mb() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10
