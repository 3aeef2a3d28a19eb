"""Whom a run trusts: the run's lineage (fixed by its version 0), its signing keys' history (learnt
from its rotations), and whether a manifest is signed as that history requires.

A :class:`KeyChain` is what a :class:`~aurora_store.bucket.reader.Reader` verifies every manifest with:
the reader reads (manifests, objects, full versions, deltas), the key chain says whether to believe
what it read. A signed run's history is learnt step by step as versions are read in order, and
otherwise from one listing of the run's ``key-rotation`` markers, each marked manifest verified as a
rotation from the key before it (docs/FORMAT.md §4b). Nothing failed is held for good: a storage
error or a planted junk rotation costs a reader a backoff (:data:`RELEARN_S`), not its life.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from aurora_store.bucket.limits import Limits
from aurora_store.errors import ChainError, KeyHistoryError, MissingError, StoreError, UnauthenticatedError, about
from aurora_store.format import signing
from aurora_store.format.keys import VERSIONS_DIR, committed_version, manifest_key, rotation_marker_version
from aurora_store.format.manifest import LEGACY, Manifest, RunLineage
from aurora_store.format.manifest_parser import parse_manifest
from aurora_store.format.run_keys import RunKeys

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from aurora_store.bucket.objectstore import ObjectStore

log = logging.getLogger("aurora.store")

RELEARN_S = (1.0, 10.0)
"""A reader whose key history fails a signed version learns it again from a new listing: at once the first
time, then after 1 s, doubling to at most 10 s while it keeps failing (one LIST, and one GET per rotation)."""

MARKER_READS = 16
"""Manifests beside key-rotation markers a scan reads at once: however many markers a bucket holds (planted
ones included), a reader's start waits for about one round trip per 16 of them, not one per marker."""


def read_manifest(store: ObjectStore, limits: Limits, version: int) -> tuple[Manifest, bytes]:
    """The manifest of ``version`` parsed by the readers' rules (hash-checked, not yet trusted), and its
    exact bytes: one GET."""
    url = store.url(manifest_key(version))
    data = store.get(manifest_key(version), max_bytes=limits.max_manifest_bytes)
    m = parse_manifest(
        data,
        expect_version=version,
        max_bytes=limits.max_manifest_bytes,
        max_segment_bytes=limits.max_segment_bytes,
        what=url,
    )
    return m, data


def lineage_of(origin: Manifest) -> RunLineage:
    """The lineage of the run whose version 0 is ``origin``. A run of the legacy format (aurora/1)
    names none: its origin is version 0's hash and its signer version 0's key, so versions written
    by this code on top of it carry them from then on."""
    signed_by = origin.run.signed_by if origin.run is not None else None
    if origin.run is None and origin.signature is not None:
        signed_by = origin.signature.key_id
    return RunLineage(origin.version_hash, signed_by)


def check_member(m: Manifest, lineage: RunLineage, origin_format: str) -> None:
    """``m`` (a version after 0) belongs to the run ``lineage`` names: fulls too, which name no parent.
    (Which key signs it is :meth:`KeyChain.authenticate`'s to check: a signed run's key may rotate.)"""
    if m.run is None:
        if origin_format != LEGACY:
            raise ChainError(
                f"version {m.version} is in the legacy format {LEGACY} in a run started in {origin_format}"
            )
        return
    if m.run.origin != lineage.origin or (lineage.signed_by is None) != (m.run.signed_by is None):
        raise ChainError(f"version {m.version} belongs to run {m.run}, not to this run ({lineage})")


