"""Committing a version: its manifest, built from every publisher's part, signed, checked with the
readers' rules and written last, create-only (or sealed and deferred, to be written later).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from aurora_store.bucket.announce import Announcements
from aurora_store.bucket.attachments import Attachments
from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.bucket.parts import Part, Uploads
from aurora_store.bucket.plan import PublishPlan, VersionInfo, committed_elsewhere
from aurora_store.bucket.run_config import RunConfig
from aurora_store.bucket.signer import Signer
from aurora_store.errors import ConflictError, LimitError, StoreError
from aurora_store.format.digest import Digest
from aurora_store.format.full import build_index
from aurora_store.format.keys import manifest_key, rotation_marker_key
from aurora_store.format.manifest import Manifest, Rollback
from aurora_store.format.manifest_parser import parse_manifest

log = logging.getLogger("aurora.store")


class Committer:
    """Writes the manifests of one publisher group's versions (on its rank 0)."""

    def __init__(
        self,
        store: ObjectStore,
        config: RunConfig,
        *,
        files: Attachments,
        announcements: Announcements,
        signer: Signer,
    ) -> None:
        self.store, self.config, self.files = store, config, files
        self.announcements, self.signer = announcements, signer
        self._deferred: _Deferred | None = None
        """A version committed with ``defer=True``: sealed and checked, not written yet."""
        self._markers_checked = False
        """Whether a key-rotation marker a killed predecessor left at the version this committer writes
        without a rotation was looked for (once: it writes a marker only with its rotation)."""

    def commit(
        self,
        plan: PublishPlan,
        parts: list[Part],
        *,
        step: int | None,
        meta: Mapping[str, str] | None,
        rolls_back_to: Rollback | None = None,
        defer: bool = False,
    ) -> VersionInfo:
        """Write the manifest of ``plan``'s version from every publisher's part: the commit (with
        ``defer``, seal it and keep it for :meth:`commit_deferred`).

        Delta segments keep the order of ``parts``; a full version's shards are ordered by their
        first tensor and its index is built and uploaded here. The manifest is parsed back with
        the readers' rules before it is written. ConflictError if the version is already committed."""
        t0 = time.perf_counter()
        entries = [e for p in parts for e in p.entries]
        digest = Digest() if plan.full or plan.parent is None else Digest.from_hex(plan.parent.weights_digest)
        for p in parts:
            digest.add(p.digest)
        index = None
        if plan.full:
            entries.sort(key=lambda e: e.tensors[0] if e.tensors else -1)
            uploads = Uploads(self.store, plan.version, self.announcements)
            uploads.submit(build_index(plan.version, plan.specs, entries))
            (index,) = uploads.wait()
        m = plan.manifest(
            segments=tuple(entries),
            index=index,
            changed=sum(p.changed for p in parts),
            counted=all(p.counted for p in parts),
            weights_digest=digest.hex(),
            files=self.files.refs(),
            step=step,
            meta=meta,
            rolls_back_to=rolls_back_to,
        )
        m = self.signer.seal(m, rotates=plan.rotation is not None)
        data = m.to_bytes()
        key = manifest_key(plan.version)
        lim = self.config.limits
        parse_manifest(
            data,
            expect_version=plan.version,
            max_bytes=lim.max_manifest_bytes,
            max_segment_bytes=lim.max_segment_bytes,
            what=f"{self.store.url(key)} (before commit)",
        )
        if plan.rotation is not None:  # before the commit: a reader listing the run finds every rotation
            self.store.put_if_absent(rotation_marker_key(plan.version), b"")
        elif not self._markers_checked:
            self._remove_leftover_marker(plan.version)
        if defer:
            self._deferred = _Deferred(key, data, m)
        else:
            self._put_manifest(key, data, m)
        return VersionInfo.of(m, time.perf_counter() - t0)

    def _remove_leftover_marker(self, version: int) -> None:
        """Before committing ``version`` without a rotation, remove the key-rotation marker a trainer
        killed mid-rotation left there (written before its manifest, which never committed): it would
        cost every new reader a read and a warning for the life of the run. Looked for once per
        publisher (one HEAD): an S3 delete says nothing of whether the key was there."""
        key = rotation_marker_key(version)
        self._markers_checked = True
        try:
            if not self.store.exists(key):
                return
            self.store.delete([key])
        except StoreError as exc:  # a bucket that refuses deletes: readers warn of it; gc removes it
            log.warning(
                "%s: could not remove the stray key-rotation marker at version %d: %s", self.store.uri, version, exc
            )
            return
        log.warning(
            "%s: removed the key-rotation marker a publish that did not commit left at version %d "
            "(this version rotates no key)",
            self.store.uri,
            version,
        )

    def _put_manifest(self, key: str, data: bytes, m: Manifest) -> None:
        # These very bytes already there are this publisher's commit: its create-only request was
        # written but its answer lost, and the storage client's retry was refused (412) as a taken key.
        try:
            self.store.put_immutable(key, data, verify=lambda existing: existing == data)
        except (ConflictError, LimitError):
            raise committed_elsewhere(self.store.url(key), m.version) from None
        self.announcements.commit(m)

    @property
    def deferred(self) -> Manifest | None:
        """The sealed manifest of the version published with ``defer`` and not committed yet."""
        return None if self._deferred is None else self._deferred.manifest

    def commit_deferred(self) -> VersionInfo:
        """Write the deferred version's manifest: its commit. ConflictError if another publisher committed
        that version meanwhile (the next publish reloads the run); either way nothing is deferred after."""
        deferred, self._deferred = self._deferred, None
        if deferred is None:
            raise StoreError("no version's commit is deferred")
        t0 = time.perf_counter()
        self._put_manifest(deferred.key, deferred.data, deferred.manifest)
        return VersionInfo.of(deferred.manifest, time.perf_counter() - t0)


@dataclass(frozen=True, slots=True)
class _Deferred:
    """A sealed manifest, not yet written."""

    key: str
    data: bytes
    manifest: Manifest
