"""Object stores through fsspec (``s3://``, ``gs://``, ...): create-only is fsspec's
``pipe_file(mode="create")``, which is only as good as the filesystem implementing it.

A filesystem may implement ``mode="create"`` as exists-then-write; two writers racing then both
"create" and the later silently replaces the earlier, breaking immutability. So a protocol is
trusted only when it is listed in :data:`ATOMIC_CREATE` with the reason it is atomic; any other
is refused when the store is opened, unless a deployment declares it with
:func:`trust_atomic_create` (after running :class:`~aurora_store.testing.store_tests.StoreTests`
against it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aurora_store.errors import StoreError, UnsupportedError
from aurora_store.storage.base import Backend, Capabilities, Meter, taken

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

ATOMIC_CREATE: dict[str, str] = {
    "s3": "s3fs sends mode='create' as PutObject with If-None-Match: * (and completes multipart "
    "uploads with it): S3 checks and writes in one request and answers 412 if the key exists "
    "(tests/test_objectstore.py races writers against a moto server). An S3-compatible endpoint "
    "must honour If-None-Match on PUT; one that ignores it is not detected here",
    "s3a": "the same s3fs filesystem as s3",
    "gs": "gcsfs sends mode='create' as ifGenerationMatch=0: GCS creates the object only if no live "
    "generation exists, in one request, and gcsfs raises FileExistsError on its 412. The GCS backend "
    "(storage/_gcs.py) writes every object as one single-request upload on gcsfs's JSON-API filesystem, "
    "the path tests/test_gcs.py races writers on against fake-gcs-server (TestGcsStore::"
    "test_racing_writers_exactly_one_wins, test_processes_racing_for_one_key, test_objects_above_gcsfs_"
    "resumable_threshold_are_created_once); never a resumable upload, whose precondition that server "
    "drops, nor gcsfs's experimental filesystem, which overwrites in zonal buckets",
    "gcs": "the same gcsfs filesystem as gs",
}
"""fsspec protocols whose ``mode="create"`` is one atomic conditional create, and why."""


def trust_atomic_create(protocol: str, why: str) -> None:
    """Declare that ``protocol``'s fsspec ``mode="create"`` is one atomic conditional create (say
    ``why``), so stores on it may be opened. Run ``StoreTests`` against it first."""
    if not why.strip():
        raise StoreError(f"say why fsspec protocol {protocol!r} creates atomically")
    ATOMIC_CREATE[protocol] = why


class FsspecBackend(Backend):
    """Any fsspec filesystem whose protocol creates atomically (see :data:`ATOMIC_CREATE`)."""

    capabilities = Capabilities(atomic_create=True, staged_write=False, positional_read=False, mtime=True)
    modified_fields = ("mtime", "LastModified", "updated", "created")
    """S3's ``LastModified``; GCS's ``updated``, which gcsfs also lists as ``mtime`` (an aware datetime);
    ``mtime`` and ``created`` for other filesystems."""

    def __init__(self, fs: AbstractFileSystem, root: str, uri: str, meter: Meter) -> None:
        super().__init__(fs, root, uri, meter)
        protocols = (self.fs.protocol,) if isinstance(self.fs.protocol, str) else tuple(self.fs.protocol)
        self.why_atomic = next((ATOMIC_CREATE[p] for p in protocols if p in ATOMIC_CREATE), None)
        """Why this protocol's create-only writes are trusted."""
        if self.why_atomic is None:
            raise UnsupportedError(
                f"cannot open store {self.uri!r}: fsspec protocol {protocols[0]!r} ({type(self.fs).__name__}) is "
                "not known to create objects atomically (an exists-then-write emulation would let a racing "
                "writer replace an immutable object); known: "
                f"{', '.join(sorted(ATOMIC_CREATE))}. If its mode='create' is one conditional request, "
                "declare it with aurora_store.storage.trust_atomic_create()",
                url=self.uri,
            )

    def create(self, key: str, data: bytes | memoryview) -> bool:
        try:
            self._pipe_create(self.path(key), bytes(data))
        except Exception as exc:
            if not taken(exc):
                raise
            self.meter("upload", len(data))  # its body was sent before the backend said the key is taken
            return False
        self.meter("upload", len(data))
        return True

    def _pipe_create(self, path: str, data: bytes) -> None:
        """The filesystem's create-only write of ``data`` at ``path`` (raises if the key exists)."""
        self.fs.pipe_file(path, data, mode="create")

    def missing_bucket(self) -> str | None:
        bucket = self.root.lstrip("/").split("/", 1)[0]
        return None if self.fs.exists(bucket) else bucket
