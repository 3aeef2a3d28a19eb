"""The trainer's dispatch against Redis writers (issue 25): what one registration, one hung actor or
a stream of forged entries costs training, and what forged payload references cost in bytes.

Each scenario starts a fresh ``redis-server``, publishes a tiny run to a local bucket, and runs a
real trainer :class:`~trainer.dispatch.Dispatcher` (its collector thread, as ``aurora train`` does)
against real actor :class:`~actor.worker.Actor` loops (threads of this process,
:mod:`bench.fleet.actors`, each engine answering after ``batch_s``). Each is measured with the fault
and without it, in the same run:

- ``fake`` (bug 3): a registration claiming 1e12 tokens/s that heartbeats and never takes a job.
  Results admitted and leases lost in ``seconds``, steps of ``prompts`` posted back to back.
- ``hung`` (weak spot): one more actor whose engine hangs on its first batch while its heartbeat
  thread still beats. Each of ``steps`` steps' time from posting to its last admission.
- ``forged`` (bug 1): 16 result entries a second under the holders' names, with made-up tokens and
  damaged payloads. Results admitted in ``seconds``, and the step time.
- ``refs`` (bug 5): 60 references to one 8 MiB object under an open job with made-up tokens, 40 for
  jobs that do not exist, and 60 under the holder's name and its real token (what a writer who reads
  Redis can send): bytes the trainer read from the bucket, counted by the store's own meter.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import secrets
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from aurora_store.config.options import option
from bench.output import Output, comma_list, overridden

SCENARIOS = ("fake", "hung", "forged", "refs")


@dataclass(frozen=True, slots=True)
class Config:
    scenarios: tuple[str, ...] = SCENARIOS
    actors: int = 2
    """Honest actors."""
    prompts: int = 16
    """Prompts per step."""
    lease_s: float = 2.0
    seconds: float = 40.0
    """How long ``fake`` and ``forged`` post steps."""
    steps: int = 6
    """Steps ``hung`` times."""
    batch_s: float = 0.25
    """How long an honest engine takes per batch."""
    tokens: int = 16
    group: int = 4


_DEFAULT = Config()


@dataclass(kw_only=True, slots=True)
class Flags(Output):
    """The command line of ``aurora bench dispatch``."""

    scenarios: tuple[str, ...] | None = field(default=None, metadata=option(parse=comma_list))
    """Which scenarios: fake, hung, forged, refs (default: all)."""
    actors: int | None = None
    """Honest actors (default 2)."""
    prompts: int | None = None
    """Prompts per step (default 16)."""
    lease_s: float | None = None
    """The trainer's lease length in seconds (default 2, as the issue's probe)."""
    seconds: float | None = None
    """How long ``fake`` and ``forged`` post steps (default 40)."""
    steps: int | None = None
    """Steps ``hung`` times (default 6)."""
    batch_s: float | None = None
    """How long an honest actor's engine takes per batch (default 0.25)."""


class _Engine:
    """An engine that answers after ``delay_s`` (forever when ``hang`` is set, until released)."""

    def __init__(self, inner: Any, delay_s: float, *, hang: bool = False) -> None:
        self.inner, self.delay_s, self.hang = inner, delay_s, hang
        self.live = None
        self.release = threading.Event()

    def generate(self, prompts: Sequence[Sequence[int]], **kw: Any) -> Any:
        if self.hang:
            self.release.wait()
        else:
            time.sleep(self.delay_s)
        return self.inner.generate(prompts, **kw)

    def applied(self, version: int, version_hash: str) -> None:
        pass


