"""The modes of ``aurora bench e2e`` on ``bench.transfer.transfer``'s world: calibration, ideal, ours and full.

Each mode that moves weights starts from an empty world: the trainer publishes version 0 full at home,
it reaches every region's bucket and every actor untimed and around the links, then relays follow home
through the links and actors follow their region's bucket while the step loop of `bench.e2e.loop` runs.
The full mode first times a few full syncs in its world (the calibration), then runs its loop from there.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from aurora_store.coord.coordinator import RegionAnnouncer
from bench.codec.workload import Workload
from bench.e2e.loop import Instant, Synced, Timing, VersionBox, Weights, run_steps
from bench.emulation.phase import (
    Actor,
    CommitOnly,
    Phase,
    await_relays,
    bootstrap,
    final_check,
    follow,
    relay_loop,
    start_thread,
)
from bench.emulation.wan import describe
from bench.emulation.world import INTRA_CONCURRENCY, INTRA_PART_BYTES, World

if TYPE_CHECKING:
    from aurora_store.bucket.run import Run
    from relay.worker import Relay


def links(world: World) -> list[dict[str, Any]]:
    return [{"region": r.name, "link_to": "home", **describe(r.link)} for r in world.regions]


def actor_names(world: World) -> list[str]:
    """As `bench.emulation.phase.bootstrap` names them."""
    return [f"{r.name}/a{j}" for r in world.regions for j in range(world.cfg.actors)]


@dataclass(slots=True)
class _Setup:
    """One mode's world after version 0: the trainer at home, relays following it, actors holding version 0."""

    phase: Phase
    work: Workload
    trainer: Run
    versions: Iterator[tuple[int, dict[str, np.ndarray]]]
    """The trace from version 1 on: the trainer publishes each as it takes it."""
    actors: list[Actor]
    relays: list[Relay]


def _setup(phase: Phase, work: Workload, full: bool) -> _Setup:
    """Version 0 everywhere (untimed, around the links), then relays following home through the links."""
    world, cfg = phase.world, phase.cfg
    coord = phase.opener.coordinator()
    trainer = phase.opener.run(*phase.home_direct(), INTRA_CONCURRENCY, INTRA_PART_BYTES)
    # a relay copies announced objects one at a time: full versions go after their commit, with all its connections
    trainer.announcer = CommitOnly(coord, "home") if full else RegionAnnouncer(coord, "home")
    versions = phase.stack.enter_context(contextlib.closing(work.versions()))
    _, words = next(versions)
    trainer.publish_words(work.specs, words, kind="full", step=work.steps[0])
    actors, _ = bootstrap(phase)
    relays = []
    for r in world.regions:
        relay = phase.relay(r, cfg.full_part_bytes if full else cfg.part_bytes)
        relay.backfill()  # nothing to copy: makes its clients now, not while a version is timed
        phase.start(f"relay {r.name}", relay_loop(relay, phase.stop))
        relays.append(relay)
    await_relays(coord, len(world.regions), phase.tracker)
    return _Setup(phase, work, trainer, versions, actors, relays)


def _calibrate(s: _Setup, count: int) -> dict[str, Any]:
    """Time ``count`` full syncs, one at a time: from the trainer's publish to every actor applied."""
    phase, work = s.phase, s.work
    stop = threading.Event()
    threads = []
    for a in s.actors:
        phase.tracker.expect(a.name)
        loop = functools.partial(follow, a.name, a.updater, a.coord, a.region, stop, phase.tracker, False)
        threads.append(start_thread(f"calibrate {a.name}", loop, phase.tracker))
    records: list[dict[str, Any]] = []
    try:
        for _ in range(count):
            v, words = next(s.versions)
            t0 = time.perf_counter()
            info = s.trainer.publish_words(work.specs, words, kind="full", step=work.steps[v])
            published = time.perf_counter()
            applied = phase.tracker.wait(v, phase.cfg.version_timeout_s)
            per_region: dict[str, float] = {}
            for name, (_, done) in applied.items():
                region = name.split("/", 1)[0]
                per_region[region] = max(per_region.get(region, 0.0), done - t0)
            sync = max(per_region.values())
            records.append(
                {"version": v, "bytes": info.bytes, "publish_s": published - t0, "sync_s": sync}
                | {"per_region_s": per_region}
            )
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    phase.tracker.check()
    return {
        "source": "measured",
        "full_sync_s": sum(r["sync_s"] for r in records) / len(records),
        "versions": records,
        "what": "from the trainer's publish of a full version (at home) to the last actor holding it applied: "
        "relays copy it home -> region over the links after its commit, every actor stages it from its region's "
        "bucket and applies it; one version at a time, in the full mode's world before its loop",
    }


def calibrate(world: World, work: Workload, count: int) -> dict[str, Any]:
    """`_calibrate` in a world of its own, for runs without the full mode."""
    world.reset()
    phase = Phase("calibrate", world, world.cfg)
    try:
        return _calibrate(_setup(phase, work, full=True), count)
    finally:
        phase.close()


def ideal(world: World, timing: Timing) -> dict[str, Any]:
    """No transfer cost: the trainer's publish hands the version to every actor at once; no byte moves."""
    box = VersionBox()
    weights: dict[str, Weights] = {name: Instant(box) for name in actor_names(world)}

    def publish(step: int) -> dict[str, Any]:
        box.publish(step)
        return {"version": step}

    return {
        "how": "actors hold each version the moment the trainer has trained it: no publish, relay, fetch or apply",
        **run_steps(weights, publish, timing),
    }


