"""A region's bucket as ``aurora bench chaos`` sees it from outside the run: read at the end, and
damaged (then put back) by the faults. Its own module so that the faults (:mod:`bench.chaos.faults`)
and the checks (:mod:`bench.chaos.check`) both use it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aurora_store.format.keys import STATE_DIR, committed_state, committed_version, manifest_key

if TYPE_CHECKING:
    from aurora_store.testing.moto import S3Server


@dataclass(slots=True)
class RegionState:
    """What one region's bucket holds at the end."""

    versions: list[int]
    manifests: dict[int, bytes]
    """Version -> its manifest's bytes as stored."""
    audit_error: str | None = None
    """The audit's first error, None if every committed version passed."""
    audited: int = 0
    """Versions the audit checked."""


@dataclass(slots=True)
class Bucket:
    """A region's bucket on its S3 server, read and (by the faults) damaged behind the run's back."""

    region: str
    server: S3Server
    bucket: str
    prefix: str
    """The run's prefix in the bucket, ending in '/'."""
    originals: dict[str, bytes] = field(default_factory=dict)
    """Key -> the object's bytes before it was first damaged (put back by `restore`)."""
    _client: Any = None

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix.rstrip('/')}"

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = self.server.client()
        return self._client

    def get(self, key: str) -> bytes:
        data: bytes = self.client.get_object(Bucket=self.bucket, Key=self.prefix + key)["Body"].read()
        return data

    def put(self, key: str, data: bytes | None) -> None:
        """Write ``data`` at ``key`` unconditionally; None deletes the object."""
        if data is None:
            self.client.delete_object(Bucket=self.bucket, Key=self.prefix + key)
        else:
            self.client.put_object(Bucket=self.bucket, Key=self.prefix + key, Body=data)

    def damage(self, key: str, data: bytes | None) -> None:
        """Overwrite ``key`` with ``data`` (None: delete it), remembering the original bytes."""
        self.originals.setdefault(key, self.get(key))
        self.put(key, data)

    def restore(self, key: str) -> bool:
        """Put back ``key``'s original bytes; False if it was not damaged (or is restored already)."""
        original = self.originals.pop(key, None)
        if original is not None:
            self.put(key, original)
        return original is not None

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self.prefix + key)
        except Exception:
            return False
        return True

    def has_state(self, version: int) -> bool:
        """Whether a committed trainer state of ``version`` is there (under any name)."""
        prefix = self.prefix + f"{STATE_DIR}/state-{version:010d}"
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        keys = [o["Key"][len(self.prefix) :] for page in pages for o in page.get("Contents", [])]
        return any((committed_state(k) or (-1, None))[0] == version for k in keys)

    def versions(self) -> list[int]:
        """Committed versions (those with a manifest), from a listing."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
        keys = [o["Key"][len(self.prefix) :] for page in pages for o in page.get("Contents", [])]
        return sorted(v for v in map(committed_version, keys) if v is not None)

    def state(self, options: dict[str, Any], verify_key: bytes) -> RegionState:
        """What the bucket holds now, audited with the run's verify key."""
        return region_state(self.uri, options, verify_key)


def region_state(uri: str, options: dict[str, Any], verify_key: bytes) -> RegionState:
    """What the run at ``uri`` (any fsspec URI) holds now: its committed versions, audited with
    ``verify_key``, and each one's manifest bytes as stored."""
    from aurora_store.bucket.audit import audit
    from aurora_store.bucket.run import open_run

    with open_run(uri, storage_options=options, verify_key=verify_key) as run:
        versions = run.versions()
        result = audit(run)
        err = None if result.first_error is None else f"v{result.first_error.version}: {result.first_error.error}"
        cap = run.config.limits.max_manifest_bytes
        raw = {v: run.store.get(manifest_key(v), max_bytes=cap) for v in versions}
    return RegionState(versions, raw, err, sum(r.status == "ok" for r in result.versions))
