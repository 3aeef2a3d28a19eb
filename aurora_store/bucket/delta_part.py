"""One rank's part of a delta version: its ranges diffed against its baseline into segments.

A forced delta streams its segments as they are sealed (cut-through), and so does an ``auto`` one
when the last delta says it will fit the chain budget with room to spare (:data:`STREAM_MARGIN`);
otherwise its segments are buffered in memory until every rank's size is known, so nothing is written
for a delta that is then abandoned for a full version. A streamed delta that outgrows the budget
all the same is published full and its segments removed.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np

from aurora_store.bucket.collective import agree
from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.bucket.parts import Baseline, Part, PartContext, Share, Uploads, Words, host
from aurora_store.bucket.plan import PublishPlan
from aurora_store.errors import StoreError
from aurora_store.format import dtypes
from aurora_store.format.delta import DeltaBuilder, SealedObject
from aurora_store.format.manifest import Segment, TensorSpec

log = logging.getLogger("aurora.store")

STREAM_MARGIN = 4
"""An ``auto`` delta streams (cut-through) when the chain plus this many times the last delta's
bytes stays within a full copy: a delta that grew more than that since the last one is the rare
case, and then its streamed segments are removed when it is published full instead."""


def delta_part(
    plan: PublishPlan,
    share: Share,
    base: Baseline,
    ctx: PartContext,
    *,
    floor: int,
    last_delta_bytes: int | None,
) -> tuple[DeltaBuilder | None, list[Part]]:
    """Every rank's delta part, on every rank, and this rank's builder; (None, []) when the plan turns
    full: an ``auto`` delta whose chain would outgrow a full copy's bytes, or whose manifest (``floor``
    bytes without its segments, plus theirs) would outgrow the readers' cap. ``last_delta_bytes``:
    the last delta this publisher committed, which decides whether this one streams."""
    store, config, collective = ctx.store, ctx.config, ctx.collective
    stream = streams(plan, last_delta_bytes)
    uploads = ctx.uploads(plan.version, buffer=not stream)

    def encode() -> tuple[DeltaBuilder, dict[str, Any]]:
        try:
            builder, stopped = encode_delta(
                plan,
                base,
                share.words,
                uploads,
                segment_bytes=config.segment_bytes,
                classed=config.codec == "classed",
                rank=collective.rank,
                world=collective.size,
            )
        except Exception:
            if stream:  # what did go up has finished before the failure is reported
                with contextlib.suppress(Exception):
                    uploads.wait()
            raise
        if stream:  # a streamed delta's uploads have all finished before any rank moves on
            uploads.wait()
        size = {"bytes": builder.encoded_bytes, "stopped": stopped}
        return builder, {**size, "entries": [sum(uploads.entry_bytes), len(uploads.entry_bytes)]}

    builder, sizes = agree(collective, encode)
    n = sum(s["entries"][1] for s in sizes)  # with their commas: never more than the real manifest
    manifest_bytes = floor + sum(s["entries"][0] for s in sizes) + max(n - 1, 0)
    cap = config.limits.max_manifest_bytes
    if plan.kind == "auto" and (
        any(s["stopped"] for s in sizes) or plan.outgrows(sum(s["bytes"] for s in sizes)) or manifest_bytes > cap
    ):
        if manifest_bytes > cap:
            log.warning(
                "%s: version %d: a delta manifest of at least %d bytes would be over the cap of %d; publishing it full",
                store.uri,
                plan.version,
                manifest_bytes,
                cap,
            )
        if stream:
            _remove(store, plan, uploads.wait())
        uploads.drop()
        return None, []
    uploads.release()

    def uploaded() -> tuple[None, dict[str, Any]]:
        return None, Part(uploads.wait(), builder.changed, builder.digest_change()).to_dict()

    _, parts = agree(collective, uploaded)
    return builder, [Part.from_dict(p, plan.specs) for p in parts]


def streams(plan: PublishPlan, last_delta_bytes: int | None) -> bool:
    """Whether this delta's segments go up as they are sealed, before its size is known."""
    if plan.kind != "auto":
        return True  # a forced delta is never abandoned
    chain = plan.parent.chain_bytes if plan.parent is not None else 0
    return last_delta_bytes is not None and chain + STREAM_MARGIN * last_delta_bytes <= plan.full_bytes


def _remove(store: ObjectStore, plan: PublishPlan, entries: list[Segment]) -> None:
    """Remove the segments of a streamed delta that was abandoned for a full version (best effort:
    they belong to no manifest either way; a relay may already hold copies)."""
    log.warning(
        "%s: version %d: a delta outgrew the chain budget or the manifest cap after its segments were "
        "uploaded; publishing it full and removing its %d segments",
        store.uri,
        plan.version,
        len(entries),
    )
    try:
        store.delete([e.key for e in entries])
    except StoreError as exc:
        log.warning("%s: version %d: could not remove the abandoned segments: %s", store.uri, plan.version, exc)


def encode_delta(
    plan: PublishPlan,
    base: Baseline,
    words: Words,
    uploads: Uploads,
    *,
    segment_bytes: int,
    classed: bool = True,
    rank: int = 0,
    world: int = 1,
) -> tuple[DeltaBuilder, bool]:
    """Diff the publisher's ranges (``words``, against ``base``) into segments, submitting each to
    ``uploads`` as it is sealed. Rank ``r`` of ``world`` numbers its segments r, r + world, ... so
    ranks never collide. ``classed``: whether float blocks may use the classed codec. Returns the
    builder and whether it stopped early: a delta the plan may turn full stops as soon as this
    publisher's bytes alone make the chain outgrow a full copy (nothing more is worth encoding)."""
    builder = DeltaBuilder(
        plan.version, plan.specs, segment_bytes, first_ordinal=rank, ordinal_step=world, use_classed=classed
    )
    for s in plan.specs:
        if s.name not in base.ranges:
            continue
        for obj in _add(builder, s, base.beside(s.name, words[s.name]), words[s.name], base.ranges[s.name][0]):
            uploads.submit(obj)
        if plan.outgrows(builder.encoded_bytes):
            return builder, True
    for obj in builder.finish():
        uploads.submit(obj)
    return builder, False


def _add(builder: DeltaBuilder, spec: TensorSpec, old: Any, new: Any, start: int) -> Iterator[SealedObject]:
    """One tensor's changes into ``builder``, extracted where its words live."""
    if isinstance(new, np.ndarray):
        return builder.add_tensor(spec, old, new, start=start)
    from aurora_store import device  # torch: only for a publisher whose words are on a device

    dt = dtypes.dtype(spec.dtype)
    if not dt.sparse:  # integers, bools, F64: a changed tensor is written whole, from the host
        return builder.add_tensor(spec, host(old), host(new), start=start)
    ex = device.extract(old, new, dt.exponent)
    return builder.add_extracted(spec, ex, new.numel(), start, lambda lo, hi: device.sizes(old[lo:hi], dt.exponent))
