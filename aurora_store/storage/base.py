"""The storage backend interface: what one kind of bucket can do, declared as capabilities, and
the one place where a backend's exceptions become the store's error family.

A backend knows keys under its root and the bytes it moves; it never parses them and sets no
policy (caps, pools, retries): :class:`~aurora_store.bucket.objectstore.ObjectStore` composes one.
A backend is chosen from the URI by :func:`aurora_store.storage.open_backend`.
"""

from __future__ import annotations

import contextlib
import errno
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from aurora_store.errors import (
    ConflictError,
    CorruptError,
    MissingError,
    StoreError,
    UnreachableError,
    UnsupportedError,
)
from aurora_store.localfile import NotRegularFile
from aurora_store.redact import redact

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from fsspec import AbstractFileSystem


class Staged(Protocol):
    """An object being written before its key is known (its bytes are hashed as they are written);
    what :meth:`Backend.stage` starts on a ``staged_write`` backend."""

    def write(self, piece: bytes | memoryview) -> None: ...

    def link(self, key: str) -> bool:
        """Make the bytes written the object ``key`` unless it exists; True if this call made it."""
        ...

    def discard(self) -> None:
        """Forget the bytes written (a no-op once linked)."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Capabilities:
    """What a backend can do; :class:`~aurora_store.testing.store_tests.StoreTests` checks exactly this."""

    atomic_create: bool
    """:meth:`Backend.create` is one atomic conditional create: of racing writers exactly one wins and
    an existing object is never replaced. A store is never opened on a backend without it."""
    staged_write: bool
    """:meth:`Backend.stage`: an object's bytes can be written before its key is known and linked
    under the key later (a shard streamed while its hash is computed). Such a backend can hold the
    temporary files of a killed writer, which :meth:`Backend.sweep_temporaries` removes."""
    positional_read: bool
    """:meth:`Backend.read_into`: parallel positional reads straight into the caller's buffer
    (else an object is read by ranged GETs, one copy per part)."""
    mtime: bool
    """Listings report when each object was written (:meth:`Backend.modified`); ``aurora gc`` ages
    results by it."""


class Meter:
    """Where a backend tells the bytes it moves (``"upload"``/``"download"``, n), for a role's metrics."""

    __slots__ = ("sink",)

    def __init__(self) -> None:
        self.sink: Callable[[str, int], None] | None = None

    def __call__(self, direction: str, n: int) -> None:
        if self.sink is not None and n:
            self.sink(direction, n)


