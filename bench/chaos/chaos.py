"""``aurora bench chaos``: the whole system as real processes under a seeded schedule of faults.

A real ``redis-server`` (no persistence), a moto S3 server per region (home, eu, ap), each other
region's reads of home through a `bench.emulation.world.ProxyProcess` WAN link, and all of that region's
traffic to Redis and home through a partitionable gate (`bench.chaos.gates.Gates`); the trainer
(``aurora train``, signed, its state saved every ``--state-every`` versions), a relay into each
other region and actors in all three (`bench.chaos.world.World`). The schedule
(`bench.chaos.schedule`, ``random.Random(seed)``) kills roles at chosen moments, restarts or flushes
Redis, partitions regions, damages and forges objects and Redis entries
(`bench.chaos.faults.Faults`); a supervisor (`bench.chaos.supervisor`) restarts what died after a
short seeded delay, as systemd would. After a settle period in which the trainer must finish its
steps, `bench.chaos.check` checks the invariants. Every process runs in a process group of its own
and all are stopped at the end, on Ctrl-C and on errors too; their logs stay in the run's work
directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
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

from aurora_store.config.options import option
from aurora_store.errors import ConfigError
from aurora_store.format.keys import manifest_key
from bench.chaos import schedule as chaos_schedule
from bench.chaos.check import summarize
from bench.chaos.config import Config, from_replayable, replayable
from bench.chaos.evidence import leave_evidence
from bench.chaos.faults import Faults
from bench.chaos.schedule import kinds_of, plan
from bench.chaos.supervisor import Supervisor
from bench.chaos.sweep import parse_seeds, passed, render_sweep, sweep
from bench.chaos.world import REGIONS, RUN, World
from bench.output import Output, comma_list, emit, overridden


def measure(cfg: Config) -> dict[str, Any]:
    """Run the schedule against the whole system, settle, check; the JSON-ready result."""
    t0 = time.monotonic()
    work = Path(cfg.workdir or tempfile.mkdtemp(prefix="aurora-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(cfg.seed)
    planned = cfg.planned
    if planned is None:
        planned = plan(cfg.seed, cfg.faults, kinds_of(cfg.kinds), cfg.interval_s)
    chaos_schedule.write(work / SCHEDULE_FILE, replayable(cfg), planned)  # first: a run that dies leaves it too
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
        for i, fault in enumerate(planned):
            _wait(sup, faults, lambda: sup.finished, fault.gap_s)
            if sup.finished:
                notes.append(f"the trainer finished before the schedule: {len(planned) - i} faults not injected")
                break
            faults.inject(fault.kind, fault.rng())
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
    result = summarize(
        seed=cfg.seed, requested=len(planned), steps=last, prompts=cfg.prompts, faults=faults, counts=sup.counts,
        crashes=sup.crashes, admissions=world.admissions, regions=regions, work=work, t0=t0,
        calm_steps=cfg.calm_steps, notes=notes, extra=extra,
    )  # fmt: skip
    result["schedule"] = str(work / SCHEDULE_FILE)
    result["evidence"] = leave_evidence(result, work)
    (work / RESULT_FILE).write_text(json.dumps(result) + "\n")
    return result


SCHEDULE_FILE = "schedule.json"
"""What every run leaves in its work directory: its config and faults (``--replay`` runs it again)."""
RESULT_FILE = "result.json"
"""The run's JSON, as ``--json`` prints it, beside its logs."""


def replay_config(path: str, workdir: str | None) -> Config:
    """The config of a run from the schedule file it left (``--replay``), writing into ``workdir``."""
    config, planned = chaos_schedule.read(path)
    cfg = from_replayable(config, path)
    return dataclasses.replace(cfg, planned=planned, faults=len(planned), workdir=workdir)


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
    seeds: str | None = None
    """Sweep seeds instead of one: a range (1-10) or a list (3,7,9); one run each, one after the
    other, each in WORKDIR/seed-N; one JSON object with a row per seed and a summary."""
    replay: str | None = None
    """Run the schedule a run left (WORKDIR/schedule.json) again: its config and faults, in the same
    order after the same waits, each drawing its targets from the same seed (other flags but --workdir
    and --json are ignored)."""


def run(args: Flags) -> int:
    if args.seeds is not None and args.replay is not None:
        raise ConfigError("--seeds and --replay: give one (a sweep draws each seed's schedule, a replay one file's)")
    with _sigterm_interrupts():
        if args.seeds is not None:
            swept = sweep(overridden(_DEFAULT, args), parse_seeds(args.seeds), measure)
            emit(swept, args, render_sweep)
            return 1 if swept["summary"]["failed"] else 0
        cfg = replay_config(args.replay, args.workdir) if args.replay is not None else overridden(_DEFAULT, args)
        result = measure(cfg)
    emit(result, args, _render)
    return 0 if passed(result) else 1


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
    out.print(f"logs: {result['workdir']}; the schedule, to run again: --replay {result['schedule']}")
    if result["evidence"]:
        out.print(f"evidence of the first violated invariant: {result['evidence']}")
