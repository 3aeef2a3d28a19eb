"""The modes of ``aurora bench transfer`` (deltas through relays, full versions through relays, deltas
read straight from home), the fetch-throughput check and the cut-through publish check."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from aurora_store.bucket.limits import Limits
from aurora_store.bucket.objectstore import ObjectStore, RangeRequest
from aurora_store.bucket.plan import VersionInfo
from aurora_store.bucket.run import Run, open_run
from aurora_store.coord.coordinator import RegionAnnouncer
from aurora_store.format.delta import DeltaBuilder, SealedObject
from aurora_store.format.digest import Digest, tensor_keys
from aurora_store.format.manifest import TensorSpec
from bench.codec.workload import Workload
from bench.emulation.phase import CommitOnly, Phase, await_relays, bind_follow, bootstrap, final_check, relay_loop
from bench.emulation.world import INTRA_CONCURRENCY, INTRA_PART_BYTES, BenchError, Config, World, s3_options

if TYPE_CHECKING:
    pass


def run_mode(mode: str, world: World, work: Workload, cfg: Config, tick: Callable[[str], None]) -> dict[str, Any]:
    """Version 0 everywhere (untimed), then ``cfg.versions`` timed versions; returns the mode's record."""
    world.reset()
    full = mode == "full_relay"
    phase = Phase(mode, world, cfg)
    try:
        coord = phase.opener.coordinator()
        trainer = phase.opener.run(*phase.home_direct(), INTRA_CONCURRENCY, INTRA_PART_BYTES)
        trainer.announcer = CommitOnly(coord, "home") if full else RegionAnnouncer(coord, "home")
        versions = phase.stack.enter_context(contextlib.closing(work.versions()))
        _, words = next(versions)
        tick(f"{mode}: version 0")
        v0 = trainer.publish_words(work.specs, words, kind="full", step=work.steps[0])
        actors, boot = bootstrap(phase)

        # the steady state: relays stream, actors follow
        part_bytes = cfg.full_part_bytes if full else cfg.part_bytes
        if mode != "delta_direct":
            for r in world.regions:
                relay = phase.relay(r, part_bytes)
                relay.backfill()  # nothing to copy: makes its clients now, not while the first version is timed
                phase.start(f"relay {r.name}", relay_loop(relay, phase.stop))
            await_relays(coord, len(world.regions), phase.tracker)
        for a in actors:
            phase.tracker.expect(a.name)
            phase.start(f"actor {a.name}", bind_follow(a, phase.stop, phase.tracker, reload=full))

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
            records.append(version_record(v, work.steps[v], last, t_step, published, applied, before, after))
        manifest = trainer.manifest(last.version)
        final = [final_check(a.name, a.updater, manifest, cfg.verify_live) for a in actors]
        phase.tracker.check()
    finally:
        phase.close()
    return mode_record(mode, v0, records, final, boot, part_bytes, len(manifest.to_bytes()))


def version_record(
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


def mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def mode_record(
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
        "time_to_apply_s": mean([r["slowest_s"] for r in records]),
        "per_region_s": {g: mean([r["per_region_s"][g] for r in records]) for g in regions},
        "region_has_it_s": {g: mean([r["region_has_it_s"][g] for r in records]) for g in regions},
        "link_bytes_per_version": {g: mean([r["link_bytes_down"][g] for r in records]) for g in regions},
        "publish_s": mean([r["publish_s"] for r in records]),
        "cpu_busy_cores": mean([r["cpu_busy_cores"] for r in records if r["cpu_busy_cores"] is not None]),
        "payload_bytes": mean([r["bytes"] for r in records]),
        "final": final,
        "bit_exact": all(f["bit_exact"] for f in final),
    }


def fetch_throughput(world: World, cfg: Config) -> dict[str, Any]:
    """The same objects from home through one link: one connection, whole objects one after another,
    then ``connections`` ranged GETs at once (the objects cut into as many equal parts)."""
    r = world.regions[0]
    size = cfg.fetch_object_bytes
    count = max(1, cfg.fetch_bytes // size)
    keys = [f"fetch/{i:05d}" for i in range(count)]
    rng = np.random.default_rng(cfg.seed)
    with contextlib.ExitStack() as stack:
        home = ObjectStore(world.home_uri("fetch"), s3_options(world.home, 16), concurrency=8)
        stack.callback(home.close)
        for _ in home.map(lambda k: home.put_if_absent(k, rng.bytes(size)), keys):
            pass
        total = count * size
        seconds = {}
        requests: dict[str, int] = {}
        for label, n in (("1", 1), ("N", cfg.connections)):
            s = ObjectStore(world.home_uri("fetch"), s3_options(world.home, n, r.proxy.endpoint), concurrency=n)
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
            world.home_uri("fetch"), s3_options(world.home, cfg.connections), concurrency=cfg.connections
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


def publish_once(
    uri: str, options: dict[str, Any], specs: tuple[TensorSpec, ...], words: dict[str, np.ndarray], cfg: Config
) -> None:
    with open_run(uri, storage_options=options, shard_bytes=cfg.shard_bytes) as run:
        run.publish_words(specs, words, kind="full")


def publish_check(world: World, work: Workload, cfg: Config) -> dict[str, Any]:
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

        publish_once(uri, s3_options(world.home, 16), work.specs, next(versions)[1], cfg)  # version 0, inside home
        remote = run_at(s3_options(world.home, 2 * n, r.proxy.endpoint), n)
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

        scratch_options = s3_options(world.home, 2 * n, r.proxy.endpoint)
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