class World:
    """A Redis, a run, a started dispatcher, and ``actors`` honest actors serving it."""

    def __init__(self, cfg: Config, *, group: int | None = None, tokens: int | None = None) -> None:
        self.cfg = cfg
        self.group = group or cfg.group
        self.tokens = tokens or cfg.tokens
        self.stack = contextlib.ExitStack()

    def __enter__(self) -> World:
        import torch

        import aurora_store
        from aurora_store.coord.coordinator import Coordinator
        from aurora_store.coord.jobs import JobBoard
        from aurora_store.rl.sampling import SamplingConfig
        from aurora_store.testing.redis_server import RedisServer
        from trainer.config import ScheduleConfig
        from trainer.dispatch import Dispatcher

        logging.getLogger("aurora").setLevel(logging.CRITICAL)
        self.root = tempfile.mkdtemp(prefix="aurora-bench-dispatch-")
        self.uri = f"file://{self.root}/run"
        run = aurora_store.open_run(self.uri)
        self.info = run.publish({"w": torch.zeros(64, dtype=torch.bfloat16)})
        self.store = run.store
        self.read = Counter[str]()
        self.store.meter = lambda direction, n: self.read.update({direction: n})
        self.server = self.stack.enter_context(RedisServer().start())
        self.run_id = "bench"
        self.coord = Coordinator(self.server.url, self.run_id)
        self.stack.callback(self.coord.close)
        self.board = JobBoard(self.coord)
        self.d = Dispatcher(
            self.coord,
            self.board,
            schedule=ScheduleConfig(lease_s=self.cfg.lease_s, sweep_s=0.1),
            sampling=SamplingConfig(group=self.group, max_new_tokens=self.tokens),
            vocab_size=64,
            tag="bench",
            stores={"home": self.store},
        )
        self.d.published_version(0, self.info.version_hash, self.info.weights_digest)
        self.stack.callback(self.d.close)
        self.stop = threading.Event()
        self.stack.callback(self.stop.set)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()

    def actors(self, n: int, *, first: int = 0, hang: bool = False) -> list[Any]:
        """Start ``n`` actor loops (named ``actor-{first}``...) whose engines answer after ``batch_s``, or hang."""
        from bench.fleet.actors import Fleet

        fleet = Fleet(n, store=self.uri, redis=self.server.url, run_id=self.run_id, tokens=self.tokens,
                      group=self.group, vocab=64, first=first)  # fmt: skip
        engines = []
        for w in fleet.workers:
            engine = _Engine(w.engine, self.cfg.batch_s, hang=hang)
            w.engine = engine  # type: ignore[assignment]
            engines.append(engine)
        fleet.start()

        def stop() -> None:
            for e in engines:
                e.release.set()
            fleet.stop()  # their connections stay open: a listener blocked in its read ends with the server

        self.stack.callback(stop)
        return fleet.workers

    def beat(self, fn: Any, every_s: float) -> None:
        """Call ``fn`` every ``every_s`` on a thread until the world ends."""

        def loop() -> None:
            while not self.stop.wait(every_s):
                with contextlib.suppress(Exception):  # a fault's thread: its errors are not the measure
                    fn()

        threading.Thread(target=loop, daemon=True).start()

    def prompts(self, step: int) -> list[Any]:
        from aurora_store.rl.tasks import Prompt

        return [Prompt(f"p{step}-{i}", "q", "a", (1, 2, 3)) for i in range(self.cfg.prompts)]

    def drive(self, *, seconds: float | None = None, steps: int | None = None) -> dict[str, Any]:
        """Post steps back to back, each once the last is admitted, for ``seconds`` or ``steps`` steps;
        what was admitted and how long each step took."""
        end = time.monotonic() + (seconds if seconds is not None else 3600.0)
        d = self.d
        d.start()
        times: list[float] = []
        step = 0
        while time.monotonic() < end and (steps is None or step < steps):
            step += 1
            t0 = time.monotonic()
            d.post(step, self.prompts(step))
            done = False
            while not done and time.monotonic() < end:
                time.sleep(0.02)
                with d._lock:
                    done = len(d.admitted.get(step, {})) >= len(d.leases.step_jobs[step])
            if not done:
                break
            d.collect(step)
            times.append(time.monotonic() - t0)
        d.stop()
        return {
            "admitted": d.admitted_total,
            "steps_done": len(times),
            "step_s": [round(t, 2) for t in times[:12]],
            "median_step_s": round(statistics.median(times), 2) if times else None,
            "max_step_s": round(max(times), 2) if times else None,
            "leases_lost": d.dropped["lease_lost"],
            "dropped": {k: v for k, v in sorted(d.dropped.items()) if k != "lease_lost"},
        }


def fake(cfg: Config, faulty: bool) -> dict[str, Any]:
    with World(cfg) as world:
        world.actors(cfg.actors)
        if faulty:
            workers = world.coord.workers
            workers.register("actor", "home", worker_id="fake", ttl_s=10)
            workers.update("fake", version=0, version_hash=world.info.version_hash)
            world.board.throughputs.report("fake", 1e12, 1.0, beta=0.5)
            world.beat(lambda: workers.heartbeat("fake", 10), 2.0)
        return world.drive(seconds=cfg.seconds)


