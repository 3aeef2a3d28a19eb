"""Publishing from a sharded trainer: every rank publishes the elements it owns; rank 0 commits.

Under torchrun with FSDP2 (``fully_shard``) every parameter is a DTensor sharded on dim 0, so a
rank holds one contiguous range of each flattened HF tensor. A publish drives the store's one
:class:`~aurora_store.bucket.plan.PublishPlan`: rank 0 plans the version (as
:meth:`Run.publish` would) and every rank receives it; each rank makes its
:class:`~aurora_store.bucket.publish.Part` of the version over its ranges (a delta against the
bits it last published, or its shards of a full version); rank 0 commits the parts, which
writes the manifest, and tells every rank the outcome; all raise if it failed. Full versions
spread the safetensors shards of ``plan_shards`` over the ranks (shard g is built and uploaded
by rank g mod W, which receives its tensors point-to-point, one shard at a time), so they are
byte for byte what one process writes.

A publisher that starts on a run with versions (a restart, or after a ConflictError) loads the
latest version once on rank 0 and sends each rank its slices, then continues with deltas.
Control messages are JSON in uint8 tensors: no pickle crosses ranks. What this module adds to
the store is only the collectives around the plan.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from aurora_store import errors
from aurora_store.bucket.plan import KINDS, Kind, PublishPlan, Tip, VersionInfo, check_publish_args
from aurora_store.bucket.publish import Baseline, Part, copy_words, delta_part, elements_part, host
from aurora_store.errors import ConflictError, StoreError, UnsupportedError
from aurora_store.format.delta import DeltaBuilder
from aurora_store.format.full import plan_shards
from trainer.collectives import Collectives
from trainer.shard_ranges import LocalShards, local_words, published_state, range_table

if TYPE_CHECKING:
    from aurora_store.bucket.run import Run

T = TypeVar("T")


class ShardedPublisher:
    """Publishes ``model`` to ``run`` from every rank of ``group`` (collective: all ranks call
    :meth:`publish` together). Without torch.distributed it publishes the whole model through
    :meth:`Run.publish`. Only rank 0's ``run`` needs the signing key; all need the same config."""

    def __init__(
        self, run: Run, model: torch.nn.Module, *, group: Any = None, dtype: torch.dtype | None = torch.bfloat16
    ) -> None:
        self.run = run
        self.model = model
        self.group = group
        self.dtype = dtype
        self._base: Baseline | None = None

    def publish(
        self, *, step: int | None = None, kind: Kind = "auto", meta: Mapping[str, str] | None = None
    ) -> VersionInfo:
        """Commit the model's current weights as the next version; the same VersionInfo on every rank.

        Raises on every rank if any rank failed or the commit did: ConflictError when another
        publisher committed the version (the next call reloads and continues on top of it)."""
        if kind not in KINDS:
            raise StoreError(f"kind must be 'auto', 'full' or 'delta', got {kind!r}")
        step, meta = check_publish_args(step, meta)  # on every rank, before any rank writes a byte
        if not (dist.is_available() and dist.is_initialized()):
            state = {
                k: v.detach().to(self.dtype) if self.dtype is not None and v.is_floating_point() else v.detach()
                for k, v in published_state(self.model).items()
            }
            return self.run.publish(state, kind=kind, step=step, meta=meta)
        t0 = time.perf_counter()
        comm = Collectives(self.group)
        keep = _on_device(self.run.config.extract, self.model)
        local, failure = _attempt(lambda: local_words(self.model, dtype=self.dtype, group=self.group, keep_device=keep))
        planned = None
        if comm.rank == 0 and local is not None:
            held = self._base.tip if self._base is not None else None
            planned, failure = _attempt(lambda: self.run.plan(local.specs, kind=kind, held=held))
        hello = comm.all_gather_json(_report(failure) or self._hello(local, planned))
        self._check(hello, failure)
        assert local is not None
        if len({h["layout"] for h in hello}) != 1:
            raise UnsupportedError("ranks disagree on the tensor table or the run's segment/shard sizes")
        plan = PublishPlan.from_dict(hello[0]["plan"])
        table = range_table(local.specs, [h["ranges"] for h in hello])
        if plan.parent is not None and plan.same_layout and any(h["base"] != plan.parent.version_hash for h in hello):
            self._resync(comm, local, table, plan.parent)
        builder: DeltaBuilder | None = None
        if not plan.full:
            made, failure = _attempt(lambda: self._delta(comm, plan, local))
            parts = self._gather(comm, plan, made[0] if made else None, failure)
            builder = made[1] if made else None
            if plan.outgrows(sum(p.bytes for p in parts)):
                plan, builder = plan.as_full(), None
        if plan.full:
            part, failure = self._full(comm, plan, local, table)
            parts = self._gather(comm, plan, part, failure)
        outcome: Any = None
        if comm.rank == 0:
            info, failure = _attempt(lambda: self.run.commit(plan, parts, step=step, meta=meta))
            outcome = _report(failure) or {"info": None if info is None else dataclasses.asdict(info)}
        outcome = comm.broadcast_json(outcome)
        self._check([outcome], failure if comm.rank == 0 else None)
        info = VersionInfo(**{**outcome["info"], "seconds": time.perf_counter() - t0})
        tip = plan.tip_after(info)
        if builder is not None and self._base is not None:
            self._base.advance(tip, local.words, builder)
        else:
            self._base = Baseline(tip, dict(local.ranges), {k: copy_words(v) for k, v in local.words.items()})
        return info

    # ------------------------------------------------------------ phases

    def _hello(self, local: LocalShards | None, plan: PublishPlan | None) -> dict[str, Any]:
        assert local is not None
        cfg = self.run.config
        ident = [[s.name, s.dtype, list(s.shape)] for s in local.specs], cfg.segment_bytes, cfg.shard_bytes
        base = self._base
        fits = base is not None and base.fits(local.specs, local.ranges)
        return {
            "layout": hashlib.sha256(json.dumps(ident).encode()).hexdigest(),
            "ranges": {k: list(v) for k, v in local.ranges.items()},
            "base": base.tip.version_hash if base is not None and fits else None,
            "plan": None if plan is None else plan.to_dict(),
        }

    def _resync(
        self, comm: Collectives, local: LocalShards, table: dict[str, list[tuple[int, int, int]]], parent: Tip
    ) -> None:
        """Rank 0 loads the parent version once and sends every rank the bits of its ranges."""
        state, failure = None, None
        if comm.rank == 0:
            state, failure = _attempt(lambda: self.run.materialize_words(parent.version))
            if state is not None and state.version_hash != parent.version_hash:
                state, failure = None, ConflictError(f"{self.run.uri}: version {parent.version} changed hash")
        self._check([comm.broadcast_json(_report(failure) or {})], failure)
        words: dict[str, np.ndarray] = {}
        for s in local.specs:
            if comm.rank == 0:
                assert state is not None
                whole = state.words[s.name]
                comm.exchange([(r, whole[lo:hi]) for r, lo, hi in table[s.name] if r != 0], [])
                if s.name in local.ranges:
                    lo, hi = local.ranges[s.name]
                    words[s.name] = whole[lo:hi].copy()
            elif s.name in local.ranges:
                lo, hi = local.ranges[s.name]
                words[s.name] = np.empty(hi - lo, dtype=f"<u{s.width}")
                comm.exchange([], [(0, words[s.name])])
        self._base = Baseline(parent, dict(local.ranges), words)

    def _delta(self, comm: Collectives, plan: PublishPlan, local: LocalShards) -> tuple[Part, DeltaBuilder]:
        """This rank's delta part: its ranges diffed and uploaded (no collectives: failures are reported)."""
        assert self._base is not None
        made = delta_part(
            plan,
            self._base,
            local.words,
            self.run.uploads(plan.version),
            segment_bytes=self.run.config.segment_bytes,
            classed=self.run.config.codec == "classed",
            rank=comm.rank,
            world=comm.size,
        )
        assert made is not None  # only a publisher that may abandon gets None
        return made

    def _full(
        self, comm: Collectives, plan: PublishPlan, local: LocalShards, table: dict[str, list[tuple[int, int, int]]]
    ) -> tuple[Part | None, BaseException | None]:
        """This rank's shards of the full version: shard g is assembled on rank g mod W, built and uploaded
        there. Every rank takes part in every transfer even after a local failure, so none waits forever."""
        failure: BaseException | None = None
        concurrency = self.run.config.concurrency  # bounds the shards held in memory
        uploads = self.run.uploads(plan.version, max_pending=concurrency)
        held = {k: host(v) for k, v in local.words.items()}  # a full version is built on the host
        counting = self.run.store.pool.submit(elements_part, plan.specs, local.ranges, held, self._base)
        for g, members in enumerate(plan_shards(plan.specs, self.run.config.shard_bytes)):
            owner = g % comm.size
            words: dict[str, np.ndarray] = {}
            for s in members:
                mine = held.get(s.name)
                if comm.rank != owner:
                    comm.exchange([(owner, mine)] if mine is not None else [], [])
                    continue
                out = words[s.name] = np.empty(s.numel, dtype=f"<u{s.width}")
                comm.exchange([], [(r, out[lo:hi]) for r, lo, hi in table[s.name] if r != owner])
                if mine is not None:
                    lo, hi = local.ranges[s.name]
                    out[lo:hi] = mine
            if comm.rank == owner and failure is None:
                try:
                    self.run.put_shard(uploads, plan, g, members, words)
                except Exception as exc:  # reported after every transfer is done
                    failure = exc
        entries, failed = _attempt(uploads.wait)
        if failure or failed:
            return None, failure or failed
        counted, failed = _attempt(counting.result)
        if counted is None:
            return None, failed
        changed, digest = counted
        return Part(entries or [], changed, digest), None

    def _gather(
        self, comm: Collectives, plan: PublishPlan, part: Part | None, failure: BaseException | None
    ) -> list[Part]:
        """Every rank's part, on every rank; raises everywhere if any rank failed."""
        reports = comm.all_gather_json(_report(failure) or (part.to_dict() if part is not None else {}))
        self._check(reports, failure)
        return [Part.from_dict(r, plan.specs) for r in reports]

    def _check(self, reports: list[Any], mine: BaseException | None) -> None:
        """Raise on every rank if any rank reported a failure: this rank's own exception if it had one."""
        bad = [(r, rep) for r, rep in enumerate(reports) if "error" in rep]
        if not bad:
            return
        if any(rep["type"] == ConflictError.__name__ for _, rep in bad):
            self._base = None  # the run moved on: the next publish reloads it
        if mine is not None:
            raise mine
        r, rep = bad[0]
        cls = getattr(errors, rep["type"], None)
        if not (isinstance(cls, type) and issubclass(cls, StoreError)):
            cls = StoreError
        raise cls(f"rank {r}: {rep['error']}" if len(reports) > 1 else rep["error"])


def _on_device(extract: str, model: torch.nn.Module) -> bool:
    """Whether this rank extracts its deltas where its shards live (the run's ``extract`` setting)."""
    if extract != "auto":
        return extract == "device"
    return any(p.device.type not in ("cpu", "meta") for p in model.parameters())


def _attempt(fn: Callable[[], T]) -> tuple[T | None, BaseException | None]:
    """Run a rank's local work; a failure must reach the other ranks instead of leaving them waiting."""
    try:
        return fn(), None
    except Exception as exc:  # reported through the next collective, then re-raised on this rank
        return None, exc


def _report(failure: BaseException | None) -> dict[str, str] | None:
    return None if failure is None else {"error": str(failure)[:2000], "type": type(failure).__name__}
