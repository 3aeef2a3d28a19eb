"""``aurora bench chaos``: the whole system as real processes under a seeded schedule of faults.

A real ``redis-server`` (no persistence), a moto S3 server per region (home, eu, ap), each other
region's reads of home through a `bench.world.ProxyProcess` WAN link, and all of that region's
traffic to Redis and home through a partitionable gate (`bench.chaos_faults.Gates`); the trainer
(``aurora train``, signed, resumable every version), a relay into each other region and actors in
all three. The schedule (``random.Random(seed)``) kills roles at chosen moments, restarts or flushes
Redis, partitions regions, damages and forges objects and Redis entries; a supervisor restarts what
died after a short seeded delay, as systemd would. After a settle period in which the trainer must
finish its steps, `bench.chaos_check` checks the invariants. Every process runs in a process group
of its own and all are stopped at the end, on Ctrl-C and on errors too; their logs stay in the run's
work directory.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from aurora_store.format import signing
from aurora_store.format.keys import manifest_key
from aurora_store.testing.moto import S3Server, start_moto
from aurora_store.testing.redis_server import RedisServer
from bench.chaos_bucket import Bucket
from bench.chaos_check import summarize
from bench.chaos_faults import Faults, Gates, schedule
from bench.output import Output, emit, overridden
from bench.wan import Link
from bench.world import ProxyProcess

REPO = Path(__file__).resolve().parents[1]
REGIONS = ("home", "eu", "ap")
RUN = "chaos"


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    """One chaos run: the schedule, the system's size, and its time limits."""

    seed: int = 0
    faults: int = 30
    """Faults to inject."""
    interval_s: float = 2.0
    """Mean gap between faults (each gap is uniform in [0.5, 1.5] times this)."""
    steps: int | None = None
    """Trainer steps; None: one per 2 s of schedule, at least 6."""
    actors: int = 2
    """Actors per region at the start."""
    prompts: int = 8
    group: int = 4
    max_new_tokens: int = 4
    sft_steps: int = 30
    """Warm-start steps: enough that rewards differ within groups, so versions are real deltas."""
    lease_s: float = 8.0
    heartbeat_s: float = 3.0
    slowdown: float = 25.0
    """Every actor's emulated slowdown, so that a batch lasts long enough to be interrupted."""
    bandwidth_bps: float = 1e9
    rtt_s: float = 0.01
    restart_s: tuple[float, float] = (0.5, 3.0)
    """A dead role is restarted after a delay drawn uniformly from this range."""
    start_timeout_s: float = 300.0
    """Longest wait for the trainer's first step before the schedule starts."""
    settle_s: float = 300.0
    """Longest wait, after the schedule, for the trainer to finish and every region to hold every version."""
    workdir: str | None = None

    @property
    def total_steps(self) -> int:
        return self.steps or max(6, math.ceil(self.faults * self.interval_s / 2))


@dataclass(slots=True)
class Proc:
    name: str
    role: str
    region: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    retired: bool = False
    """Gone for good (stopped by the schedule, or finished): never restarted."""
    killed: bool = False
    """Its current incarnation was killed by the schedule: its exit is expected."""
    due: float | None = None
    """When it is restarted."""

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


