"""``aurora bench chaos``: the whole system as real processes under a seeded schedule of faults.

A real ``redis-server`` (no persistence), a moto S3 server per region (home, eu, ap), each other
region's reads of home through a `bench.world.ProxyProcess` WAN link, and all of that region's
traffic to Redis and home through a partitionable gate (`bench.chaos_gates.Gates`); the trainer
(``aurora train``, signed, its state saved every ``--state-every`` versions), a relay into each
other region and actors in all three (`bench.chaos_world.World`). The schedule
(`bench.chaos_schedule`, ``random.Random(seed)``) kills roles at chosen moments, restarts or flushes
Redis, partitions regions, damages and forges objects and Redis entries
(`bench.chaos_faults.Faults`); a supervisor (`bench.chaos_supervisor`) restarts what died after a
short seeded delay, as systemd would. After a settle period in which the trainer must finish its
steps, `bench.chaos_check` checks the invariants. Every process runs in a process group of its own
and all are stopped at the end, on Ctrl-C and on errors too; their logs stay in the run's work
directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aurora_store.format.keys import manifest_key
from aurora_store.options import option
from bench.chaos_check import summarize
from bench.chaos_config import Config
from bench.chaos_faults import Faults
from bench.chaos_schedule import kinds_of, schedule
from bench.chaos_supervisor import Supervisor
from bench.chaos_world import REGIONS, RUN, World
from bench.output import Output, comma_list, emit, overridden


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
        faults.trainer_env, faults.metrics_port = world.sign_env, world.metrics_port
        first = max(1, cfg.calm_steps)
        started = _wait(sup, faults, lambda: sup.finished or _step_done(work, first), cfg.start_timeout_s)
        notes += [] if started else [f"the trainer committed no step {first} in {cfg.start_timeout_s:.0f} s"]
        phases["start_s"] = time.monotonic() - t0
        kinds = schedule(rng, cfg.faults, kinds_of(cfg.kinds))
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
    extra = {"phases": phases, "links": links, "gates": dict(world.gates.counts), "orphans": len(left)}
    return summarize(
        seed=cfg.seed, requested=cfg.faults, steps=last, prompts=cfg.prompts, faults=faults, counts=sup.counts,
        crashes=sup.crashes, admissions=world.admissions, regions=regions, work=work, t0=t0,
        calm_steps=cfg.calm_steps, notes=notes, extra=extra,
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


def _step_done(work: Path, step: int) -> bool:
    log = work / "trainer.log"
    return log.exists() and f'"step": {step},' in log.read_text(errors="replace")


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
    state_every: int = _DEFAULT.state_every
    """The trainer's --state-every (2: kills between states force rollbacks)."""
    settle_s: float = _DEFAULT.settle_s
    """Longest settle after the schedule, seconds."""
    workdir: str | None = _DEFAULT.workdir
    """Where the logs go (default: a new temporary directory, kept)."""
    kinds: tuple[str, ...] | None = field(default=None, metadata=option(parse=comma_list))
    """Comma-separated fault kinds to draw from (default: all; ``writers``: the Redis/bucket writer family,
    under which every step must be admitted within 2x the fault-free pace)."""
    calm_steps: int = _DEFAULT.calm_steps
    """Fault-free steps before the first fault (the pace baseline)."""


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
