"""Retention records: which versions ``aurora gc`` deleted on purpose.

A run's versions are consecutive; a gap is damage (``aurora audit`` fails it, a reader's chain
check stops at it). After ``aurora gc`` deletes versions no one needs, a record under
``retention/`` says which, so audits tell a retired version from a lost one and relays do not
copy back what was retired. A record is immutable, content-addressed and written before the first
deletion (the intent: a gc killed half-way is finished by the next one). Each gc writes one record
that holds every version retired so far, then removes the older records. Records are not signed:
they can only excuse a version's absence, never vouch for bytes that are there (see
docs/FORMAT.md, "Retention").

Pure bytes and JSON, no I/O.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

from aurora_store.errors import CorruptError
from aurora_store.format import hostile_json
from aurora_store.format.keys import MAX_VERSION

FORMAT = "aurora-retention/1"
DIR = "retention"
MAX_RECORD_BYTES = 16 << 20
"""A record lists versions as ranges: a run's whole history fits in a few kilobytes."""
_NAME = re.compile(r"[0-9]{13}-[0-9a-f]{32}\.json")


@dataclass(frozen=True, slots=True)
class Retired:
    """A set of versions as ascending, disjoint, non-adjacent ``(first, last)`` ranges (a record may
    claim a huge range: it is never expanded)."""

    ranges: tuple[tuple[int, int], ...] = ()

    def __contains__(self, version: object) -> bool:
        if not isinstance(version, int):
            return False
        i = bisect.bisect_right(self.ranges, (version, MAX_VERSION + 1)) - 1
        return i >= 0 and self.ranges[i][0] <= version <= self.ranges[i][1]

    def covers(self, first: int, last: int) -> bool:
        """Every version from ``first`` to ``last`` is retired (true of an empty span)."""
        if first > last:
            return True
        i = bisect.bisect_right(self.ranges, (first, MAX_VERSION + 1)) - 1
        return i >= 0 and self.ranges[i][0] <= first and last <= self.ranges[i][1]

    def __len__(self) -> int:
        return sum(last - first + 1 for first, last in self.ranges)

    def __or__(self, other: Retired | Iterable[int]) -> Retired:
        pairs = list(self.ranges) + (list(other.ranges) if isinstance(other, Retired) else [(v, v) for v in other])
        merged: list[list[int]] = []
        for first, last in sorted(pairs):
            if merged and first <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], last)
            else:
                merged.append([first, last])
        return Retired(tuple((a, b) for a, b in merged))


@dataclass(frozen=True, slots=True)
class Record:
    """One retention record."""

    retired: Retired
    """Every version retired so far (by this gc and the ones before it)."""
    created_ms: int
    """When it was written (Unix milliseconds): its key sorts by it."""


def encode(retired: Retired, created_ms: int) -> tuple[str, bytes]:
    """A record's key and bytes."""
    if retired.ranges and not (retired.ranges[0][0] >= 1 and retired.ranges[-1][1] <= MAX_VERSION):
        raise ValueError("retired versions are between 1 and MAX_VERSION (version 0 is never retired)")
    doc = {"format": FORMAT, "created_ms": created_ms, "retired": [list(r) for r in retired.ranges]}
    data = (json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n").encode()
    return f"{DIR}/{created_ms:013d}-{hashlib.sha256(data).hexdigest()[:32]}.json", data


def is_record_key(key: str) -> bool:
    """``key`` (relative to the run) names a retention record."""
    head, _, name = key.rpartition("/")
    return head == DIR and _NAME.fullmatch(name) is not None


def decode(data: bytes, key: str) -> Record:
    """Parse a record as hostile input: its key must be its content's hash, every range in bounds
    and ascending, version 0 never retired."""
    if len(data) > MAX_RECORD_BYTES:
        raise CorruptError(f"{key}: retention record over {MAX_RECORD_BYTES} bytes")
    if not is_record_key(key) or hashlib.sha256(data).hexdigest()[:32] != key.rsplit("-", 1)[-1][:32]:
        raise CorruptError(f"{key}: a retention record's name is its time and the hash of its bytes")
    try:
        doc = hostile_json.loads(data)
    except ValueError as exc:
        raise CorruptError(f"{key}: retention record is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CorruptError(f"{key}: not a retention record of format {FORMAT}")
    created, ranges = doc.get("created_ms"), doc.get("retired")
    if not isinstance(created, int) or isinstance(created, bool) or not 0 <= created < 10**13:
        raise CorruptError(f"{key}: created_ms must be Unix milliseconds")
    if int(key.rsplit("/", 1)[-1][:13]) != created:
        raise CorruptError(f"{key}: its name's time is not its created_ms {created}")
    if not isinstance(ranges, list):
        raise CorruptError(f"{key}: retired must be a list of [first, last] ranges")
    out: list[tuple[int, int]] = []
    after = 0
    for r in ranges:
        ok = isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in r)
        if not ok or not after < r[0] <= r[1] <= MAX_VERSION:
            raise CorruptError(
                f"{key}: retired ranges must be ascending, disjoint [first, last] pairs of versions >= 1, got {r!r:.80}"
            )
        out.append((r[0], r[1]))
        after = r[1] + 1
    return Record(Retired(tuple(out)), created)