@dataclass(slots=True)
class Supervisor:
    """Starts every role in a process group of its own, restarts the dead after a seeded delay
    (counting unexpected exits as crashes), and stops them all."""

    t0: float
    rng: random.Random
    restart_s: tuple[float, float]
    make_actor: Callable[[str, str, str, float | None], Proc]
    """``(role, region, name, slowdown)`` -> the actor's `Proc`."""
    procs: dict[str, Proc] = field(default_factory=dict)
    counts: dict[str, Counter[str]] = field(default_factory=dict)
    crashes: list[dict[str, Any]] = field(default_factory=list)
    finished: bool = False
    """The trainer exited 0: every step is committed."""
    pgids: list[int] = field(default_factory=list)
    """Every process group started (each role incarnation leads one)."""
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _pumps: list[threading.Thread] = field(default_factory=list)
    _serial: Counter[str] = field(default_factory=Counter)

    def add(self, p: Proc) -> None:
        with self._lock:
            self.procs[p.name] = p
            self._start(p)

    def _start(self, p: Proc) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **p.env}
        out = subprocess.PIPE
        p.popen = subprocess.Popen(
            [sys.executable, *p.argv], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        p.killed, p.due = False, None
        self.pgids.append(p.popen.pid)
        self.counts.setdefault(p.role, Counter())["started"] += 1
        assert p.popen.stdout is not None
        pump = threading.Thread(target=self._pump, args=(p.popen.stdout, open(p.log, "ab")), daemon=True)  # noqa: SIM115
        pump.start()
        self._pumps.append(pump)

    def _pump(self, out: IO[bytes], log: IO[bytes]) -> None:
        """Copy a child's output to its log, each line stamped with seconds since the run started."""
        with log:
            for line in out:
                log.write(f"[{time.monotonic() - self.t0:9.3f}] ".encode() + line)
                log.flush()

    def names(self, role: str) -> list[str]:
        with self._lock:
            return sorted(n for n, p in self.procs.items() if p.role == role and p.alive and not p.killed)

    def region_of(self, name: str) -> str:
        return self.procs[name].region

    def signal(self, name: str, sig: int) -> bool:
        """Send ``sig`` to ``name``'s process group (counted by signal); False if it is not running."""
        with self._lock:
            p = self.procs.get(name)
            if p is None or p.popen is None or not p.alive:
                return False
            self.counts[p.role][signal.Signals(sig).name] += 1
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.popen.pid, sig)
            return True

    def kill(self, name: str, sig: int, *, restart: bool) -> bool:
        """Kill ``name`` (an expected exit), to be restarted after a delay or, without ``restart``, gone."""
        with self._lock:
            if not self.signal(name, sig):
                return False
            p = self.procs[name]
            p.killed, p.retired = True, p.retired or not restart
            return True

    def spawn_actor(self, region: str, slowdown: float | None = None) -> str:
        role = "slow" if slowdown else "actor"
        with self._lock:
            n = self._serial[region + role]
            self._serial[region + role] += 1
            name = f"{region}-{'s' if slowdown else ''}{n}"
            self.add(self.make_actor(role, region, name, slowdown))
        return name

    def poll(self) -> None:
        """Notice exits (crashes and expected ones) and restart what is due."""
        now = time.monotonic()
        with self._lock:
            for p in self.procs.values():
                if p.popen is None or p.due is not None or p.retired or p.alive:
                    continue
                rc = p.popen.returncode
                if p.role == "trainer" and rc == 0:
                    p.retired = self.finished = True
                    continue
                if not p.killed:
                    self.counts[p.role]["crashed"] += 1
                    tail = p.log.read_text(errors="replace").splitlines()[-6:]
                    self.crashes.append({"name": p.name, "rc": rc, "at_s": round(now - self.t0, 1), "tail": tail})
                p.due = now + self.rng.uniform(*self.restart_s)
            for p in self.procs.values():
                if p.due is not None and p.due <= now and not p.retired:
                    self.counts[p.role]["restarted"] += 1
                    self._start(p)

    def stop_all(self) -> None:
        """SIGTERM every group, then SIGKILL every group (a leader's children too) after 15 s at most."""
        with self._lock:
            for p in self.procs.values():
                p.retired = True
                if p.popen is not None and p.alive:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.popen.pid, signal.SIGTERM)
                        os.killpg(p.popen.pid, signal.SIGCONT)  # a paused one must run to stop
        end = time.monotonic() + 15
        for p in self.procs.values():
            if p.popen is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.popen.wait(max(0.1, end - time.monotonic()))
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.popen.pid, signal.SIGKILL)
                p.popen.wait(10)
        for t in self._pumps:
            t.join(5)


def s3_options(server: S3Server, port: int | None = None) -> dict[str, Any]:
    """s3fs options (through a gate on ``port``) with short timeouts: a partition is an error to retry."""
    endpoint = f"http://127.0.0.1:{port}" if port else None
    timeouts = {"connect_timeout": 3, "read_timeout": 10, "retries": {"max_attempts": 2}}
    return {**server.options(endpoint), "config_kwargs": timeouts, "skip_instance_cache": True}


def _command(role: str, **flags: Any) -> list[str]:
    """``python -m aurora_store.cli ROLE --flag value ...`` (after the interpreter): dicts as JSON."""
    out = ["-m", "aurora_store.cli", role]
    for k, v in flags.items():
        out += [f"--{k.replace('_', '-')}", json.dumps(v) if isinstance(v, dict) else str(v)]
    return out


