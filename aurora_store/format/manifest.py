"""Version manifests: frozen dataclasses and their canonical JSON.

A manifest is one canonical JSON object (sorted keys, no whitespace, ASCII, integers
only: no floats). ``version_hash`` is the SHA-256 of the canonical encoding of every
other field except ``signature``; ``parent`` carries the parent's version hash, so
the hashes chain. Untrusted bytes become a :class:`Manifest` only through
:func:`aurora_store.format.manifest_parser.parse_manifest`. No I/O and no torch here.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from aurora_store import codec
from aurora_store.errors import ChainError
from aurora_store.format import dtypes

FORMAT = "aurora/3"
"""What this code writes when a version uses the ``classed`` codec, which aurora/3 adds (aurora/2
added ``run``: the version's run lineage, see :class:`RunLineage`)."""
WITHOUT_CLASSED = "aurora/2"
"""What it writes for a version without classed blocks: readable by readers that predate aurora/3."""
FORMAT_V4 = "aurora/4"
"""What it writes for a version that carries a field aurora/3 lacks (a key ``rotation``: see
:class:`Rotation`; or ``rolls_back_to``: see :class:`Rollback`); any other version is written as
before, so older readers keep reading it."""
FORMAT_V5 = "aurora/5"
"""What it writes for a full version whose ``stats.changed`` was not counted (``stats.counted`` false:
see :class:`Stats`); aurora/5 is aurora/4 with that one field, so any other version keeps its older
format."""
FORMAT_V6 = "aurora/6"
"""What it writes for a delta that codes the changes of a 1-byte tensor (FP8, INT8: a quantized
version's words) sparse or classed, where earlier formats write such a tensor whole; aurora/6 is
aurora/5 with that, so any other version keeps its older format."""
FORMATS = ("aurora/1", "aurora/2", "aurora/3", FORMAT_V4, FORMAT_V5, FORMAT_V6)
"""What it reads: runs written by earlier code stay readable."""
CLASSED_FORMATS = (FORMAT, FORMAT_V4, FORMAT_V5, FORMAT_V6)
"""The formats whose manifests may name classed blocks."""
ROTATING_FORMATS = (FORMAT_V4, FORMAT_V5, FORMAT_V6)
"""The formats whose manifests may carry a key rotation or a rollback."""
LEGACY = "aurora/1"


def canonical(obj: Any) -> bytes:
    """The one byte encoding that hashes and signatures cover."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def width(self) -> int:
        return dtypes.dtype(self.dtype).width

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True, slots=True)
class Block:
    """A range ``[start, stop)`` of one tensor's elements, coded inside a segment."""

    tensor: int
    """Index into the manifest's tensor table."""
    start: int
    stop: int
    codec: str
    """The codec's registered name (:mod:`aurora_store.codec`)."""
    offset: int
    """Byte offset of the block's payload in its segment."""
    length: int
    header: Any
    """The codec's header (``count`` and whatever else it needs to decode the payload)."""

    @property
    def count(self) -> int:
        """Elements the block codes."""
        return int(self.header.count)

    def to_dict(self) -> dict[str, Any]:
        c = codec.get(self.codec)
        assert c is not None, f"block codec {self.codec!r} is not registered"
        return {
            "tensor": self.tensor,
            "start": self.start,
            "stop": self.stop,
            "codec": self.codec,
            "offset": self.offset,
            "length": self.length,
            **c.header_dict(self.header),
        }


@dataclass(frozen=True, slots=True)
class Segment:
    """One immutable object of a version: a delta segment or a safetensors shard."""

    key: str
    size: int
    sha256: str
    blocks: tuple[Block, ...] = ()
    tensors: tuple[int, ...] = ()

    def to_dict(self, kind: str) -> dict[str, Any]:
        d: dict[str, Any] = {"key": self.key, "size": self.size, "sha256": self.sha256}
        if kind == "delta":
            d["blocks"] = [b.to_dict() for b in self.blocks]
        else:
            d["tensors"] = list(self.tensors)
        return d


@dataclass(frozen=True, slots=True)
class Parent:
    version: int
    version_hash: str


@dataclass(frozen=True, slots=True)
class Stats:
    elements: int
    changed: int
    """Elements whose bits differ from the parent's (every element for version 0 or a layout change);
    ``elements`` when not ``counted``."""
    bytes: int
    chain_bytes: int
    full_bytes: int
    counted: bool = True
    """False for a full version published without its parent's bits (a restarted publisher whose
    parent could not be read): what changed is unknown, and ``changed`` is ``elements``. Written as
    ``"counted": false`` (format aurora/5) and absent otherwise."""

    def to_dict(self) -> dict[str, int | bool]:
        d: dict[str, int | bool] = {
            "elements": self.elements,
            "changed": self.changed,
            "bytes": self.bytes,
            "chain_bytes": self.chain_bytes,
            "full_bytes": self.full_bytes,
        }
        if not self.counted:
            d["counted"] = False
        return d


@dataclass(frozen=True, slots=True)
class Signature:
    alg: str
    key_id: str
    sig: str

    def to_dict(self) -> dict[str, str]:
        return {"alg": self.alg, "key_id": self.key_id, "sig": self.sig}


@dataclass(frozen=True, slots=True)
class RunLineage:
    """Which run a version belongs to, fixed at version 0 and carried by every version after it.

    ``origin`` is version 0's version hash (None in version 0 itself: a hash cannot name itself);
    ``signed_by`` is the key id the version is signed by, None for an unsigned run: version 0's
    key, until a key rotation (:class:`Rotation`) moves the run to another. Both are inside the
    version hash, so neither can be changed without breaking it, and a signature cannot be stripped
    from a signed run without the version saying it should be there."""

    origin: str | None
    signed_by: str | None

    def to_dict(self) -> dict[str, str | None]:
        return {"origin": self.origin, "signed_by": self.signed_by}


@dataclass(frozen=True, slots=True)
class Rollback:
    """A version trained from an older version's state than its parent's (format aurora/4).

    A restarted trainer continues from the newest trainer state it can verify. When that state is
    older than the latest committed version (it was saved every K versions, or the latest one is
    missing or damaged), the next version still names the committed latest as its parent (the chain
    stays whole and its bytes are a delta or full against it, as usual) and records here the version
    whose state its weights continue from and the versions whose training it abandons."""

    version: int
    version_hash: str
    abandons: tuple[int, ...]
    """The versions after ``version`` up to the parent: consecutive, ascending."""

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "version_hash": self.version_hash, "abandons": list(self.abandons)}

    @staticmethod
    def of(version: int, version_hash: str, parent: int) -> Rollback:
        """Continuing from ``version``'s state in the version after ``parent``."""
        return Rollback(version, version_hash, tuple(range(version + 1, parent + 1)))