def hung(cfg: Config, faulty: bool) -> dict[str, Any]:
    with World(cfg) as world:
        world.actors(cfg.actors)
        if faulty:
            world.actors(1, first=cfg.actors, hang=True)
        return world.drive(steps=cfg.steps, seconds=cfg.seconds * 3)


def forged(cfg: Config, faulty: bool) -> dict[str, Any]:
    with World(cfg) as world:
        world.actors(cfg.actors)
        if faulty:
            r: Any = world.coord.r
            results = world.board.results.key
            vhash = world.info.version_hash

            def forge() -> None:  # one entry every 1/16 s, under the holder of an open job
                jobs = sorted(r.smembers(world.coord.key("open")))
                if not jobs:
                    return
                job = jobs[secrets.randbelow(len(jobs))]
                actor = r.hget(world.coord.key("job", job), "actor") or "actor-0000"
                kind = secrets.randbelow(3)
                fields: dict[str, Any] = {"job": job, "actor": actor, "token": secrets.randbelow(10**13),
                                          "version": 0, "version_hash": vhash if kind else "f" * 64}  # fmt: skip
                if kind != 2:  # a damaged payload; else none and no reference
                    fields["bin"] = b"\x00garbage"
                r.xadd(results, fields)

            world.beat(forge, 1 / 16)
        return world.drive(seconds=cfg.seconds)


def refs(cfg: Config, faulty: bool) -> dict[str, Any]:
    """Bytes read from the bucket for forged references (``faulty``) or for the holder's one result."""
    from aurora_store.bucket.results import put_payload
    from aurora_store.coord.results import Ref
    from aurora_store.format import results as payloads

    # a job may return 8 x 131072 tokens (8.4 MB): an 8 MiB object is a size a result could have
    with World(cfg, group=8, tokens=131072) as world:
        d, board, coord = world.d, world.board, world.coord
        coord.workers.register("actor", "home", worker_id="a", ttl_s=60)
        coord.workers.update("a", version=0)
        d.post(1, world.prompts(1)[:1])
        (lease,) = board.take("a", max_jobs=1, block_s=1)
        vhash = world.info.version_hash
        written = 0
        if faulty:
            big = secrets.token_bytes(8 << 20)
            key, sha = put_payload(world.store, big)
            ref = Ref("home", key, sha, len(big))
            stolen = int(str(coord.r.hget(coord.key("job", lease.job), "token")))  # tokens are readable in Redis
            for i in range(60):
                fake_lease = dataclasses.replace(lease, token=lease.token + 1 + i)
                board.results.submit(fake_lease, actor="a", version=0, version_hash=vhash, ref=ref)
            for i in range(40):
                other = dataclasses.replace(lease, job=f"bench:1:{1000 + i}")
                board.results.submit(other, actor="a", version=0, version_hash=vhash, ref=ref)
            for _ in range(60):
                board.results.submit(dataclasses.replace(lease, token=stolen), actor="a", version=0,
                                     version_hash=vhash, ref=ref)  # fmt: skip
            written = 160 * 300  # about what each reference costs the writer in Redis
        else:
            comp = ([5] * 100, [-0.5] * 100, "stop", 1.0)
            data = payloads.encode([comp] * 8, failures={}, weights_digest=world.info.weights_digest)
            key, sha = put_payload(world.store, data)
            board.results.submit(lease, actor="a", version=0, version_hash=vhash, ref=Ref("home", key, sha, len(data)))
        world.read.clear()
        after = time.monotonic() + 60
        while coord.r.xlen(board.results.key) and time.monotonic() < after:
            d._collect_once()
        return {
            "bytes_read": world.read["download"],
            "admitted": d.admitted_total,
            "approx_bytes_written_to_redis": written,
            "dropped": dict(sorted(d.dropped.items())),
        }


RUNS = {"fake": fake, "hung": hung, "forged": forged, "refs": refs}


def measure(cfg: Config) -> dict[str, Any]:
    out: dict[str, Any] = {"config": asdict(cfg)}
    for name in cfg.scenarios:
        if name not in RUNS:
            raise SystemExit(f"unknown scenario {name!r}; known: {', '.join(RUNS)}")
        out[name] = {"fault_free": RUNS[name](cfg, False), "with_fault": RUNS[name](cfg, True)}
    return out


def run(args: Flags) -> int:
    out = measure(overridden(_DEFAULT, args))
    if args.json:
        print(json.dumps(out))
    else:
        for name in out:
            if name != "config":
                print(name, json.dumps(out[name], indent=1))
    return 0
