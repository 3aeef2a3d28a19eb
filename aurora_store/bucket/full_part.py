"""One rank's part of a full version: the shards it builds, and what its ranges changed.

Shard g of :func:`~aurora_store.format.full.plan_shards` is assembled on rank g mod W from every
rank's ranges, built and uploaded there, so the shards are byte for byte what one process writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from aurora_store.bucket.collective import agree
from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.bucket.parts import Baseline, Part, PartContext, Ranges, Share, Uploads, host
from aurora_store.bucket.plan import Latest, PublishPlan
from aurora_store.format.delta import SealedObject
from aurora_store.format.digest import Digest, tensor_keys
from aurora_store.format.full import build_shard, plan_shards, shard_words
from aurora_store.format.keys import version_dir
from aurora_store.format.manifest import TensorSpec

_DIGEST_CHUNK = 1 << 20


def full_part(
    plan: PublishPlan,
    share: Share,
    table: dict[str, list[tuple[int, int, int]]],
    base: Baseline | None,
    ctx: PartContext,
) -> tuple[dict[str, np.ndarray], list[Part]]:
    """Every rank's part of the full version, on every rank, and views into the shards built here of
    the tensors this rank owns whole: its next baseline, so a single process copies the model once,
    into the shards. ``table``: who owns which elements of each tensor (every rank's ranges)."""

    def build() -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        built, part = _build(plan, share, table, base, ctx)
        return built, part.to_dict()

    built, parts = agree(ctx.collective, build)
    return built, [Part.from_dict(p, plan.specs) for p in parts]


def _build(
    plan: PublishPlan,
    share: Share,
    table: dict[str, list[tuple[int, int, int]]],
    base: Baseline | None,
    ctx: PartContext,
) -> tuple[dict[str, np.ndarray], Part]:
    """This rank's shards. Every rank takes part in every transfer even after a local failure, which is
    raised only once they are all done, so none waits forever."""
    store, config, comm = ctx.store, ctx.config, ctx.collective
    failure: BaseException | None = None
    uploads = ctx.uploads(plan.version, max_pending=config.concurrency)  # bounds the shards in memory
    held = {k: host(v) for k, v in share.words.items()}  # a full version is built on the host
    counting = store.pool.submit(elements_part, plan.specs, share.ranges, held, base, plan.parent)
    built: dict[str, np.ndarray] = {}
    for g, members in enumerate(plan_shards(plan.specs, config.shard_bytes)):
        owner = g % comm.size
        words: dict[str, np.ndarray] = {}
        for s in members:
            mine = held.get(s.name)
            if comm.rank != owner:
                comm.exchange([(owner, mine)] if mine is not None else [], [])
                continue
            if share.ranges.get(s.name) == (0, s.numel):
                assert mine is not None
                words[s.name] = mine  # owned whole: no assembly
                continue
            out = words[s.name] = np.empty(s.numel, dtype=f"<u{s.width}")
            comm.exchange([], [(r, out[lo:hi]) for r, lo, hi in table[s.name] if r != owner])
            if mine is not None:
                lo, hi = share.ranges[s.name]
                out[lo:hi] = mine
        if comm.rank == owner and failure is None:
            try:
                shard = _put_shard(store, uploads, plan, g, members, words)
                views = shard_words(shard)
                built.update({s.name: views[s.name] for s in members if share.ranges.get(s.name) == (0, s.numel)})
            except Exception as exc:  # raised once every transfer is done
                failure = exc
    try:
        entries = uploads.wait()
    except Exception:
        if failure is None:
            raise
        entries = []
    if failure is not None:
        raise failure
    changed, digest, known = counting.result()
    return built, Part(entries, changed, digest, known)


def _put_shard(
    store: ObjectStore,
    uploads: Uploads,
    plan: PublishPlan,
    ordinal: int,
    members: list[TensorSpec],
    words: Mapping[str, Any],
) -> SealedObject:
    """Build shard ``ordinal`` of full version ``plan`` and submit it to ``uploads``. On a local store
    its bytes are written while it is being hashed, and only linked under its key then."""
    staged = store.stage(version_dir(plan.version))
    try:
        shard = build_shard(plan.version, ordinal, plan.specs, members, words, sink=staged.write if staged else None)
    except BaseException:
        if staged is not None:
            staged.discard()
        raise
    uploads.submit(shard, staged)
    return shard


def elements_part(
    specs: tuple[TensorSpec, ...],
    ranges: Ranges,
    words: Mapping[str, np.ndarray],
    base: Baseline | None,
    parent: Latest | None,
) -> tuple[int, Digest, bool]:
    """For a full version: how many elements of the ranges changed since ``parent``, the ranges' share
    of the weights digest (O(elements)), and whether that count is known: it is counted only against
    ``base`` holding the parent's very bits (same tensor table, same hash), never against a baseline of
    another version. Otherwise every element is counted and the count is not known (a new chain's
    count is known all the same: :meth:`~aurora_store.bucket.plan.PublishPlan.manifest` says so)."""
    digest = Digest()
    changed = 0
    comparable = (
        parent is not None
        and parent.specs == specs
        and base is not None
        and base.fits(specs, ranges)
        and base.latest.version_hash == parent.version_hash
    )
    for s in specs:
        if s.name not in ranges:
            continue
        lo, hi = ranges[s.name]
        new = words[s.name]
        keys = tensor_keys(s.name, s.dtype, s.shape)
        if lo == 0 and hi == s.numel:
            digest.add_tensor(keys, new)  # whole tensors use every core
        else:
            for a in range(0, new.size, _DIGEST_CHUNK):
                b = min(a + _DIGEST_CHUNK, new.size)
                digest.add_elements(keys, np.arange(lo + a, lo + b, dtype=np.uint64), new[a:b])
        changed += int(np.count_nonzero(host(base.words[s.name]) != new)) if comparable and base else hi - lo
    return changed, digest, comparable