@dataclass(frozen=True, slots=True)
class Rotation:
    """A key rotation (format aurora/4): from this version on the run is signed by ``key_id``.

    A rotation version is signed by both keys: its ``signature`` by the outgoing key ``previous``,
    its ``rotation_signature`` by the incoming one. Both public keys (base64 of the raw 32 bytes)
    are inside the version hash, so a reader trusting either key learns the other from it."""

    key_id: str
    public_key: str
    previous: str
    previous_public_key: str

    def to_dict(self) -> dict[str, str]:
        return {
            "key_id": self.key_id,
            "public_key": self.public_key,
            "previous": self.previous,
            "previous_public_key": self.previous_public_key,
        }


def raw_key_id(raw: bytes) -> str:
    """The id of an Ed25519 public key given as its raw 32 bytes: the first 16 hex digits of its SHA-256."""
    return hashlib.sha256(raw).hexdigest()[:16]


def format_for(
    *,
    classed: bool,
    rotation: Rotation | None = None,
    rolls_back_to: Rollback | None = None,
    counted: bool = True,
    narrow: bool = False,
) -> str:
    """The oldest format that holds a version: aurora/4 only with a field aurora/3 lacks, aurora/5
    only with an uncounted ``stats.changed``, aurora/6 only with sparse or classed blocks of a 1-byte
    dtype (``narrow``)."""
    if narrow:
        return FORMAT_V6
    if not counted:
        return FORMAT_V5
    if rotation is not None or rolls_back_to is not None:
        return FORMAT_V4
    return FORMAT if classed else WITHOUT_CLASSED