class Backend(ABC):
    """A run root on one kind of storage. Methods take keys (paths relative to the root) and raise
    the backend's own exceptions; callers run them inside :func:`translated`."""

    capabilities: ClassVar[Capabilities]
    modified_fields: ClassVar[tuple[str, ...]] = ()
    """The listing fields, in order, that may hold an object's modification time."""

    def __init__(self, fs: AbstractFileSystem, root: str, uri: str, meter: Meter) -> None:
        self.fs = fs
        """The fsspec filesystem underneath (tests plant damage through it)."""
        self.root = root.rstrip("/")
        self.uri = uri
        """The run's URI as errors show it (redacted)."""
        self.meter = meter

    def path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def url(self, key: str) -> str:
        return f"{self.uri}/{key}"

    # ------------------------------------------------------------ writes

    @abstractmethod
    def create(self, key: str, data: bytes | memoryview) -> bool:
        """Write ``data`` under ``key`` unless the key exists, as one atomic step; True if written."""

    def stage(self, directory: str, url: str) -> Staged:
        """Start an object of ``directory`` whose key is not known yet (``staged_write`` backends)."""
        raise UnsupportedError(f"{url}: {type(self).__name__} cannot stage a write")

    def remove(self, key: str) -> None:
        self.fs.rm_file(self.path(key))

    def sweep_temporaries(self, idle_s: float) -> int:
        """Remove what killed writers left half-written; how many. A backend whose writes are
        whole objects has nothing to sweep."""
        return 0

    # ------------------------------------------------------------ reads

    def exists(self, key: str) -> bool:
        self.fs.invalidate_cache(self.path(key))
        return bool(self.fs.exists(self.path(key)))

    def size(self, key: str) -> int:
        self.fs.invalidate_cache(self.path(key))
        return int(self.fs.size(self.path(key)))

    def read_range(self, key: str, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of ``key``; empty when ``start`` is at or past its end."""
        try:
            data = bytes(self.fs.cat_file(self.path(key), start=start, end=stop))
        except Exception as exc:  # gcsfs raises a 416 as its own HttpError, not an OSError
            if unsatisfiable(exc):
                return b""
            raise
        self.meter("download", len(data))
        return data

    def read_into(self, key: str, view: memoryview, part_bytes: int, pool: ThreadPoolExecutor) -> int:
        """Read ``key`` into ``view`` (``positional_read`` backends); the object's size."""
        raise UnsupportedError(f"{self.url(key)}: {type(self).__name__} cannot read in place")

    def find(self, prefix: str, *, detail: bool) -> Any:
        """fsspec's recursive listing under ``prefix``: full paths, or a mapping path -> info."""
        base = self.path(prefix).rstrip("/")
        self.fs.invalidate_cache(base)
        return self.fs.find(base, detail=detail)

    def modified(self, info: Mapping[str, Any]) -> float | None:
        """The modification time (seconds since the epoch) a listing entry reports, or None."""
        for name in self.modified_fields:
            value = info.get(name)
            with contextlib.suppress(TypeError, ValueError, OverflowError, OSError):
                if isinstance(value, str):
                    value = datetime.fromisoformat(value)
                if isinstance(value, datetime):  # a naive time is UTC, as object stores mean it
                    value = (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
                if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                    return float(value)
        return None

    def holds_anything(self) -> bool:
        """Whether anything at all is stored under the root."""
        self.fs.invalidate_cache(self.root)
        return bool(self.fs.exists(self.root) and self.fs.find(self.root, maxdepth=None, withdirs=False))

    def missing_bucket(self) -> str | None:
        """The bucket the root lies in, if that bucket itself does not exist (None: no buckets here)."""
        return None

    def top_names(self) -> set[str]:
        """The names directly under the root (objects and the first part of deeper keys): one listing."""
        self.fs.invalidate_cache(self.root)
        try:
            entries = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return set()
        return {str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries}


# ------------------------------------------------------------ the one place backend errors are read


def taken(exc: BaseException) -> bool:
    """A create-only write was refused because the key exists: ``FileExistsError``, or an S3 412
    on ``If-None-Match`` as some servers word it."""
    return isinstance(exc, FileExistsError) or (
        isinstance(exc, OSError) and exc.errno == errno.EINVAL and "recondition" in str(exc)
    )


def unsatisfiable(exc: BaseException) -> bool:
    """A ranged read started at or past the object's end (HTTP 416): s3fs words it in an ``OSError``,
    gcsfs raises its own ``HttpError`` with the status as ``code``."""
    if isinstance(exc, OSError) and "not satisfiable" in str(exc).lower():
        return True
    return getattr(exc, "code", None) == 416


@contextmanager
def translated(url: str) -> Iterator[None]:
    """Every backend call runs inside this: a backend exception leaves as the store's, naming ``url``."""
    try:
        yield
    except StoreError:
        raise
    except Exception as exc:
        if isinstance(exc, NotRegularFile):
            raise CorruptError(f"{url}: {exc.strerror}; an object is a regular file", url=url) from exc
        if isinstance(exc, FileExistsError):
            raise ConflictError(f"{url} already exists", url=url) from exc
        if isinstance(exc, FileNotFoundError) or getattr(exc, "errno", None) == errno.ENOENT:
            raise MissingError(f"{url} does not exist", url=url) from exc
        said = f"{url}: storage backend error: {type(exc).__name__}: {redact(str(exc))}"[:500]
        if unreachable(exc):
            raise UnreachableError(said + "; the bucket's endpoint does not answer", url=url) from exc
        raise StoreError(said + _credentials_hint(exc), url=url) from exc


_UNREACHABLE = frozenset(
    {
        "ConnectionError",  # the builtin's family (refused, reset, aborted) and botocore's of the same name
        "TimeoutError",  # the builtin (asyncio's is the same class since Python 3.11)
        "EndpointConnectionError",  # botocore, a subclass of its ConnectionError; named for clarity
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "ConnectionClosedError",
        "ClientConnectorError",  # aiohttp (gcsfs, s3fs's async sessions)
        "ServerDisconnectedError",
        "ServerTimeoutError",
    }
)
"""Exception classes (matched by name along the class hierarchy: no backend is imported) that mean the
endpoint did not answer, as opposed to answering with an error."""


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc``, or what it was raised from, says the endpoint did not answer."""
    seen: BaseException | None = exc
    for _ in range(8):  # the exception and what it was raised from
        if seen is None:
            return False
        if any(cls.__name__ in _UNREACHABLE for cls in type(seen).__mro__):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


_NO_CREDENTIALS = frozenset(
    {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError", "DefaultCredentialsError"}
)
"""What botocore and google-auth raise when they find no credentials (matched by name: neither is imported)."""


def _credentials_hint(exc: BaseException) -> str:
    """Where credentials go, when the backend found none (one line; empty otherwise)."""
    seen: BaseException | None = exc
    for _ in range(8):  # the exception and what it was raised from
        if seen is None:
            return ""
        if type(seen).__name__ in _NO_CREDENTIALS:
            return (
                "; give the bucket's credentials in the environment (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                "GOOGLE_APPLICATION_CREDENTIALS), in --storage-options / AURORA_STORAGE_OPTIONS (a JSON object), "
                "or in the config file's storage_options (docs/OPERATIONS.md)"
            )
        seen = seen.__cause__ or seen.__context__
    return ""
