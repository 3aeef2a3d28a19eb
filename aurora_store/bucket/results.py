"""Offloaded rollout-result payloads: one immutable object per payload too large for Redis.

An actor writes the payload's bytes at ``results/<sha256>.bin`` (content-addressed, so a retried
write is the same object) and sends the trainer the key, SHA-256 and size instead of the bytes;
the trainer reads at most that many bytes and checks length and hash before decoding a byte (with
:func:`aurora_store.format.results.decode`, which still treats them as hostile). Nothing under
``results/`` is part of a version: readers, relays, audits and gc's version retention never look
at it.
"""

from __future__ import annotations

import hashlib
import re

from aurora_store.bucket.objectstore import ObjectStore, RangeRequest
from aurora_store.errors import CorruptError, LimitError
from aurora_store.format.keys import RESULTS_DIR, check_result_key, result_key
from aurora_store.format.results import MAX_PAYLOAD_BYTES, payload_digest

_HEX64 = re.compile(r"[0-9a-f]{64}")


def put_payload(store: ObjectStore, data: bytes | memoryview) -> tuple[str, str]:
    """Write ``data`` at its content address, put-if-absent; returns ``(key, sha256)``. The same
    bytes already there are a success (a retry); other bytes under that key are a ConflictError."""
    if len(data) > MAX_PAYLOAD_BYTES:
        url = store.url(RESULTS_DIR)
        raise LimitError(f"{url}: a {len(data)}-byte payload exceeds the cap of {MAX_PAYLOAD_BYTES} bytes", url=url)
    sha = payload_digest(data)
    key = result_key(sha)
    store.put_immutable(key, data, verify=lambda existing: hashlib.sha256(existing).hexdigest() == sha)
    return key, sha


def get_payload(store: ObjectStore, key: str, sha256: str, size: int, *, max_bytes: int = MAX_PAYLOAD_BYTES) -> bytes:
    """The bytes of the payload a result names by ``key``, ``sha256`` and ``size`` (all hostile: they
    came through Redis), read only once the key is that hash's and the size within ``max_bytes``,
    and returned only if exactly ``size`` bytes with that hash. CorruptError (a bad key, hash, size
    or object), LimitError (too large) or MissingError (no such object), each naming its URL."""
    url = store.url(key[:200] if isinstance(key, str) else repr(key)[:200])
    try:
        check_result_key(key)
    except CorruptError as exc:
        raise CorruptError(f"{url}: {exc}", url=url) from None
    if not isinstance(sha256, str) or not _HEX64.fullmatch(sha256) or key != result_key(sha256):
        raise CorruptError(f"{url}: not the key of a payload with SHA-256 {sha256!r:.80}", url=url)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise CorruptError(f"{url}: size {size!r:.40} is not a byte count", url=url)
    if size > max_bytes:
        raise LimitError(f"{url}: a {size}-byte payload exceeds the cap of {max_bytes} bytes", url=url)
    data = store.get_range(RangeRequest(key, 0, size + 1))  # one byte more: a longer object shows
    if len(data) != size:
        what = "shorter" if len(data) < size else "longer"
        raise CorruptError(f"{url} is {what} than the {size} bytes its result says", url=url)
    if payload_digest(data) != sha256:
        raise CorruptError(f"{url}: SHA-256 {payload_digest(data)} is not the {sha256} its result says", url=url)
    return data
