"""The modes of ``aurora bench e2e`` on ``bench.transfer``'s world: calibration, ideal, ours and full.

Each mode that moves weights starts from an empty world: the trainer publishes version 0 full at home,
it reaches every region's bucket and every actor untimed and around the links, then relays follow home
through the links and actors follow their region's bucket while the step loop of `bench.e2e_loop` runs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aurora_store.coord import RegionAnnouncer
from bench.e2e_loop import Instant, Synced, Timing, VersionBox, Weights, run_steps
from bench.transfer import (
    INTRA_CONCURRENCY,
    INTRA_PART_BYTES,
    Workload,
    _Actor,
    _await_relays,
    _bind_follow,
    _bootstrap,
    _CommitOnly,
    _final_check,
    _Phase,
    _relay_loop,
    _World,
)
from bench.wan import describe

if TYPE_CHECKING:
    from aurora_store.run import Run
    from relay.worker import Relay


def links(world: _World) -> list[dict[str, Any]]:
    return [{"region": r.name, "link_to": "home", **describe(r.link)} for r in world.regions]


def actor_names(world: _World) -> list[str]:
    """As `bench.transfer._bootstrap` names them."""
    return [f"{r.name}/a{j}" for r in world.regions for j in range(world.cfg.actors)]


def _start(
    phase: _Phase, work: Workload, mode: str
) -> tuple[Run, Callable[[], tuple[int, dict[str, Any]]], list[_Actor], list[Relay]]:
    """Version 0 everywhere (untimed), then relays following home through the links.

    Returns the trainer's run, a function that advances the trace by one version, the actors and the relays.
    """
    world, cfg = phase.world, phase.cfg
    full = mode != "ours"
    coord = phase.coordinator()
    trainer = phase.run(*phase.home_direct(), INTRA_CONCURRENCY, INTRA_PART_BYTES)
    # a relay copies announced objects one at a time: full versions go after their commit, with all its connections
    trainer.announcer = _CommitOnly(coord, "home") if full else RegionAnnouncer(coord, "home")
    versions = phase.stack.enter_context(contextlib.closing(work.versions()))
    _, words = next(versions)
    trainer.publish_words(work.specs, words, kind="full", step=work.steps[0])
    actors, _ = _bootstrap(phase)
    relays = []
    for r in world.regions:
        relay = phase.relay(r, cfg.full_part_bytes if full else cfg.part_bytes)
        relay.backfill()  # nothing to copy: makes its clients now, not while a version is timed
        phase.start(f"relay {r.name}", _relay_loop(relay, phase.stop))
        relays.append(relay)
    _await_relays(coord, len(world.regions), phase.tracker)
    return trainer, lambda: next(versions), actors, relays


def calibrate(world: _World, work: Workload, count: int) -> dict[str, Any]:
    """Time ``count`` full syncs: from the trainer's publish of a full version to every actor applied."""
    world.reset()
    phase = _Phase("calibrate", world, world.cfg)
    try:
        trainer, advance, actors, _ = _start(phase, work, "calibrate")
        for a in actors:
            phase.tracker.expect(a.name)
            phase.start(f"actor {a.name}", _bind_follow(a, phase.stop, phase.tracker, reload=False))
        records: list[dict[str, Any]] = []
        for _ in range(count):
            v, words = advance()
            t0 = time.perf_counter()
            info = trainer.publish_words(work.specs, words, kind="full", step=work.steps[v])
            published = time.perf_counter()
            applied = phase.tracker.wait(v, world.cfg.version_timeout_s)
            per_region: dict[str, float] = {}
            for name, (_, done) in applied.items():
                region = name.split("/", 1)[0]
                per_region[region] = max(per_region.get(region, 0.0), done - t0)
            sync = max(per_region.values())
            records.append(
                {
                    "version": v,
                    "bytes": info.bytes,
                    "publish_s": published - t0,
                    "sync_s": sync,
                    "per_region_s": per_region,
                }
            )
        phase.tracker.check()
    finally:
        phase.close()
    return {
        "source": "measured",
        "full_sync_s": sum(r["sync_s"] for r in records) / len(records),
        "versions": records,
        "what": "from the trainer's publish of a full version (at home) to the last actor holding it applied: "
        "relays copy it home -> region over the links after its commit, every actor stages it from its region's "
        "bucket and applies it; generation_s = full_sync_s / sync_over_generation",
    }


def ideal(world: _World, timing: Timing) -> dict[str, Any]:
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


def synced(mode: str, world: _World, work: Workload, timing: Timing) -> dict[str, Any]:
    """``ours`` (auto: deltas, cut-through) or ``full`` (every version full) through relays to staging actors."""
    full = mode == "full"
    world.reset()
    phase = _Phase(mode, world, world.cfg)
    try:
        trainer, advance, actors, relays = _start(phase, work, mode)
        weights: dict[str, Weights] = {a.name: Synced(a.updater, a.coord, a.region) for a in actors}

        def publish(step: int) -> dict[str, Any]:
            v, words = advance()
            assert v == step, (v, step)
            info = trainer.publish_words(work.specs, words, kind="full" if full else "auto", step=work.steps[v])
            return {"version": v, "kind": info.kind, "bytes": info.bytes, "changed": info.changed}

        before = world.snapshot()
        loop = run_steps(weights, publish, timing, check=phase.tracker.check)
        after = world.snapshot()
        final = []
        for a in actors:
            assert a.updater.held is not None
            manifest = trainer.manifest(a.updater.held.version)
            final.append(_final_check(a.name, a.updater, manifest, world.cfg.verify_live))
        phase.tracker.check()
    finally:
        phase.close()
    return _synced_record(mode, loop, relays, before, after, final)


def _synced_record(
    mode: str,
    loop: dict[str, Any],
    relays: list[Relay],
    before: dict[str, Any],
    after: dict[str, Any],
    final: list[dict[str, Any]],
) -> dict[str, Any]:
    steps = loop["steps"]
    down = {r: after["links"][r]["bytes_down"] - before["links"][r]["bytes_down"] for r in after["links"]}
    relayed = {rl.dest_region: len(rl.stats.versions) for rl in relays}
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
        "versions_relayed": relayed,
        "link_bytes_per_relayed_version": {r: down[r] / relayed[r] if relayed[r] else None for r in down},
        "relay_payload_bytes": {rl.dest_region: rl.stats.bytes for rl in relays},
        "cpu_s": cpu,
        "cpu_busy_cores": cpu / wall if cpu is not None and wall else None,
        "final": final,
        "bit_exact": all(f["bit_exact"] for f in final),
    }
