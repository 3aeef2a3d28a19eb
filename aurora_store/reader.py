"""Reading versions: verified manifests, verified segments, transactional delta apply.

Every object is fetched with parallel ranged GETs, its size and SHA-256 checked
against the manifest before a single byte is decoded. A delta is decoded completely
and its weight digest checked before anything is written to the target weights, so a
failed apply leaves them exactly at the old version. No torch here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from aurora_store import dtypes, safetensors_format, signing
from aurora_store.codec import dense, sparse
from aurora_store.delta import exponent_of
from aurora_store.digest import Digest
from aurora_store.errors import ChainError, CorruptError, LimitError, MissingError, StoreError
from aurora_store.limits import Limits
from aurora_store.manifest import Manifest, Segment, manifest_key
from aurora_store.weights import WeightState, full_digest

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from aurora_store.objectstore import ObjectStore


OldWords = Callable[[str, np.ndarray], np.ndarray]
"""``old_at(tensor_name, flat_index) -> words`` before the version being decoded."""


@dataclass(slots=True)
class DecodedBlock:
    name: str
    index: np.ndarray
    """Flat element positions."""
    delta: np.ndarray | None
    """Wrapping word deltas (sparse blocks) ..."""
    words: np.ndarray | None
    """... or the new words themselves (dense blocks)."""


class Reader:
    """Verified access to one run's versions."""

    def __init__(self, store: ObjectStore, limits: Limits, verify_key: Ed25519PublicKey | None) -> None:
        self.store = store
        self.limits = limits
        self.verify_key = verify_key
        self._manifests: dict[int, Manifest] = {}
        self._verified_files: set[tuple[str, str]] = set()

    # ------------------------------------------------------------ manifests

    def versions(self) -> list[int]:
        """Versions with a manifest (committed), ascending."""
        out = []
        for key in self.store.list_keys("versions"):
            parts = key.split("/")
            if (
                len(parts) == 3
                and parts[2] == "manifest.json"
                and parts[1].isascii()
                and parts[1].isdigit()
                and len(parts[1]) == 10
            ):
                out.append(int(parts[1]))
        return sorted(out)

    def manifest(self, version: int) -> Manifest:
        """The verified manifest of ``version`` (parsed, hash-checked, signature-checked)."""
        if version in self._manifests:
            return self._manifests[version]
        return self.manifest_with_bytes(version)[0]

    def manifest_with_bytes(self, version: int) -> tuple[Manifest, bytes]:
        """The verified manifest of ``version`` and its exact bytes (what a relay copies), in one GET."""
        key = manifest_key(version)
        data = self.store.get(key, max_bytes=self.limits.max_manifest_bytes)
        m = Manifest.from_bytes(
            data,
            expect_version=version,
            max_bytes=self.limits.max_manifest_bytes,
            max_segment_bytes=self.limits.max_segment_bytes,
            what=self.store.url(key),
        )
        if self.verify_key is not None:
            signing.verify(m, self.verify_key, self.store.url(key))
        self._manifests[version] = m
        return m, data

    def chain(self, version: int) -> list[Manifest]:
        """Manifests from the nearest full version up to ``version``, parent hashes checked."""
        chain = [self.manifest(version)]
        while chain[-1].kind != "full":
            child = chain[-1]
            assert child.parent is not None
            try:
                parent = self.manifest(child.parent.version)
            except MissingError:
                raise ChainError(
                    f"version {child.version} needs version {child.parent.version}, which is missing "
                    f"({self.store.url(manifest_key(child.parent.version))})"
                ) from None
            check_link(parent, child)
            chain.append(parent)
        chain.reverse()
        return chain

    # ------------------------------------------------------------ objects

    def fetch(self, seg: Segment) -> bytes:
        """An object's bytes, verified against its manifest entry."""
        if seg.size > self.limits.max_segment_bytes:
            raise LimitError(f"{self.store.url(seg.key)}: {seg.size} bytes exceeds the segment cap")
        data = self.store.get_sized(seg.key, seg.size, self.limits.part_bytes)
        got = hashlib.sha256(data).hexdigest()
        if got != seg.sha256:
            raise CorruptError(f"{self.store.url(seg.key)}: sha256 {got}, manifest says {seg.sha256}")
        return data

    def verify_files(self, m: Manifest) -> None:
        """Check the attachments ``m`` vouches for (each distinct file once per reader)."""
        for f in m.files:
            if (f.key, f.sha256) not in self._verified_files:
                self.fetch(f)
                self._verified_files.add((f.key, f.sha256))

    # ------------------------------------------------------------ full versions

    def load_full(self, m: Manifest) -> WeightState:
        if m.index is not None:
            _check_index(self.fetch(m.index), m, self.store.url(m.index.key))
        words: dict[str, np.ndarray] = {}

        def load(seg: Segment) -> tuple[dict[str, np.ndarray], Digest]:
            data = self.fetch(seg)
            what = self.store.url(seg.key)
            entries, base = safetensors_format.parse(data, what)
            expected = {m.tensors[i].name: m.tensors[i] for i in seg.tensors}
            if set(entries) != set(expected):
                raise CorruptError(
                    f"{what}: holds tensors {sorted(entries)[:5]}..., manifest says {sorted(expected)[:5]}..."
                )
            out = {}
            for name, spec in expected.items():
                e = entries[name]
                if (e.dtype, e.shape) != (spec.dtype, spec.shape):
                    raise CorruptError(
                        f"{what}: tensor {name!r} is {e.dtype}{list(e.shape)}, "
                        f"manifest says {spec.dtype}{list(spec.shape)}"
                    )
                out[name] = safetensors_format.words(data, base, e)
            part_digest = full_digest(tuple(expected.values()), out)  # overlaps with other shards' I/O
            return out, part_digest

        digest = Digest()
        for part, part_digest in self.store.map(load, m.segments):
            words.update(part)
            digest.add(part_digest)
        if digest.hex() != m.weights_digest:
            raise ChainError(f"version {m.version}: weights digest {digest.hex()}, manifest says {m.weights_digest}")
        return WeightState(m.tensors, words, m.version, m.version_hash, digest)

    # ------------------------------------------------------------ deltas

    def decode_delta(
        self, m: Manifest, old_at: OldWords, on_segment: Callable[[Segment], None] | None = None
    ) -> list[DecodedBlock]:
        """Fetch, verify and decode every segment of a delta (in parallel); nothing is applied.

        ``old_at(name, flat_index)`` gives the weights' words before this version (symbol
        streams are split by the old elements' exponents)."""

        def load(seg: Segment) -> list[DecodedBlock]:
            data = memoryview(self.fetch(seg))
            url = self.store.url(seg.key)
            out = [decode_block(m, seg, b_i, data, url, self.limits, old_at) for b_i in range(len(seg.blocks))]
            if on_segment is not None:
                on_segment(seg)
            return out

        blocks: list[DecodedBlock] = []
        for part in self.store.map(load, m.segments):
            blocks.extend(part)
        return blocks

    def apply_delta(self, state: WeightState, m: Manifest, blocks: list[DecodedBlock] | None = None) -> None:
        """Move ``state`` from ``m``'s parent to ``m``: all or nothing."""
        if m.parent is None or state.version != m.parent.version or state.version_hash != m.parent.version_hash:
            raise ChainError(
                f"version {m.version} applies to version {m.parent.version if m.parent else None}, "
                f"weights are at {state.version}"
            )
        if [s for s in state.specs] != list(m.tensors):
            raise ChainError(f"version {m.version}: tensor table differs from version {state.version}")
        if blocks is None:
            blocks = self.decode_delta(m, state.old_at)
        apply_blocks(state, m, blocks)