class KeyChain:
    """One run's lineage and key history as one reader has learnt them, and the checks of a manifest
    against them (:meth:`verify`)."""

    def __init__(
        self,
        store: ObjectStore,
        limits: Limits,
        verify_key: Ed25519PublicKey | None,
        *,
        insist: bool = True,
        source: KeyChain | None = None,
    ) -> None:
        self.store = store
        self.limits = limits
        self.verify_key = verify_key
        self.insist = insist
        """Verify every version with ``verify_key``, even in an unsigned run (False: only in a signed
        run, for a publisher whose key is its own signing key)."""
        self.source = source
        """The key chain of another copy of the same run to learn its key history from (a relay's
        source, for the destination it fills in order: a rotation may not be there yet when its key is
        the one given)."""
        self._lineage: RunLineage | None = None
        self._origin_format = LEGACY
        self._keys: RunKeys | None = None
        """A signed run's key history, as far as :attr:`_covered` (every rotation up to it is known)."""
        self._covered = -1
        self._bad_rotation: tuple[int, UnauthenticatedError] | None = None
        """The first rotation that failed its checks: no version from it on can be authenticated."""
        self._keys_lock = threading.Lock()
        self._relearn_at = 0.0
        """time.monotonic() before which the key history is not learnt again (see :data:`RELEARN_S`)."""
        self._relearn_wait = 0.0
        self._not_rotations: set[int] = set()
        """Versions whose key-rotation marker marks no rotation (their manifests are immutable: kept
        across relearning, never read again)."""
        self._warned_markers: set[int] = set()

    def verify(self, m: Manifest, url: str) -> None:
        """Whether to believe ``m`` (parsed from ``url``): of this run (its lineage is the one version 0
        fixed) and signed by the run's key at its version when the run is signed (a signed run cannot be
        read without one of its public keys) or when this chain holds a verify key. Version 0 fixes the
        lineage."""
        if m.version == 0:
            lineage = lineage_of(m)
            self.authenticate(m, lineage, url)
            self._fix_lineage(lineage, m.format, url)
            return
        lineage = self.lineage()
        check_member(m, lineage, self._origin_format)
        self.authenticate(m, lineage, url)

    def authenticate(self, m: Manifest, lineage: RunLineage, what: str) -> None:
        """Check ``m``'s signature as its run requires (see :meth:`verify`): in a signed
        run, by the key its run's key history says signs its version (the outgoing and incoming
        keys both, for a key rotation), with a verify key that is one of the run's keys."""
        if lineage.signed_by is None:
            if m.rotation is not None:
                raise UnauthenticatedError(f"{what}: version {m.version} rotates a key in an unsigned run")
            if self.verify_key is not None and self.insist:
                signing.verify(m, self.verify_key, what)
            return
        if self.verify_key is None:
            raise UnauthenticatedError(
                f"{what}: the run is signed by key {lineage.signed_by}; give its public key "
                "(--verify-key or AURORA_VERIFY_KEY) to read it"
            )
        try:
            self._authenticate_signed(m, lineage, what)
        except UnauthenticatedError:
            # what this reader learnt of the run's keys may be what failed: a rotation its listing did not
            # show yet, could not read or read as junk since removed, or not yet made to the key it was given
            if not self.relearn(lineage):
                raise
            self._authenticate_signed(m, lineage, what)
            self._relearn_wait = 0.0  # learnt again: the next fault starts the backoff afresh

    def relearn(self, lineage: RunLineage) -> bool:
        """Forget the run's key history, to be learnt again from a new listing, unless that was done less
        than the backoff ago (:data:`RELEARN_S`); whether it was forgotten. Nothing failed is ever held
        for good: a storage error or a planted junk rotation costs a reader a backoff, not its life."""
        src = self.source
        if src is not None and src.lineage() == lineage:
            return src.relearn(lineage)
        with self._keys_lock:
            now = time.monotonic()
            if now < self._relearn_at:
                return False
            first, cap = RELEARN_S
            self._relearn_wait = min(2 * self._relearn_wait, cap) if self._relearn_wait else first
            self._relearn_at = now + self._relearn_wait
            self._keys, self._covered, self._bad_rotation = None, -1, None
            return True

    def _authenticate_signed(self, m: Manifest, lineage: RunLineage, what: str) -> None:
        assert self.verify_key is not None
        keys = self.run_keys(m, lineage, what)
        era = keys.era(m.version)
        signer = m.run.signed_by if m.run is not None else era.key_id
        if signer != era.key_id:
            raise UnauthenticatedError(
                f"{what}: version {m.version} says it is signed by key {signer}, but the run's key at "
                f"version {m.version} is {era.key_id} (keys: {keys.describe()})"
            )
        if (m.rotation is not None) != (m.version > 0 and era.since == m.version):
            raise UnauthenticatedError(
                f"{what}: version {m.version} is a key rotation the run's key history does not hold "
                f"(keys: {keys.describe()}; is its {m.version:010d}/key-rotation marker missing?)"
            )
        if not keys.trusts(self.verify_key):
            bad = self._bad_rotation
            if bad is not None:  # the verify key may be the one that unverifiable rotation brought in
                raise bad[1]
            raise UnauthenticatedError(
                f"{what}: the run is signed by key {era.key_id} (keys: {keys.describe()}), the verify key "
                f"given is {signing.key_id(self.verify_key)}"
            )
        if m.rotation is None:
            assert era.public is not None
            signing.verify(m, era.public, what)
            return
        old, new = signing.verify_rotation(m, what)
        before = keys.previous(era)
        if era.public is None or before is None or before.public is None:
            raise UnauthenticatedError(f"{what}: version {m.version}'s rotation is not in the run's key history")
        if not (signing.same_key(new, era.public) and signing.same_key(old, before.public)):
            raise UnauthenticatedError(f"{what}: version {m.version} names keys other than the run's key history")

    def run_keys(self, m: Manifest, lineage: RunLineage, what: str) -> RunKeys:
        """The signed run's key history, known at least as far as ``m``'s version.

        Learned step by step as versions are read in order (a reader that holds version v and
        reads v + 1 learns a rotation there from v + 1 itself), and otherwise from one listing of
        the run: every rotation has a ``key-rotation`` marker beside its manifest, and each marked
        manifest is verified as a rotation from the key before it. UnauthenticatedError for a
        version at or after a rotation that fails those checks."""
        assert lineage.signed_by is not None and self.verify_key is not None
        src = self.source
        if src is not None and src.lineage() == lineage:
            return src.keys_at(m.version, what)
        with self._keys_lock:
            keys = self._held_keys(lineage)
            v = m.version
            if v > self._covered:
                if v == self._covered + 1 and v > 0 and self._bad_rotation is None:
                    self._step(keys, m, what)
                else:
                    self._scan(keys, lineage)
                    if v == self._covered + 1 and self._bad_rotation is None:
                        self._step(keys, m, what)
            return self._known(keys, v, what)

    def keys_at(self, version: int, what: str) -> RunKeys:
        """This (signed) run's key history, known at least as far as ``version`` (from a listing)."""
        lineage = self.lineage()
        assert lineage.signed_by is not None and self.verify_key is not None
        with self._keys_lock:
            keys = self._held_keys(lineage)
            if version > self._covered and self._bad_rotation is None:
                self._scan(keys, lineage)
            return self._known(keys, version, what)

    def _held_keys(self, lineage: RunLineage) -> RunKeys:
        assert lineage.signed_by is not None
        if self._keys is None or self._keys.first != lineage.signed_by:
            self._keys, self._covered, self._bad_rotation = RunKeys(lineage.signed_by), -1, None
        return self._keys

    def _known(self, keys: RunKeys, version: int, what: str) -> RunKeys:
        """``keys``, once they are known to cover ``version`` (UnauthenticatedError otherwise)."""
        if self._bad_rotation is not None and version >= self._bad_rotation[0]:
            raise self._bad_rotation[1]
        if version > self._covered:
            raise UnauthenticatedError(
                f"{what}: version {version} is not in the listing of the run; its key is unknown"
            )
        assert self.verify_key is not None
        keys.bind(self.verify_key)
        return keys

    def _step(self, keys: RunKeys, m: Manifest, what: str) -> None:
        if m.rotation is not None:
            try:
                keys.add(m, what)
            except UnauthenticatedError as exc:
                self._bad_rotation = (m.version, exc)
                raise
        self._covered = m.version

    def _scan(self, keys: RunKeys, lineage: RunLineage) -> None:
        """Learn every rotation after :attr:`_covered` from the run's listing (one LIST, then the marked
        manifests read together: a reader's start costs one round trip however many markers there are).
        A marker beside a version that rotates no key (planted, or left by a trainer killed mid-rotation
        before it published that version without one) is remembered and warned of once per process;
        ``aurora gc --apply`` removes them."""
        listed = self.store.list_keys(VERSIONS_DIR)
        committed = {v for v in map(committed_version, listed) if v is not None}
        marked = sorted(v for v in map(rotation_marker_version, listed) if v is not None)
        top = max(committed, default=-1)
        floor = max(self._covered, keys.last.since)
        # known, a rotation whose publish did not commit, or a marker already found to mark no rotation
        todo = [r for r in marked if r > floor and r in committed and r not in self._not_rotations]
        try:
            for r, read in zip(todo, self._read_marked(todo), strict=True):
                url = self.store.url(manifest_key(r))
                try:
                    if isinstance(read, StoreError):
                        raise read
                    if read.run is None or read.run.origin != lineage.origin:
                        raise ChainError(f"{url}: version {r} is not of this run ({lineage.origin})")
                    if read.rotation is None:
                        self._not_rotations.add(r)
                        continue
                    keys.add(read, url)
                except StoreError as exc:
                    err = KeyHistoryError(f"the key rotation at version {r} cannot be verified: {exc}", url=url)
                    self._bad_rotation, self._covered = (r, err), r - 1
                    return
        finally:
            self._warn_markers()
        self._covered = max(self._covered, top)

    def _read_marked(self, versions: list[int]) -> list[Manifest | StoreError]:
        """The manifests of ``versions`` (or why each could not be read), read concurrently on a pool of
        the scan's own: the scan holds the key lock, and may run on a task of the store's pool."""

        def read(v: int) -> Manifest | StoreError:
            try:
                return read_manifest(self.store, self.limits, v)[0]
            except StoreError as exc:
                return exc

        if len(versions) <= 1:
            return [read(v) for v in versions]
        with ThreadPoolExecutor(min(MARKER_READS, len(versions)), thread_name_prefix="aurora-markers") as pool:
            return list(pool.map(read, versions))

    def _warn_markers(self) -> None:
        new = sorted(self._not_rotations - self._warned_markers)
        if new:
            self._warned_markers.update(new)
            shown = ", ".join(map(str, new[:5])) + (f" and {len(new) - 5} more" if len(new) > 5 else "")
            log.warning(
                "%s: %d key-rotation marker(s) beside versions that rotate no key (%s): ignored; "
                "aurora gc --apply removes them",
                self.store.uri,
                len(new),
                shown,
            )

    def lineage(self) -> RunLineage:
        """The run's lineage, as its version 0 fixed it (read and verified once, then held: a version 0
        replaced under a long-running reader is a foreign run, not a new lineage)."""
        if self._lineage is None:
            url = self.store.url(manifest_key(0))
            try:
                m, _ = read_manifest(self.store, self.limits, 0)
            except MissingError as exc:
                raise ChainError(
                    f"version 0 of {self.store.uri} is missing: it fixes the run's lineage, and no "
                    "version can be checked against it",
                    url=exc.url,
                ) from None
            with about(url):
                self.verify(m, url)
        assert self._lineage is not None
        return self._lineage

    @property
    def known(self) -> bool:
        """Whether the run's lineage is known already."""
        return self._lineage is not None

    def _fix_lineage(self, lineage: RunLineage, fmt: str, url: str) -> None:
        if self._lineage is not None and self._lineage != lineage:
            raise ChainError(f"{url}: version 0 changed under this reader (run {lineage}, was {self._lineage})")
        self._lineage, self._origin_format = lineage, fmt