class World:
    """Redis, the S3 servers, the WAN links and gates, the keys, and the command line of every role."""

    def __init__(self, cfg: Config, work: Path, stack: contextlib.ExitStack) -> None:
        self.cfg, self.work = cfg, work
        out = stack.enter_context(open(work / "redis-server.out", "ab"))  # noqa: SIM115 - closed by the stack
        self.redis = RedisServer(log=out).start()
        stack.callback(self.redis.stop)
        with ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(start_moto) for _ in REGIONS]
        for f in futures:
            if f.exception() is None:
                stack.callback(f.result().stop)
        servers = dict(zip(REGIONS, (f.result() for f in futures), strict=True))
        self.buckets = {r: Bucket(r, s, s.new_bucket(), f"runs/{RUN}/") for r, s in servers.items()}
        self.gates = Gates()
        stack.callback(self.gates.close)
        link = Link(rtt_s=cfg.rtt_s, jitter_s=cfg.rtt_s / 10, bandwidth_bps=cfg.bandwidth_bps, connect_rtts=0)
        self.proxies: dict[str, ProxyProcess] = {}
        self.ports: dict[str, tuple[int, int]] = {}
        """Region -> (gate to home's bucket through its WAN link, gate to Redis)."""
        for i, r in enumerate(REGIONS[1:]):
            self.proxies[r] = ProxyProcess(servers["home"], link, seed=cfg.seed + i)
            stack.callback(self.proxies[r].stop)
            here = ("127.0.0.1", self.proxies[r].port), ("127.0.0.1", self.redis.port)
            self.ports[r] = (self.gates.add(r, here[0]), self.gates.add(r, here[1]))
        private, self.public = signing.generate_keypair()
        self.sign_env = {"AURORA_SIGNING_KEY": private.decode()}
        self.verify_env = {"AURORA_VERIFY_KEY": self.public.decode()}
        self.admissions = work / "admissions.jsonl"

    def uri(self, region: str) -> str:
        return self.buckets[region].uri

    def options(self, region: str) -> dict[str, Any]:
        return s3_options(self.buckets[region].server)

    def home_from(self, region: str) -> dict[str, Any]:
        """Home's bucket as ``region`` reaches it: through its gate and WAN link, or directly at home."""
        return s3_options(self.buckets["home"].server, self.ports[region][0] if region in self.ports else None)

    def redis_from(self, region: str) -> str:
        return f"redis://127.0.0.1:{self.ports[region][1]}/0" if region in self.ports else self.redis.url

    def trainer(self) -> Proc:
        c = self.cfg
        argv = _command(
            "train",
            store=self.uri("home"), storage_options=self.options("home"), redis=self.redis.url, run_id=RUN,
            seed=c.seed, steps=c.total_steps, prompts=c.prompts, group=c.group, max_new_tokens=c.max_new_tokens,
            sft_steps=c.sft_steps, lr=5e-4, state_every=1, lease_s=c.lease_s, admissions_log=self.admissions,
        )  # fmt: skip
        return Proc("trainer", "trainer", "home", argv, self.sign_env, self.work / "trainer.log")

    def relay(self, region: str) -> Proc:
        argv = _command(
            "relay",
            source=self.uri("home"), dest=self.uri(region), redis=self.redis_from(region), run_id=RUN,
            dest_region=region, rescan_s=3, source_options=self.home_from(region), dest_options=self.options(region),
        )  # fmt: skip
        return Proc(f"relay-{region}", "relay", region, argv, self.verify_env, self.work / f"relay-{region}.log")

    def actor(self, role: str, region: str, name: str, slowdown: float | None) -> Proc:
        c = self.cfg
        argv = _command(
            "actor",
            store=self.uri(region), storage_options=self.options(region), region=region,
            redis=self.redis_from(region), run_id=RUN, worker_id=name, fallback=self.uri("home"),
            fallback_options=self.home_from(region), batch=4, heartbeat_s=c.heartbeat_s,
            slowdown=slowdown or c.slowdown,
        )  # fmt: skip
        return Proc(name, role, region, argv, self.verify_env, self.work / f"{role}-{name}.log")