def synced(
    mode: str, world: World, work: Workload, timing: Timing | Callable[[dict[str, Any]], Timing], calibrate: int = 0
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``ours`` (auto: deltas, cut-through) or ``full`` (every version full) through relays to staging actors.

    With ``calibrate``, first time that many full syncs (see `calibrate`) and make the timing from them.
    Returns the mode's record and the calibration."""
    full = mode == "full"
    world.reset()
    phase = Phase(mode, world, world.cfg)
    try:
        s = _setup(phase, work, full)
        calibration = _calibrate(s, calibrate) if calibrate else None
        if not isinstance(timing, Timing):
            assert calibration is not None, "a timing made from the calibration needs calibrate > 0"
            timing = timing(calibration)
        base = calibrate
        followers = [Synced(a.updater, a.coord, a.region) for a in s.actors]
        weights: dict[str, Weights] = {a.name: w for a, w in zip(s.actors, followers, strict=True)}
        started: dict[int, float] = {}

        def publish(step: int) -> dict[str, Any]:
            v, words = next(s.versions)
            assert v == base + step, (v, base, step)
            started[v] = time.perf_counter()
            info = s.trainer.publish_words(work.specs, words, kind="full" if full else "auto", step=work.steps[v])
            return {"version": v, "kind": info.kind, "bytes": info.bytes, "changed": info.changed}

        before = world.snapshot()
        start = {rl.dest_region: (rl.stats.versions, rl.stats.bytes) for rl in s.relays}
        loop = run_steps(weights, publish, timing, check=phase.tracker.check, base_version=base)
        _add_sync_times(loop, started, followers, timing)
        after = world.snapshot()
        relayed = {}
        for rl in s.relays:
            n0, b0 = start[rl.dest_region]
            relayed[rl.dest_region] = (rl.stats.versions - n0, rl.stats.bytes - b0)
        final = []
        for a in s.actors:
            assert a.updater.applied is not None
            manifest = s.trainer.manifest(a.updater.applied.version)
            final.append(final_check(a.name, a.updater, manifest, world.cfg.verify_live))
        phase.tracker.check()
    finally:
        phase.close()
    return _record(mode, loop, relayed, before, after, final), calibration


def _add_sync_times(loop: dict[str, Any], started: dict[int, float], followers: list[Synced], timing: Timing) -> None:
    """Per step, seconds from the trainer's publish to every actor holding the version (or a newer one)
    staged; the budget to hide it is generation_s - training_s (its batch starts that long after).

    A version some actor had not staged when the run ended has no sync time; it took at least until
    then, which ``sync_s_at_least`` counts (a mean that is a lower bound when any step is unfinished)."""
    ended = time.perf_counter()
    for step in loop["steps"]:
        times = [min((t for sv, t in w.staged_at if sv >= step["version"]), default=None) for w in followers]
        done = None if None in times else max(t for t in times if t is not None)
        step["sync_s"] = done - started[step["version"]] if done is not None else None
    timed = loop["steps"][timing.warmup_steps :]
    synced = [st["sync_s"] for st in timed if st["sync_s"] is not None]
    loop["sync_s"] = sum(synced) / len(synced) if synced else None
    bounds = [st["sync_s"] if st["sync_s"] is not None else ended - started[st["version"]] for st in timed]
    loop["sync_s_at_least"] = sum(bounds) / len(bounds) if bounds else None
    loop["unsynced_steps"] = len(timed) - len(synced)
    loop["sync_budget_s"] = timing.generation_s - timing.training_s


def _record(
    mode: str,
    loop: dict[str, Any],
    relayed: dict[str, tuple[int, int]],
    before: dict[str, Any],
    after: dict[str, Any],
    final: list[dict[str, Any]],
) -> dict[str, Any]:
    steps = loop["steps"]
    down = {r: after["links"][r]["bytes_down"] - before["links"][r]["bytes_down"] for r in after["links"]}
    cpu = after["cpu_s"] - before["cpu_s"] if after["cpu_s"] is not None and before["cpu_s"] is not None else None
    wall = steps[-1]["end"]
    how = {
        "ours": "trainer publishes with kind=auto (deltas; each segment announced as it is uploaded: cut-through); "
        "a relay per region copies each delta home -> region as it appears; actors stage the newest version "
        "while generating and apply it at the next batch boundary",
        "full": "trainer publishes every version full; relays copy it home -> region after its commit; actors "
        "stage the newest full version while generating and apply it at the next batch boundary",
    }[mode]
    return {
        "how": how,
        **loop,
        "kinds": sorted({s["kind"] for s in steps}),
        "payload_bytes_per_version": sum(s["bytes"] for s in steps) / len(steps),
        "link_bytes_down": down,
        "versions_relayed": {r: n for r, (n, _) in relayed.items()},
        "relay_payload_bytes": {r: b for r, (_, b) in relayed.items()},
        "link_bytes_per_relayed_version": {r: down[r] / relayed[r][0] if relayed[r][0] else None for r in down},
        "cpu_s": cpu,
        "cpu_busy_cores": cpu / wall if cpu is not None and wall else None,
        "final": final,
        "bit_exact": all(f["bit_exact"] for f in final),
    }
