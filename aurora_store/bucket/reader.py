"""Reading versions: verified manifests, verified objects, full versions and decoded deltas.

Every object is fetched with parallel ranged GETs, its size and SHA-256 checked against the
manifest before a single byte is decoded. A delta is decoded completely and its weights digest
checked before anything is written to the target weights, so a failed apply leaves them exactly
at the old version. An error about an object carries that object's URL. No torch here.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from aurora_store.bucket.keychain import KeyChain, read_manifest
from aurora_store.bucket.limits import Limits
from aurora_store.codec.words import HostWords
from aurora_store.errors import ChainError, CorruptError, LimitError, MissingError, StoreError, about
from aurora_store.format.blocks import DecodedBlock, apply_blocks, decode_block
from aurora_store.format.digest import Digest
from aurora_store.format.full import check_index, read_shard
from aurora_store.format.keys import (
    FILES_DIR,
    VERSIONS_DIR,
    committed_version,
    manifest_key,
)
from aurora_store.format.manifest import Manifest, RunLineage, Segment, check_link
from aurora_store.format.run_keys import RunKeys
from aurora_store.format.weights import WeightState, full_digest

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from aurora_store.bucket.objectstore import ObjectStore
    from aurora_store.codec.base import Words

T = TypeVar("T")
log = logging.getLogger("aurora.store")


def _sha256(data: memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


class Reader:
    """Verified access to one run's versions."""

    def __init__(
        self,
        store: ObjectStore,
        limits: Limits,
        verify_key: Ed25519PublicKey | None,
        *,
        insist: bool = True,
        keys_from: Reader | None = None,
    ) -> None:
        self.store = store
        self.limits = limits
        source = keys_from.trust if keys_from is not None else None
        self.trust: KeyChain = KeyChain(store, limits, verify_key, insist=insist, source=source)
        """Whom this run trusts: its lineage, its key history, the checks every manifest passes."""
        self._manifests: OrderedDict[int, Manifest] = OrderedDict()
        """Verified manifests, most recently used last (at most ``limits.cached_manifests``)."""
        self._verified_files: set[tuple[str, str]] = set()

    @property
    def verify_key(self) -> Ed25519PublicKey | None:
        return self.trust.verify_key

    # ------------------------------------------------------------ manifests

    def versions(self) -> list[int]:
        """Versions with a manifest (committed), ascending."""
        found = (committed_version(key) for key in self.store.list_keys(VERSIONS_DIR))
        return sorted(v for v in found if v is not None)

    def manifest(self, version: int) -> Manifest:
        """The verified manifest of ``version`` (parsed, hash-checked, signature-checked)."""
        if version in self._manifests:
            self._manifests.move_to_end(version)
            return self._manifests[version]
        return self.manifest_with_bytes(version)[0]

    def manifest_with_bytes(self, version: int) -> tuple[Manifest, bytes]:
        """The verified manifest of ``version`` and its exact bytes (what a relay copies), in one GET.

        Verified means: parsed by the readers' rules, hash-checked, of this run (its lineage is
        the one version 0 fixed), and signed by the run's key at that version when the run is
        signed (whatever this reader was given: a signed run cannot be read without one of its
        public keys) or when this reader holds a verify key."""
        url = self.store.url(manifest_key(version))
        with about(url):
            m, data = read_manifest(self.store, self.limits, version)
            self.trust.verify(m, url)
        self._manifests[version] = m
        while len(self._manifests) > self.limits.cached_manifests:
            self._manifests.popitem(last=False)
        return m, data

    def lineage(self) -> RunLineage:
        """The run's lineage, as its version 0 fixed it (see :meth:`KeyChain.lineage`)."""
        if not self.trust.known:
            with contextlib.suppress(MissingError):  # read through this reader: version 0 is cached
                self.manifest_with_bytes(0)
        return self.trust.lineage()

    def keys_at(self, version: int, what: str) -> RunKeys:
        """This (signed) run's key history, known at least as far as ``version`` (from a listing)."""
        return self.trust.keys_at(version, what)

    def chain(self, version: int) -> list[Manifest]:
        """Manifests from the nearest full version up to ``version``, parent hashes checked."""
        chain = [self.manifest(version)]
        while chain[-1].kind != "full":
            child = chain[-1]
            assert child.parent is not None
            try:
                parent = self.manifest(child.parent.version)
            except MissingError:
                url = self.store.url(manifest_key(child.parent.version))
                raise ChainError(
                    f"version {child.version} needs version {child.parent.version}, which is missing ({url})", url=url
                ) from None
            with about(self.store.url(manifest_key(child.version))):
                check_link(parent, child)
            chain.append(parent)
        chain.reverse()
        return chain

    # ------------------------------------------------------------ objects

    def fetch(self, seg: Segment) -> memoryview:
        """An object's bytes (a writable buffer), verified against its manifest entry."""
        data = self._get(seg)
        self._check(seg, _sha256(data))
        return data

    def fetch_all(self, m: Manifest) -> list[memoryview]:
        """The verified bytes of every segment of ``m``, in manifest order, fetched in parallel (what an
        engine that decodes where its weights live is handed)."""
        return list(self.store.map(self.fetch, m.segments))

    def fetch_then(self, seg: Segment, use: Callable[[memoryview], T]) -> T:
        """``use(bytes of seg)``, run while their SHA-256 is computed beside it; its result is
        returned only once the hash matches the manifest (a mismatch is the error reported, even
        when ``use`` failed on the bytes: ``use`` must treat them as hostile, which parsers do)."""
        data = self._get(seg)
        hashing = self.store.part_pool.submit(_sha256, data)
        try:
            result = use(data)
        except StoreError:
            self._check(seg, hashing.result())
            raise
        self._check(seg, hashing.result())
        return result

    def _get(self, seg: Segment) -> memoryview:
        url = self.store.url(seg.key)
        with about(url):
            if seg.size > self.limits.max_segment_bytes:
                raise LimitError(f"{url}: {seg.size} bytes exceeds the segment cap")
            return self.store.get_sized(seg.key, seg.size, self.limits.part_bytes)

    def _check(self, seg: Segment, got: str) -> None:
        if got != seg.sha256:
            url = self.store.url(seg.key)
            raise CorruptError(f"{url}: sha256 {got}, manifest says {seg.sha256}", url=url)

    def files(self, m: Manifest, names: Callable[[str], bool] | None = None) -> dict[str, bytes]:
        """The attachments ``m`` vouches for (those whose name ``names`` accepts, when given), by name,
        each checked against its size and SHA-256 there: what a role reads of a run's files (a file
        swapped behind the manifest's back is an error)."""
        out = {}
        for f in m.files:
            name = f.key.removeprefix(f"{FILES_DIR}/")
            if names is not None and not names(name):
                continue
            out[name] = bytes(self.fetch(f))
            self._verified_files.add((f.key, f.sha256))
        return out

    def verify_files(self, m: Manifest) -> None:
        """Check the attachments ``m`` vouches for (each distinct file once per reader)."""
        for f in m.files:
            if (f.key, f.sha256) not in self._verified_files:
                self.fetch(f)
                self._verified_files.add((f.key, f.sha256))

    # ------------------------------------------------------------ full versions

    def load_full(self, m: Manifest) -> WeightState:
        """Every tensor of full version ``m``, from its shards (in parallel), digest checked."""
        if m.index is not None:
            url = self.store.url(m.index.key)
            data = self.fetch(m.index)
            with about(url):
                check_index(data, m, url)

        def load(seg: Segment) -> tuple[dict[str, np.ndarray], Digest]:
            url = self.store.url(seg.key)

            def parse(data: memoryview) -> tuple[dict[str, np.ndarray], Digest]:
                with about(url):
                    words = read_shard(data, m, seg, url)  # views into the shard's buffer: no copy
                return words, full_digest(tuple(m.tensors[i] for i in seg.tensors), words)

            return self.fetch_then(seg, parse)  # the digest runs beside the shard's SHA-256 and other shards' I/O

        words: dict[str, np.ndarray] = {}
        digest = Digest()
        for part, part_digest in self.store.map(load, m.segments):
            words.update(part)
            digest.add(part_digest)
        if digest.hex() != m.weights_digest:
            raise ChainError(
                f"version {m.version}: weights digest {digest.hex()}, manifest says {m.weights_digest}",
                url=self.store.url(manifest_key(m.version)),
            )
        return WeightState(m.tensors, words, m.version, m.version_hash, digest)

    # ------------------------------------------------------------ deltas

    def decode_delta(
        self, m: Manifest, old: Words, on_segment: Callable[[Segment], None] | None = None
    ) -> list[DecodedBlock]:
        """Fetch, verify and decode every segment of a delta (in parallel); nothing is applied.

        ``old`` gives the weights' words before this version (their exponents context the
        codecs: see :mod:`aurora_store.format.blocks`)."""
        cap = self.limits.max_block_decoded_bytes

        def load(seg: Segment) -> list[DecodedBlock]:
            data = memoryview(self.fetch(seg))
            url = self.store.url(seg.key)
            with about(url):
                out = [decode_block(m, seg, b_i, data, url, cap, old) for b_i in range(len(seg.blocks))]
            if on_segment is not None:
                on_segment(seg)
            return out

        blocks: list[DecodedBlock] = []
        for part in self.store.map(load, m.segments):
            blocks.extend(part)
        return blocks

    def materialize(self, version: int) -> WeightState:
        """The verified bit patterns of ``version``: its nearest full version plus the deltas after it."""
        chain = self.chain(version)
        state = self.load_full(chain[0])
        for m in chain[1:]:
            self.apply_delta(state, m)
        return state

    def apply_delta(self, state: WeightState, m: Manifest, blocks: list[DecodedBlock] | None = None) -> None:
        """Move ``state`` from ``m``'s parent to ``m``: all or nothing."""
        url = self.store.url(manifest_key(m.version))
        if m.parent is None or state.version != m.parent.version or state.version_hash != m.parent.version_hash:
            raise ChainError(
                f"version {m.version} applies to version {m.parent.version if m.parent else None}, "
                f"weights are at {state.version}",
                url=url,
            )
        if state.specs != m.tensors:
            raise ChainError(f"version {m.version}: tensor table differs from version {state.version}", url=url)
        if blocks is None:
            blocks = self.decode_delta(m, HostWords(state.words))
        with about(url):
            apply_blocks(state, m, blocks)
