"""What the next version of a run is: its latest, read cheaply, and the plan after it.

The rules of a plan (number, parent, full or delta, the chain budget) are
:func:`~aurora_store.bucket.plan.plan_next`'s; this reads what they need from the bucket (the latest,
the key history for a rotation) and checks, before a byte is written, that the version can be
signed and that its manifest can fit the readers' cap.
"""

from __future__ import annotations

from collections.abc import Mapping

from aurora_store.bucket.attachments import Attachments
from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.bucket.plan import Latest, PublishPlan, committed_elsewhere, plan_next
from aurora_store.bucket.reader import Reader
from aurora_store.bucket.run_config import RunConfig
from aurora_store.bucket.signer import Signer
from aurora_store.errors import LimitError, UnauthenticatedError
from aurora_store.format.keys import manifest_key
from aurora_store.format.manifest import Rotation, TensorSpec


class Planner:
    """Plans a run's next version for its publishers."""

    def __init__(
        self, store: ObjectStore, reader: Reader, config: RunConfig, *, files: Attachments, signer: Signer
    ) -> None:
        self.store, self.reader, self.config, self.files, self.signer = store, reader, config, files, signer

    def latest(self, known: Latest | None = None) -> Latest | None:
        """The last committed version (None for an empty run). With the latest a publisher last committed
        (``known``), one key is checked instead of listing the run, so a publish costs the same at
        version 10 and at 100,000; if another publisher has committed since, ConflictError."""
        if known is not None:
            if self.store.exists(manifest_key(known.version + 1)):
                raise committed_elsewhere(self.store.url(manifest_key(known.version + 1)), known.version + 1)
            return known
        versions = self.reader.versions()
        return None if not versions else Latest.of(self.reader.manifest(versions[-1]), self.reader.lineage())

    def plan(
        self,
        specs: tuple[TensorSpec, ...],
        *,
        kind: str = "auto",
        version: int | None = None,
        known: Latest | None = None,
    ) -> PublishPlan:
        """The next version with tensor table ``specs`` (see :func:`plan_next`), after ``known`` (the latest
        the publisher holds; ConflictError if another publisher got there first) or the run's latest."""
        latest = self._read_latest(known)
        rotation = self.signer.rotation_for(latest)  # first: it may move the signer to its new key
        return self._next(latest, specs, kind=kind, version=version, rotation=rotation)

    def check_signer(self) -> Latest | None:
        """The run's latest, once the run's signer is known to be able to sign its next version (what a
        trainer checks at start); UnauthenticatedError, saying what to do, otherwise."""
        latest = self._read_latest(None)
        rotation = self.signer.rotation_for(latest)  # first: it may move the signer to its new key
        self.signer.check_not_retired(latest)
        self._next(latest, latest.specs if latest is not None else (), kind="auto", version=None, rotation=rotation)
        return latest

    def _next(
        self,
        latest: Latest | None,
        specs: tuple[TensorSpec, ...],
        *,
        kind: str,
        version: int | None,
        rotation: Rotation | None,
    ) -> PublishPlan:
        """:func:`plan_next` with this run's budget, URI and signer."""
        return plan_next(
            latest,
            specs,
            kind=kind,
            full_every=self.config.full_every,
            version=version,
            url=self.store.uri,
            signer=self.signer.key_id,
            rotation=rotation,
        )

    def floor(self, plan: PublishPlan, step: int | None, meta: Mapping[str, str] | None) -> int:
        """The bytes of ``plan``'s smallest delta manifest (what every delta entry adds to), after
        checking that its manifest can fit the readers' cap: LimitError before a byte is written if
        even its smallest manifest (:meth:`PublishPlan.skeleton`, sealed as the commit seals it) would
        not. An ``auto`` plan may turn full, so it must fit as a full version."""
        cap = self.config.limits.max_manifest_bytes
        files = self.files.refs()

        def size(full: bool) -> tuple[int, int]:
            m = plan.skeleton(shard_bytes=self.config.shard_bytes, files=files, step=step, meta=meta, full=full)
            return len(self.signer.seal(m, rotates=False).to_bytes()), len(m.segments)

        floor, _ = size(False)
        full = plan.full or plan.kind == "auto"
        least, shards = size(True) if full else (floor, 0)
        if least > cap:
            what = f"a full version's {shards} shards and " if full else ""
            url = self.store.url(manifest_key(plan.version))
            raise LimitError(
                f"{url}: version {plan.version}: its manifest would be at least {least} bytes, over the cap of "
                f"{cap} ({what}a table of {len(plan.specs)} tensors); raise the readers' max_manifest_bytes "
                "(every reader of the run needs it too) or publish fewer, larger tensors",
                url=url,
            )
        return floor

    def _read_latest(self, known: Latest | None) -> Latest | None:
        try:
            return self.latest(known)
        except UnauthenticatedError as exc:
            told = self.signer.unreadable(exc)
            if told is exc:
                raise
            raise told from None