def decode_block(
    m: Manifest, seg: Segment, b_i: int, data: memoryview, url: str, limits: Limits, old_at: OldWords
) -> DecodedBlock:
    b = seg.blocks[b_i]
    spec = m.tensors[b.tensor]
    what = f"{url} block {b_i} ({spec.name}[{b.start}:{b.stop}])"
    payload = data[b.offset : b.offset + b.length]
    width = dtypes.dtype(spec.dtype).width
    expands = b.count * (b.gap_width + 1) + b.escapes * width if b.codec == "sparse" else b.count * width
    if expands > limits.max_block_decoded_bytes:
        raise LimitError(f"{what}: would decode to {expands} bytes, over the cap of {limits.max_block_decoded_bytes}")
    if b.codec == "sparse":
        pos, delta = sparse.decode(
            payload,
            count=b.count,
            gap_width=b.gap_width,
            escapes=b.escapes,
            split=b.split,
            streams=b.streams,
            width=width,
            span=b.stop - b.start,
            exponent=exponent_of(spec.dtype),
            old_at=lambda rel: old_at(spec.name, rel + b.start),
            what=what,
        )
        return DecodedBlock(spec.name, pos + b.start, delta, None)
    words = dense.decode(payload, width=width, span=b.stop - b.start, what=what)
    return DecodedBlock(spec.name, np.arange(b.start, b.stop, dtype=np.int64), None, words)


def apply_blocks(state: WeightState, m: Manifest, blocks: list[DecodedBlock]) -> None:
    """Check the digest the blocks would produce, then write them: all or nothing."""
    digest = state.digest.copy()
    news = []
    for blk in blocks:
        target = state.words[blk.name]
        old = target[blk.index]
        new = old + blk.delta if blk.delta is not None else blk.words
        assert new is not None
        digest.update(state.keys(blk.name), blk.index, old, new)
        news.append(new)
    if digest.hex() != m.weights_digest:
        raise ChainError(
            f"version {m.version}: applying it gives weights digest {digest.hex()}, manifest says {m.weights_digest}"
        )
    for blk, new in zip(blocks, news, strict=True):
        state.words[blk.name][blk.index] = new
    state.version, state.version_hash, state.digest = m.version, m.version_hash, digest


def check_link(parent: Manifest, child: Manifest) -> None:
    if child.parent is None or child.parent.version_hash != parent.version_hash:
        raise ChainError(
            f"version {child.version} names parent hash "
            f"{child.parent.version_hash if child.parent else None}, version {parent.version} "
            f"has {parent.version_hash}"
        )
    if child.kind == "delta" and child.tensors != parent.tensors:
        raise ChainError(f"delta version {child.version} changes the tensor table of version {parent.version}")


def _check_index(data: bytes, m: Manifest, what: str) -> None:
    try:
        doc = json.loads(data)
        weight_map = doc["weight_map"]
    except (ValueError, KeyError, TypeError):
        raise CorruptError(f"{what}: not a safetensors index") from None
    expected = {m.tensors[i].name: s.key.rsplit("/", 1)[1] for s in m.segments for i in s.tensors}
    if weight_map != expected:
        raise CorruptError(f"{what}: weight_map does not match the manifest's shards")


__all__ = ["Reader", "DecodedBlock", "check_link", "StoreError"]