def measure(cfg: Config) -> dict[str, Any]:
    """Run the schedule against the whole system, settle, check; the JSON-ready result."""
    t0 = time.monotonic()
    work = Path(cfg.workdir or tempfile.mkdtemp(prefix="aurora-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(cfg.seed)
    notes: list[str] = []
    phases: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        events = stack.enter_context(open(work / "chaos.jsonl", "a"))

        def record(doc: dict[str, Any]) -> None:
            events.write(json.dumps({"t": round(time.monotonic() - t0, 3), **doc}) + "\n")
            events.flush()

        world = World(cfg, work, stack)
        sup = Supervisor(t0, random.Random(cfg.seed + 1), cfg.restart_s, world.actor)
        stack.callback(sup.stop_all)
        sup.add(world.trainer())
        for r in REGIONS[1:]:
            sup.add(world.relay(r))
        for r in REGIONS:
            for _ in range(cfg.actors):
                sup.spawn_actor(r)
        faults = Faults(rng, sup, world.buckets, world.gates, world.redis, RUN, cfg.group, record)
        started = _wait(sup, faults, lambda: sup.finished or _first_step(work), cfg.start_timeout_s)
        notes += [] if started else [f"the trainer committed no step in {cfg.start_timeout_s:.0f} s"]
        phases["start_s"] = time.monotonic() - t0
        kinds = schedule(rng, cfg.faults)
        for i, kind in enumerate(kinds):
            _wait(sup, faults, lambda: sup.finished, rng.uniform(0.5, 1.5) * cfg.interval_s)
            if sup.finished:
                notes.append(f"the trainer finished before the schedule: {len(kinds) - i} faults not injected")
                break
            faults.inject(kind)
        phases["schedule_s"] = time.monotonic() - t0 - sum(phases.values())
        faults.tick(everything=True)  # heal every partition, restore every object, let slow actors go
        if n := faults.restore_all():
            notes.append(f"{n} objects were still damaged after the schedule")
        for name in sup.names("slow"):
            sup.kill(name, signal.SIGTERM, restart=False)
        last = cfg.total_steps

        def settled() -> bool:
            return sup.finished and all(b.exists(manifest_key(last)) for b in world.buckets.values())

        if not _wait(sup, faults, settled, cfg.settle_s):
            notes.append(f"not settled in {cfg.settle_s:.0f} s: trainer finished: {sup.finished}")
        phases["settle_s"] = time.monotonic() - t0 - sum(phases.values())
        sup.stop_all()
        regions = {r: b.state(world.options(r), world.public) for r, b in world.buckets.items()}
        links = {r: p.stats() for r, p in world.proxies.items()}
        servers = [world.redis.pid or 0, *(b.server.process.pid for b in world.buckets.values())]
        servers += [p.pid for p in world.proxies.values()]
        phases["check_s"] = time.monotonic() - t0 - sum(phases.values())
    left = [g for g in sup.pgids if _lives(os.killpg, g)] + [pid for pid in servers if _lives(os.kill, pid)]
    notes += [f"processes outlived the run: {left}"] if left else []
    return summarize(
        seed=cfg.seed, requested=cfg.faults, steps=last, prompts=cfg.prompts, faults=faults, counts=sup.counts,
        crashes=sup.crashes, admissions=world.admissions, regions=regions, work=work, t0=t0,
        notes=notes, extra={"phases": phases, "links": links, "gates": dict(world.gates.counts), "orphans": len(left)},
    )  # fmt: skip


def _wait(sup: Supervisor, faults: Faults, cond: Callable[[], bool], timeout: float) -> bool:
    """Keep supervising (restarts, heals, restores) until ``cond()`` or ``timeout``; whether it held."""
    end = time.monotonic() + timeout
    while True:
        sup.poll()
        faults.tick()
        if cond():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.1)


def _lives(signal_fn: Callable[[int, int], None], pid: int) -> bool:
    try:
        signal_fn(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid > 0


def _first_step(work: Path) -> bool:
    log = work / "trainer.log"
    return log.exists() and '"step": 1,' in log.read_text(errors="replace")


_DEFAULT = Config()


@dataclass(kw_only=True, slots=True)
class Flags(Output):
    """The command line of ``aurora bench chaos``."""

    seed: int = _DEFAULT.seed
    """Seeds the schedule, its targets and the restarts."""
    faults: int = _DEFAULT.faults
    """Faults to inject."""
    interval_s: float = _DEFAULT.interval_s
    """Mean gap between faults, seconds."""
    steps: int | None = _DEFAULT.steps
    """Trainer steps (default: one per 2 s of schedule, >= 6)."""
    actors: int = _DEFAULT.actors
    """Actors per region at the start."""
    prompts: int = _DEFAULT.prompts
    """Prompts per step."""
    lease_s: float = _DEFAULT.lease_s
    """Job lease length, seconds."""
    settle_s: float = _DEFAULT.settle_s
    """Longest settle after the schedule, seconds."""
    workdir: str | None = _DEFAULT.workdir
    """Where the logs go (default: a new temporary directory, kept)."""


def run(args: Flags) -> int:
    with _sigterm_interrupts():
        result = measure(overridden(_DEFAULT, args))
    emit(result, args, _render)
    return 1 if result["lost"] or not all(result["invariants"].values()) else 0


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so that every process is stopped on the way out."""

    def interrupt(*_: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _render(result: dict[str, Any]) -> None:
    from rich.console import Console

    out = Console()
    out.print(f"chaos, seed {result['seed']}: {result['steps']} steps in {result['seconds']} s; lost {result['lost']}")
    out.print({"faults": result["faults_injected"], "recoveries": result["recoveries"]})
    for name, ok in result["invariants"].items():
        out.print(f"  {name}: {'holds' if ok else '[red]FAILS[/]'}", *result["problems"].get(name, [])[:3])
    out.print(f"logs: {result['workdir']}")
