"""The publish plan: what the next version is, whatever process or rank publishes it.

One decision, made once: the next version's number and parent, full or delta, the layout
check, the chain budget (a delta chain never costs more to replay than a full copy) and the
conflict when another publisher got there first. :class:`~aurora_store.bucket.run.Run` drives it
for a single process; the trainer's sharded publisher decides it on rank 0, sends it to every
rank as JSON and drives the same plan. Pure policy: no I/O.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from aurora_store.codec.classed import NAME as CLASSED
from aurora_store.codec.dense import NAME as DENSE
from aurora_store.errors import ConflictError, LayoutError, StoreError, UnauthenticatedError
from aurora_store.format import dtypes
from aurora_store.format.full import plan_shards
from aurora_store.format.keys import index_key, object_key
from aurora_store.format.manifest import (
    Manifest,
    Parent,
    Rollback,
    Rotation,
    RunLineage,
    Segment,
    Stats,
    TensorSpec,
    format_for,
)
from aurora_store.format.manifest_parser import check_meta, check_step, check_tensor_name

_ZERO64, _ZERO32 = "0" * 64, "0" * 32
Kind = Literal["auto", "full", "delta"]
KINDS = ("auto", "full", "delta")


@dataclass(frozen=True, slots=True)
class VersionInfo:
    """What one publish committed."""

    version: int
    kind: str
    bytes: int
    changed: int
    elements: int
    version_hash: str
    weights_digest: str
    segments: int
    seconds: float
    counted: bool = True
    """False when ``changed`` is unknown (then ``elements``): see :class:`~aurora_store.format.manifest.Stats`."""

    @classmethod
    def of(cls, m: Manifest, seconds: float) -> VersionInfo:
        return cls(
            m.version,
            m.kind,
            m.stats.bytes,
            m.stats.changed,
            m.stats.elements,
            m.version_hash,
            m.weights_digest,
            len(m.objects),
            seconds,
            m.stats.counted,
        )

    @property
    def density(self) -> float:
        return self.changed / self.elements if self.elements else 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Latest:
    """The last committed version, as the next publish needs it."""

    version: int
    version_hash: str
    weights_digest: str
    chain_bytes: int
    """Bytes of the deltas since the last full version, this one's included (0 for a full version)."""
    specs: tuple[TensorSpec, ...]
    lineage: RunLineage
    """The run's lineage (origin: version 0's hash) and the key this version is signed by, which
    every next version carries (until a key rotation)."""

    @classmethod
    def of(cls, m: Manifest, lineage: RunLineage) -> Latest:
        if m.run is not None and m.version > 0:
            lineage = RunLineage(lineage.origin, m.run.signed_by)  # the key in force, rotations included
        return cls(
            version=m.version,
            version_hash=m.version_hash,
            weights_digest=m.weights_digest,
            chain_bytes=0 if m.kind == "full" else m.stats.chain_bytes,
            specs=m.tensors,
            lineage=lineage,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "version_hash": self.version_hash,
            "weights_digest": self.weights_digest,
            "chain_bytes": self.chain_bytes,
            "specs": [s.to_dict() for s in self.specs],
            "lineage": self.lineage.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Latest:
        specs = tuple(TensorSpec(s["name"], s["dtype"], tuple(s["shape"])) for s in d["specs"])
        return cls(
            version=d["version"],
            version_hash=d["version_hash"],
            weights_digest=d["weights_digest"],
            chain_bytes=d["chain_bytes"],
            specs=specs,
            lineage=RunLineage(d["lineage"]["origin"], d["lineage"]["signed_by"]),
        )


def committed_elsewhere(url: str, version: int) -> ConflictError:
    """The error for a version another publisher committed first (the next publish reloads)."""
    return ConflictError(
        f"{url}: version {version} was committed by another publisher; reload and publish again", url=url
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishPlan:
    """The next version: its number, parent, tensor table, and whether it is full."""

    version: int
    parent: Latest | None
    specs: tuple[TensorSpec, ...]
    kind: Kind
    full: bool
    run: RunLineage
    """The run lineage the version's manifest carries (version 0: no origin yet)."""
    rotation: Rotation | None = None
    """The key rotation the version carries (its ``run.signed_by`` is then the new key)."""

    @property
    def full_bytes(self) -> int:
        """Bytes of every tensor's data: what a full copy costs."""
        return sum(s.numel * s.width for s in self.specs)

    @property
    def same_layout(self) -> bool:
        """Whether the tensor table is the parent's (a delta needs it; a full version may change it)."""
        return self.parent is not None and self.parent.specs == self.specs

    def outgrows(self, delta_bytes: int) -> bool:
        """Whether a delta of ``delta_bytes`` would make the chain cost more than a full copy (auto only)."""
        chain = self.parent.chain_bytes if self.parent is not None else 0
        return self.kind == "auto" and chain + delta_bytes > self.full_bytes

    def as_full(self) -> PublishPlan:
        return dataclasses.replace(self, full=True)

    def latest_after(self, info: VersionInfo) -> Latest:
        """The latest once this plan's version is committed as ``info`` says."""
        chain = 0 if self.full else (self.parent.chain_bytes if self.parent is not None else 0) + info.bytes
        lineage = RunLineage(info.version_hash, self.run.signed_by) if self.version == 0 else self.run
        return Latest(
            version=self.version,
            version_hash=info.version_hash,
            weights_digest=info.weights_digest,
            chain_bytes=chain,
            specs=self.specs,
            lineage=lineage,
        )

    def manifest(
        self,
        *,
        segments: tuple[Segment, ...],
        index: Segment | None,
        changed: int,
        weights_digest: str,
        files: tuple[Segment, ...],
        step: int | None,
        meta: Mapping[str, str] | None,
        rolls_back_to: Rollback | None = None,
        counted: bool = True,
    ) -> Manifest:
        """The version's manifest, not yet sealed (hashed and signed), from the objects it names.
        ``counted`` False: a full version whose ``changed`` is unknown (published without the parent's
        bits), written as every element with ``stats.counted`` false."""
        if (index is not None) != self.full:
            raise StoreError(f"version {self.version}: a full version names an index, a delta none")
        nbytes = sum(e.size for e in segments) + (index.size if index is not None else 0)
        chain = 0 if self.full else (self.parent.chain_bytes if self.parent is not None else 0) + nbytes
        classed = any(b.codec == CLASSED for s in segments for b in s.blocks)
        narrow = any(
            b.codec != DENSE and dtypes.dtype(self.specs[b.tensor].dtype).narrow for s in segments for b in s.blocks
        )
        counted = counted or not self.same_layout  # a new chain counts every element: that is known
        if not counted and not self.full:
            raise StoreError(f"version {self.version}: a delta's changes are always counted")
        elements = sum(s.numel for s in self.specs)
        return Manifest(
            # the oldest format that holds the version
            format=format_for(
                classed=classed, rotation=self.rotation, rolls_back_to=rolls_back_to, counted=counted, narrow=narrow
            ),
            version=self.version,
            kind="full" if self.full else "delta",
            parent=None if self.parent is None else Parent(self.parent.version, self.parent.version_hash),
            created=datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
            step=step,
            tensors=self.specs,
            segments=segments,
            index=index,
            stats=Stats(elements, changed if counted else elements, nbytes, chain, self.full_bytes, counted=counted),
            weights_digest=weights_digest,
            meta=dict(meta or {}),
            files=files,
            run=self.run,
            rolls_back_to=rolls_back_to,
            rotation=self.rotation,
        )

    def skeleton(
        self,
        *,
        shard_bytes: int,
        files: tuple[Segment, ...],
        step: int | None,
        meta: Mapping[str, str] | None,
        full: bool | None = None,
    ) -> Manifest:
        """The smallest manifest this plan can commit (as a full version when ``full``, else as the
        plan says), not yet sealed: the tensor table, attachments, step and meta, and for a full
        version an entry per shard of :func:`plan_shards` naming its tensors, with placeholder hashes
        and sizes no larger than the real ones. A delta's blocks are not known before it is encoded
        and are left out: they only add to it. What the publisher checks against the manifest cap
        before it writes a byte."""
        if not (self.full if full is None else full):
            return dataclasses.replace(self, full=False).manifest(
                segments=(), index=None, changed=0, weights_digest=_ZERO32, files=files, step=step, meta=meta
            )
        at = {s.name: i for i, s in enumerate(self.specs)}
        shards = tuple(
            Segment(
                object_key(self.version, g, _ZERO64, "safetensors"),
                sum(s.numel * s.width for s in members),
                _ZERO64,
                tensors=tuple(sorted(at[s.name] for s in members)),
            )
            for g, members in enumerate(plan_shards(self.specs, shard_bytes))
        )
        return dataclasses.replace(self, full=True).manifest(
            segments=shards,
            index=Segment(index_key(self.version, _ZERO64), 0, _ZERO64),
            changed=0,
            weights_digest=_ZERO32,
            files=files,
            step=step,
            meta=meta,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "parent": None if self.parent is None else self.parent.to_dict(),
            "specs": [s.to_dict() for s in self.specs],
            "kind": self.kind,
            "full": self.full,
            "run": self.run.to_dict(),
            "rotation": None if self.rotation is None else self.rotation.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PublishPlan:
        return cls(
            version=d["version"],
            parent=None if d["parent"] is None else Latest.from_dict(d["parent"]),
            specs=tuple(TensorSpec(s["name"], s["dtype"], tuple(s["shape"])) for s in d["specs"]),
            kind=d["kind"],
            full=d["full"],
            run=RunLineage(d["run"]["origin"], d["run"]["signed_by"]),
            rotation=None if d.get("rotation") is None else Rotation(**d["rotation"]),
        )


def check_publish_args(step: Any, meta: Any) -> tuple[int | None, dict[str, str]]:
    """A publisher's ``step`` and ``meta``, checked by the readers' own rules (StoreError), so a
    publish never commits a manifest its readers refuse."""
    if meta is not None and not isinstance(meta, Mapping):
        raise StoreError(f"meta must map strings to strings, got {type(meta).__name__}")
    return check_step(step, StoreError), check_meta(dict(meta or {}), StoreError)


def plan_next(
    latest: Latest | None,
    specs: tuple[TensorSpec, ...],
    *,
    kind: str,
    full_every: int,
    version: int | None = None,
    url: str = "",
    signer: str | None = None,
    rotation: Rotation | None = None,
) -> PublishPlan:
    """Plan the version after ``latest`` (the first one when None) with tensor table ``specs``.

    ``kind`` full or delta forces it; auto makes every version that is a multiple of
    ``full_every`` full (and the publisher may turn a delta full when :meth:`PublishPlan.outgrows`
    says so). ``version``, when given, must be the next one, else ConflictError. ``signer`` is the
    publisher's key id (None: it does not sign); a run's signing is fixed at version 0, so it must
    be the run's, else UnauthenticatedError, and changes only through ``rotation`` (from ``signer``
    to a key the version is then the first to carry)."""
    if kind not in KINDS:
        raise StoreError(f"kind must be 'auto', 'full' or 'delta', got {kind!r}")
    for s in specs:
        check_tensor_name(s.name, StoreError)  # the readers' rules, before the first byte is written
    for a, b in itertools.pairwise(specs):
        if not a.name < b.name:
            raise StoreError(f"tensor names must be unique and sorted: {a.name!r:.100} comes before {b.name!r:.100}")
    nxt = 0 if latest is None else latest.version + 1
    if version is not None and version != nxt:
        raise ConflictError(f"{url}: asked to publish version {version}, but the next version is {nxt}")
    if latest is None and kind == "delta":
        raise LayoutError("version 0 must be full; the first publish of a run cannot be a delta")
    if latest is not None and latest.specs != specs and kind != "full":
        raise LayoutError(layout_message(latest.specs, specs, nxt))
    run = RunLineage(None, signer) if latest is None else latest.lineage
    if run.signed_by != signer:
        raise UnauthenticatedError(signing_mismatch(url, run.signed_by, signer))
    if rotation is not None:
        if latest is None or signer is None:
            raise StoreError(
                f"{url}: a key rotation moves a signed run to a new key; "
                + (
                    "version 0 has no key to rotate from: start the run with the new key"
                    if latest is None
                    else "this run is unsigned, and a run's signing is fixed at version 0"
                )
            )
        if rotation.previous != signer or rotation.key_id == signer:
            raise StoreError(f"{url}: a rotation from key {rotation.previous} to {rotation.key_id} by signer {signer}")
        run = RunLineage(run.origin, rotation.key_id)
    full = latest is None or kind == "full" or (kind == "auto" and nxt % full_every == 0)
    return PublishPlan(version=nxt, parent=latest, specs=specs, kind=kind, full=full, run=run, rotation=rotation)  # type: ignore[arg-type]


def signing_mismatch(url: str, run: str | None, publisher: str | None) -> str:
    if publisher is None:
        return f"{url}: the run is signed by key {run}; publish with its key (--signing-key, AURORA_SIGNING_KEY)"
    if run is None:
        return f"{url}: the run was started unsigned and a run's signing is fixed at version 0; start a new run to sign"
    return (
        f"{url}: the run is signed by key {run}, this publisher's key is {publisher}; to move the run to a new "
        f"key, rotate: publish with the run's key and the new one as the key to rotate to "
        "(--signing-key OLD --rotate-signing-key NEW, or Run.publish(..., rotate_to=NEW))"
    )


def layout_message(old: tuple[TensorSpec, ...], new: tuple[TensorSpec, ...], version: int) -> str:
    a = {s.name: s for s in old}
    b = {s.name: s for s in new}
    diffs = [f"added {n!r}" for n in sorted(b.keys() - a.keys())]
    diffs += [f"removed {n!r}" for n in sorted(a.keys() - b.keys())]
    diffs += [
        f"{n!r} {a[n].dtype}{list(a[n].shape)} -> {b[n].dtype}{list(b[n].shape)}"
        for n in sorted(a.keys() & b.keys())
        if a[n] != b[n]
    ]
    return (
        f"version {version}: tensor layout changed since version {version - 1} ({'; '.join(diffs[:5])}"
        f"{'; ...' if len(diffs) > 5 else ''}); a delta cannot change names, shapes or dtypes: "
        "publish with kind='full' to start a new chain"
    )
