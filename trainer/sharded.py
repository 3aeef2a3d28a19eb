"""Publishing from a sharded trainer: each rank publishes the shards it owns; rank 0 commits.

Under torchrun with FSDP2 (``fully_shard``) every parameter is a DTensor sharded on dim 0, so
a rank holds one contiguous range of each flattened HF tensor. Per version, each rank casts its
ranges to BF16, diffs them with the same ranges of the last version (the only copy it keeps),
uploads segments of its own blocks (positions global; keys numbered r, r + W, r + 2W, ...) and
hands rank 0 its segment entries, changed count and share of the additive weights digest.
Rank 0 writes the manifest, which is the commit, and tells every rank the outcome; all raise
if it failed. Full versions spread the safetensors shards of ``plan_shards`` over the ranks
(shard g is built and uploaded by rank g mod W, which receives its tensors point-to-point, one
shard at a time), so they are byte for byte what one process writes; rank 0 adds the index.

A publisher that starts on a run with versions (a restart, or after a ConflictError) loads the
latest version once on rank 0 and sends each rank its slices, then continues with deltas.
Control messages are JSON in uint8 tensors: no pickle crosses ranks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from aurora_store import errors
from aurora_store.delta import DeltaBuilder
from aurora_store.digest import Digest, tensor_keys
from aurora_store.errors import ConflictError, LayoutError, StoreError, UnsupportedError
from aurora_store.full import build_index, build_shard, plan_shards
from aurora_store.manifest import Block, Parent, Segment, TensorSpec, manifest_key
from aurora_store.run import VersionInfo
from trainer.collectives import Collectives
from trainer.shard_ranges import LocalShards, local_words, range_table

if TYPE_CHECKING:
    from aurora_store.run import Run

T = TypeVar("T")
_SIGNED = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_DIGEST_CHUNK = 1 << 20


@dataclass(slots=True)
class _Baseline:
    """What this rank last published: its ranges' bits at ``version``, and the version's identity."""

    version: int
    version_hash: str
    digest: Digest
    chain_bytes: int
    specs: tuple[TensorSpec, ...]
    ranges: dict[str, tuple[int, int]]
    words: dict[str, np.ndarray]


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
        self._base: _Baseline | None = None

    def publish(
        self,
        *,
        step: int | None = None,
        kind: Literal["auto", "full", "delta"] = "auto",
        meta: Mapping[str, str] | None = None,
    ) -> VersionInfo:
        """Commit the model's current weights as the next version; the same VersionInfo on every rank.

        Raises on every rank if any rank failed or the commit did: ConflictError when another
        publisher committed the version (the next call reloads and continues on top of it)."""
        if kind not in ("auto", "full", "delta"):
            raise StoreError(f"kind must be 'auto', 'full' or 'delta', got {kind!r}")
        if not (dist.is_available() and dist.is_initialized()):
            state = {
                k: v.detach().to(self.dtype) if self.dtype is not None and v.is_floating_point() else v.detach()
                for k, v in self.model.state_dict().items()
            }
            return self.run.publish(state, kind=kind, step=step, meta=meta)
        t0 = time.perf_counter()
        comm = Collectives(self.group)
        local, failure = _attempt(lambda: local_words(self.model, dtype=self.dtype, group=self.group))
        plan = None
        if comm.rank == 0 and local is not None:
            plan, failure = _attempt(lambda: self._plan(local.specs, kind))
        hello = comm.all_gather_json(_report(failure) or self._hello(local, plan))
        self._check(hello, failure)
        assert local is not None
        if len({h["layout"] for h in hello}) != 1:
            raise UnsupportedError("ranks disagree on the tensor table or the run's segment/shard sizes")
        plan = hello[0]["plan"]
        table = range_table(local.specs, [h["ranges"] for h in hello])
        parent = plan["parent"]
        if parent is not None and not plan["layout_changed"]:
            stale = any(h["base"] != [parent["version"], True] for h in hello)
            if stale:
                self._resync(comm, local, table, parent)
        full = plan["full"]
        builder = None
        if not full:
            builder, report, failure = self._delta(comm, plan["version"], local)
            reports = comm.all_gather_json(report)
            self._check(reports, failure)
            full_bytes = sum(s.numel * s.width for s in local.specs)
            full = kind == "auto" and parent["chain_bytes"] + sum(r["bytes"] for r in reports) > full_bytes
        if full:
            builder = None
            report, failure = self._full(comm, plan["version"], local, table)
            reports = comm.all_gather_json(report)
            self._check(reports, failure)
        outcome: Any = None
        if comm.rank == 0:
            info, failure = _attempt(lambda: self._commit(plan, local.specs, reports, full, step, meta))
            outcome = _report(failure) or {"info": None if info is None else dataclasses.asdict(info)}
        outcome = comm.broadcast_json(outcome)
        self._check([outcome], failure if comm.rank == 0 else None)
        info = VersionInfo(**{**outcome["info"], "seconds": time.perf_counter() - t0})
        self._advance(info, plan, local, builder)
        return info

    # ------------------------------------------------------------ phases

    def _plan(self, specs: tuple[TensorSpec, ...], kind: str) -> dict[str, Any]:
        """Rank 0: the version to publish, its parent, and whether it is full (metadata only)."""
        base = self._base
        if base is not None:
            nxt = base.version + 1
            if self.run.store.exists(manifest_key(nxt)):
                raise ConflictError(
                    f"{self.run.uri}: version {nxt} was committed by another publisher since this one "
                    "published; publish again to continue on top of it"
                )
            parent: dict[str, Any] | None = {
                "version": base.version,
                "version_hash": base.version_hash,
                "weights_digest": base.digest.hex(),
                "chain_bytes": base.chain_bytes,
            }
            old_specs = base.specs
        else:
            latest = self.run.latest()
            parent, old_specs = None, specs
            if latest is not None:
                m = self.run.manifest(latest)
                parent = {
                    "version": m.version,
                    "version_hash": m.version_hash,
                    "weights_digest": m.weights_digest,
                    "chain_bytes": 0 if m.kind == "full" else m.stats.chain_bytes,
                }
                old_specs = m.tensors
        version = 0 if parent is None else parent["version"] + 1
        layout_changed = old_specs != specs
        if parent is None and kind == "delta":
            raise LayoutError("version 0 must be full; the first publish of a run cannot be a delta")
        if layout_changed and kind != "full":
            raise LayoutError(
                f"version {version}: tensor layout changed since version {version - 1}; a delta cannot "
                "change names, shapes or dtypes: publish with kind='full' to start a new chain"
            )
        every = self.run.config.full_every
        full = parent is None or kind == "full" or (kind == "auto" and version % every == 0)
        return {"version": version, "parent": parent, "full": full, "layout_changed": layout_changed}

    def _hello(self, local: LocalShards | None, plan: dict[str, Any] | None) -> dict[str, Any]:
        assert local is not None
        cfg = self.run.config
        ident = [[s.name, s.dtype, list(s.shape)] for s in local.specs], cfg.segment_bytes, cfg.shard_bytes
        base = self._base
        fits = base is not None and base.specs == local.specs and base.ranges == local.ranges
        return {
            "layout": hashlib.sha256(json.dumps(ident).encode()).hexdigest(),
            "ranges": {k: list(v) for k, v in local.ranges.items()},
            "base": [None if base is None else base.version, fits],
            "plan": plan,
        }

    def _resync(
        self, comm: Collectives, local: LocalShards, table: dict[str, list[tuple[int, int, int]]], parent: Any
    ) -> None:
        """Rank 0 loads the parent version once and sends every rank the bits of its ranges."""
        state, failure = None, None
        if comm.rank == 0:
            state, failure = _attempt(lambda: self.run.materialize_words(parent["version"]))
            if state is not None and state.version_hash != parent["version_hash"]:
                state, failure = None, ConflictError(f"{self.run.uri}: version {parent['version']} changed hash")
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
        digest = Digest.from_hex(parent["weights_digest"])
        self._base = _Baseline(
            parent["version"],
            parent["version_hash"],
            digest,
            parent["chain_bytes"],
            local.specs,
            dict(local.ranges),
            words,
        )

    def _delta(
        self, comm: Collectives, version: int, local: LocalShards
    ) -> tuple[DeltaBuilder | None, dict[str, Any], BaseException | None]:
        """Diff, encode and upload this rank's ranges (no collectives: failures are reported)."""
        base = self._base
        assert base is not None
        builder = DeltaBuilder(
            version, local.specs, self.run.config.segment_bytes, first_ordinal=comm.rank, ordinal_step=comm.size
        )
        entries: list[Segment] = []
        pending: list[Future[None]] = []
        failure: BaseException | None = None
        try:
            for s in local.specs:
                if s.name in local.ranges:
                    lo = local.ranges[s.name][0]
                    for obj in builder.add_tensor(s, base.words[s.name], local.words[s.name], start=lo):
                        entries.append(obj.entry)
                        pending.append(self.run.store.pool.submit(self.run.upload, version, obj))
            for obj in builder.finish():
                entries.append(obj.entry)
                pending.append(self.run.store.pool.submit(self.run.upload, version, obj))
        except Exception as exc:  # reported to every rank, re-raised here after the collective
            failure = exc
        failure = _wait(pending, failure)
        if failure is not None:
            return None, _report(failure) or {}, failure
        share = Digest()
        specs = {s.name: s for s in local.specs}
        for c in builder.changes:
            spec = specs[c.name]
            share.update(tensor_keys(spec.name, spec.dtype, spec.shape), c.positions, c.old, c.new)
        return (
            builder,
            {
                "segments": [e.to_dict("delta") for e in entries],
                "changed": builder.changed,
                "digest": share.hex(),
                "bytes": sum(e.size for e in entries),
            },
            None,
        )

    def _full(
        self, comm: Collectives, version: int, local: LocalShards, table: dict[str, list[tuple[int, int, int]]]
    ) -> tuple[dict[str, Any], BaseException | None]:
        """Shard g of the version is assembled on rank g mod W, built and uploaded there. Every
        rank takes part in every transfer even after a local failure, so none waits forever."""
        failure: BaseException | None = None
        entries: list[Segment] = []
        pending: list[Future[None]] = []
        for g, members in enumerate(plan_shards(local.specs, self.run.config.shard_bytes)):
            owner = g % comm.size
            words: dict[str, np.ndarray] = {}
            for s in members:
                mine = local.words.get(s.name)
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
                    obj = build_shard(version, g, local.specs, members, words)
                    entries.append(obj.entry)
                    pending.append(self.run.store.pool.submit(self.run.upload, version, obj))
                except Exception as exc:  # reported after every transfer is done
                    failure = exc
            if len(pending) > self.run.config.concurrency:  # bound the shards held in memory
                failure = _wait(pending[:1], failure)
                del pending[:1]
        failure = _wait(pending, failure)
        if failure is not None:
            return _report(failure) or {}, failure
        base = self._base
        share = Digest()
        changed = 0
        for s in local.specs:
            if s.name not in local.ranges:
                continue
            lo, hi = local.ranges[s.name]
            new = local.words[s.name]
            keys = tensor_keys(s.name, s.dtype, s.shape)
            for a in range(0, new.size, _DIGEST_CHUNK):
                b = min(a + _DIGEST_CHUNK, new.size)
                share.add_elements(keys, np.arange(lo + a, lo + b, dtype=np.uint64), new[a:b])
            if base is not None and base.specs == local.specs and base.ranges.get(s.name) == (lo, hi):
                changed += int(np.count_nonzero(base.words[s.name] != new))
            else:  # version 0 or a new layout: every element counts as changed
                changed += hi - lo
        shards = [e.to_dict("full") for e in entries]
        return {"shards": shards, "changed": changed, "digest": share.hex()}, None

    def _commit(
        self,
        plan: dict[str, Any],
        specs: tuple[TensorSpec, ...],
        reports: list[dict[str, Any]],
        full: bool,
        step: int | None,
        meta: Mapping[str, str] | None,
    ) -> VersionInfo:
        """Rank 0: the manifest from every rank's entries (checked with the readers' rules), written last."""
        version, parent = plan["version"], plan["parent"]
        digest = Digest() if full or parent is None else Digest.from_hex(parent["weights_digest"])
        for r in reports:
            digest.add(Digest.from_hex(r["digest"]))
        index = None
        if full:
            shards = [
                Segment(d["key"], d["size"], d["sha256"], tensors=tuple(d["tensors"]))
                for r in reports
                for d in r["shards"]
            ]
            segments = tuple(sorted(shards, key=lambda e: e.tensors[0]))
            obj = build_index(version, specs, segments)
            self.run.upload(version, obj)
            index = obj.entry
        else:
            segments = tuple(
                Segment(d["key"], d["size"], d["sha256"], blocks=tuple(_block(b) for b in d["blocks"]))
                for r in reports
                for d in r["segments"]
            )
        return self.run.commit(
            version,
            specs,
            parent=None if parent is None else Parent(parent["version"], parent["version_hash"]),
            segments=segments,
            index=index,
            changed=sum(r["changed"] for r in reports),
            weights_digest=digest.hex(),
            chain_bytes=0 if parent is None else parent["chain_bytes"],
            step=step,
            meta=meta,
            check=True,
        )

    def _advance(self, info: VersionInfo, plan: Any, local: LocalShards, builder: DeltaBuilder | None) -> None:
        """Every rank: the committed version becomes the baseline of its ranges."""
        base = self._base
        if builder is None or base is None:
            words = {k: np.array(v, copy=True) for k, v in local.words.items()}
            self._base = _Baseline(
                info.version,
                info.version_hash,
                Digest.from_hex(info.weights_digest),
                0,
                local.specs,
                dict(local.ranges),
                words,
            )
            return
        for c in builder.changes:
            base.words[c.name][c.positions - local.ranges[c.name][0]] = c.new
        base.version, base.version_hash = info.version, info.version_hash
        base.digest = Digest.from_hex(info.weights_digest)
        base.chain_bytes = plan["parent"]["chain_bytes"] + info.bytes

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


def _block(d: dict[str, Any]) -> Block:
    return Block(**{**d, "streams": tuple(d.get("streams", ()))})


def _attempt(fn: Callable[[], T]) -> tuple[T | None, BaseException | None]:
    """Run a rank's local work; a failure must reach the other ranks instead of leaving them waiting."""
    try:
        return fn(), None
    except Exception as exc:  # reported through the next collective, then re-raised on this rank
        return None, exc


def _report(failure: BaseException | None) -> dict[str, str] | None:
    return None if failure is None else {"error": str(failure)[:2000], "type": type(failure).__name__}


def _wait(pending: list[Future[None]], failure: BaseException | None) -> BaseException | None:
    for f in pending:
        exc = f.exception()
        failure = failure or exc
    return failure
