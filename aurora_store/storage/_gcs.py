"""``gs://`` (and ``gcs://``) through gcsfs, on the paths where GCS's create-only holds and is tested.

Create-only is an upload with ``ifGenerationMatch=0``: GCS writes the object only if no live
generation exists, in one request, and answers 412 otherwise. Two of gcsfs's write paths do not
carry that promise the way AuroraRL needs it, so this backend never takes them:

- **Resumable uploads.** gcsfs sends an object of 50 MiB or more (every full version's 256 MiB shard)
  as a resumable upload, with the precondition on the request that starts it. fake-gcs-server, the
  GCS server the tests run, drops it there (it checks preconditions on single-request uploads only;
  ``tests/test_gcs.py::test_fake_gcs_server_ignores_the_precondition_of_resumable_uploads``), so
  that path cannot be exercised here. Every create is one single-request (multipart) upload
  instead, whatever its size (GCS takes up to 5 TiB so; a failed upload is retried whole).
- **gcsfs's experimental filesystem.** With ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT`` unset or true (the
  default of gcsfs 2026.x), ``gcsfs.GCSFileSystem`` is ``ExtendedGcsFileSystem``: it asks the Storage
  Control gRPC API for each bucket's layout before its first call, and writes a zonal bucket through
  gRPC appendable objects that ignore ``mode="create"`` (gcsfs ``extended_gcsfs.simple_upload``: "it
  creates a new object and overwrites if object already exists"). This backend replaces it by
  gcsfs's JSON-API filesystem, with the same storage options, whatever the variable says.

GCS answers a ranged read that starts at or past an object's end with 416, which gcsfs raises as its
own ``HttpError`` (no ``OSError``) and logs with a traceback at ERROR before it does: the store reads
that range as empty (:func:`~aurora_store.storage.base.unsatisfiable`) and the log record is dropped.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

from aurora_store.storage._fsspec import FsspecBackend
from aurora_store.storage.base import Meter, unsatisfiable

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem


def is_gcsfs(fs: AbstractFileSystem) -> bool:
    """Whether ``fs`` is a gcsfs filesystem (without importing gcsfs where no one has)."""
    core = sys.modules.get("gcsfs.core")
    return core is not None and isinstance(fs, core.GCSFileSystem)


def json_api_filesystem(fs: AbstractFileSystem) -> AbstractFileSystem:
    """``fs`` if it is gcsfs's JSON-API filesystem itself, else that filesystem with ``fs``'s options."""
    from gcsfs.core import GCSFileSystem

    if type(fs) is GCSFileSystem:
        return fs
    return GCSFileSystem(*fs.storage_args, **fs.storage_options)


class _ExpectedAnswers(logging.Filter):
    """Drops gcsfs's ERROR record of a 416: a read at an object's end, which the store reads as empty."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return exc is None or not unsatisfiable(exc)


_EXPECTED = _ExpectedAnswers()


class GcsBackend(FsspecBackend):
    """A run root in a GCS bucket, through gcsfs's JSON API (see the module's docstring)."""

    def __init__(self, fs: AbstractFileSystem, root: str, uri: str, meter: Meter) -> None:
        super().__init__(json_api_filesystem(fs), root, uri, meter)
        logging.getLogger("gcsfs").addFilter(_EXPECTED)  # one filter object: adding it again is a no-op

    def _pipe_create(self, path: str, data: bytes) -> None:
        # chunksize above the size: gcsfs's single-request upload, never its resumable one
        self.fs.pipe_file(path, data, mode="create", chunksize=len(data) + 1)
