"""What is read from Redis, parsed as hostile input.

Redis is shared: other roles, other teams' processes, a damaged or half-restored instance may
have written any entry. Every field a role acts on passes through one of these parsers, which
return a typed value or raise :class:`BadEntry` (a :class:`CoordinationError`) with a short
reason; callers count the reason, log it (rate-limited, :class:`Tally`) and skip the entry.
Nothing here raises anything else, whatever the bytes: no I/O, no Redis client, no torch.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import Counter
from typing import Any

from aurora_store.coord.errors import CoordinationError
from aurora_store.errors import StoreError
from aurora_store.format.keys import MAX_VERSION, check_object_key

HEX64 = re.compile(r"[0-9a-f]{64}")
_UINT = re.compile(r"0|[1-9][0-9]{0,17}")
MAX_DOC_BYTES = 1 << 20
"""A registration or telemetry document larger than this is refused unread."""


class BadEntry(CoordinationError):
    """An entry read from Redis that no role of this run could have written."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}"[:300] if detail else reason)
        self.reason = reason


def uint(raw: Any, what: str, hi: int = 10**18) -> int:
    """A decimal integer in [0, hi] as Redis returns it (a string), nothing else."""
    if isinstance(raw, bytes):
        raw = raw.decode("ascii", "replace")
    if not (isinstance(raw, str) and _UINT.fullmatch(raw)) or int(raw) > hi:
        raise BadEntry(f"bad_{what}", f"{what} {raw!r:.40} is not an integer in [0, {hi}]")
    return int(raw)


def hex64(raw: Any, what: str) -> str:
    if not (isinstance(raw, str) and HEX64.fullmatch(raw)):
        raise BadEntry(f"bad_{what}", f"{what} {raw!r:.80} is not 64 lowercase hex digits")
    return raw


def name(raw: Any, what: str, max_len: int = 200) -> str:
    """A short identifier (job, actor, worker id): no spaces, '|', braces or control characters."""
    if not (isinstance(raw, str) and 0 < len(raw) <= max_len and raw.isprintable()) or any(c in raw for c in " |{}"):
        raise BadEntry(f"bad_{what}", f"{what} {raw!r:.80} is not a short name")
    return raw


def json_object(raw: Any, what: str, max_bytes: int = MAX_DOC_BYTES) -> dict[str, Any]:
    """A JSON object of at most ``max_bytes``: not a list, not nested past Python's recursion limit,
    no NaN or Infinity, no lone surrogates in keys or strings left unchecked by the caller."""
    if not isinstance(raw, (str, bytes)):
        raise BadEntry(f"{what}_missing", f"{what} is {type(raw).__name__}")
    if len(raw) > max_bytes:
        raise BadEntry(f"{what}_too_large", f"{what} is {len(raw)} bytes, over {max_bytes}")
    try:
        doc = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise BadEntry(f"{what}_too_deep", f"{what} nests deeper than a parser may follow") from None
    except (ValueError, TypeError) as exc:
        raise BadEntry(f"{what}_not_json", f"{what}: {exc}") from None
    if not isinstance(doc, dict):
        raise BadEntry(f"{what}_not_object", f"{what} is a JSON {type(doc).__name__}, not an object")
    return doc


def _no_constant(token: str) -> Any:
    raise ValueError(f"{token} is not a JSON number")


def version(raw: Any) -> int:
    return uint(raw, "version", MAX_VERSION)


def parse_segment_event(fields: dict[str, Any], v: int) -> tuple[str, int, str]:
    """The segment a ``type=segment`` event announces: a segment, shard or index key of version
    ``v`` (never a manifest, never another version's), a byte count and a SHA-256: ``(key, size, sha256)``."""
    key = fields.get("key")
    if not isinstance(key, str):
        raise BadEntry("bad_key", "announced segment has no key")
    try:
        check_object_key(key, v, "announced segment")
    except StoreError as exc:
        raise BadEntry("bad_key", str(exc)) from None
    return key, uint(fields.get("size"), "size", 1 << 62), hex64(fields.get("sha256"), "sha256")


class Tally:
    """Counts of skipped entries by reason; each reason logged at warning level at most once a
    minute (a flood of bad entries must not become a flood of logs), the rest at debug level."""

    def __init__(self, log: logging.Logger, what: str) -> None:
        self.log, self.what = log, what
        self.counts: Counter[str] = Counter()
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def skip(self, reason: str, detail: object = "") -> None:
        now = time.monotonic()
        with self._lock:
            self.counts[reason] += 1
            loud = now - self._last.get(reason, -1e9) >= 60.0
            if loud:
                self._last[reason] = now
            n = self.counts[reason]
        (self.log.warning if loud else self.log.debug)("skipped %s (%s, %d so far): %s", self.what, reason, n, detail)

    def snapshot(self) -> dict[str, int]:
        """The counts by reason, as of now (safe to call from another thread: a metrics scrape)."""
        with self._lock:
            return dict(self.counts)