@dataclass(frozen=True, slots=True)
class Manifest:
    version: int
    kind: str
    parent: Parent | None
    created: str
    step: int | None
    tensors: tuple[TensorSpec, ...]
    segments: tuple[Segment, ...]
    index: Segment | None
    stats: Stats
    weights_digest: str
    meta: dict[str, str] = field(default_factory=dict)
    files: tuple[Segment, ...] = ()
    """The run's attached files (config, tokenizer) at publish time, so the signature covers them."""
    version_hash: str = ""
    signature: Signature | None = None
    run: RunLineage | None = None
    """None only in a manifest of the legacy format (aurora/1), which has no run lineage."""
    format: str = FORMAT
    rotation: Rotation | None = None
    """Format aurora/4: the key this version rotates the run to (inside the version hash)."""
    rotation_signature: Signature | None = None
    """Format aurora/4, with ``rotation``: the incoming key's signature (outside the version hash, as
    ``signature`` is)."""
    rolls_back_to: Rollback | None = None
    """Set when the version's weights continue from an older version's state than its parent's."""

    @property
    def lineage(self) -> RunLineage | None:
        """The run's lineage as this version states it (version 0: its own hash is the origin)."""
        if self.run is None:
            return None
        return RunLineage(self.version_hash, self.run.signed_by) if self.version == 0 else self.run

    def body(self) -> dict[str, Any]:
        """Every field the version hash covers."""
        body = self._body()
        if self.format != LEGACY:
            assert self.run is not None, "a manifest of the current format names its run"
            body["run"] = self.run.to_dict()
        if self.rotation is not None:
            body["rotation"] = self.rotation.to_dict()
        if self.rolls_back_to is not None:
            body["rolls_back_to"] = self.rolls_back_to.to_dict()
        return body

    def _body(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "version": self.version,
            "kind": self.kind,
            "parent": None
            if self.parent is None
            else {"version": self.parent.version, "version_hash": self.parent.version_hash},
            "created": self.created,
            "step": self.step,
            "tensors": [t.to_dict() for t in self.tensors],
            "segments": [s.to_dict(self.kind) for s in self.segments],
            "index": None if self.index is None else self.index.to_dict("full"),
            "stats": self.stats.to_dict(),
            "weights_digest": self.weights_digest,
            "meta": dict(self.meta),
            "files": [f.to_dict("full") | {"tensors": []} for f in self.files],
        }

    def compute_hash(self) -> str:
        return hashlib.sha256(canonical(self.body())).hexdigest()

    def to_bytes(self) -> bytes:
        doc = self.body()
        doc["version_hash"] = self.version_hash
        doc["signature"] = None if self.signature is None else self.signature.to_dict()
        if self.rotation is not None:
            doc["rotation_signature"] = None if self.rotation_signature is None else self.rotation_signature.to_dict()
        return canonical(doc)

    @property
    def objects(self) -> tuple[Segment, ...]:
        """Every object the manifest names (segments, then the index of a full version)."""
        return self.segments + ((self.index,) if self.index is not None else ())


def check_link(parent: Manifest, child: Manifest) -> None:
    """``child`` names ``parent`` by its hash, belongs to the same run (never in an older format
    than its parent), and a delta keeps its parent's tensor table. The run's signer changes only
    through a key rotation that names the parent's signer as the outgoing key."""
    if child.parent is None or child.parent.version_hash != parent.version_hash:
        raise ChainError(
            f"version {child.version} names parent hash "
            f"{child.parent.version_hash if child.parent else None}, version {parent.version} "
            f"has {parent.version_hash}"
        )
    if (
        parent.lineage is not None
        and child.lineage is not None
        and child.lineage.origin == parent.lineage.origin
        and (child.rotation is not None or child.lineage.signed_by != parent.lineage.signed_by)
    ):
        _check_rotation_link(parent, child)
    elif parent.lineage is not None and child.lineage != parent.lineage:
        raise ChainError(
            f"version {child.version} belongs to run {child.lineage}, its parent to run {parent.lineage}"
            if child.lineage is not None
            else f"version {child.version} is in the legacy format {LEGACY} after a version in {parent.format}"
        )
    if child.kind == "delta" and child.tensors != parent.tensors:
        raise ChainError(f"delta version {child.version} changes the tensor table of version {parent.version}")


def _check_rotation_link(parent: Manifest, child: Manifest) -> None:
    """The run's signer changes between ``parent`` and ``child`` only through a rotation naming the parent's signer."""
    assert parent.lineage is not None and child.lineage is not None
    was, now = parent.lineage.signed_by, child.lineage.signed_by
    r = child.rotation
    if r is None:
        raise ChainError(
            f"version {child.version} is signed by key {now}, its parent by {was}, and it is no key rotation"
        )
    if r.previous != was or r.key_id != now:
        raise ChainError(
            f"version {child.version} rotates key {r.previous} to {r.key_id}, but its parent is signed by {was}"
        )
