"""Retention records: which versions ``aurora gc`` deleted on purpose.

A run's versions are consecutive; a gap is damage (``aurora audit`` fails it, a reader's chain
check stops at it). After ``aurora gc`` deletes versions no one needs, a record under
``retention/`` says which, so audits tell a retired version from a lost one and relays do not
copy back what was retired. A record is immutable, content-addressed and written before the first
deletion (the intent: a gc killed half-way is finished by the next one). Each gc writes one record
that holds every version retired so far, then removes the older records.

A record (format ``aurora-retention/2``) names the run (its origin) and the latest version
committed when it was written, retires only versions below that one (gc always keeps the latest),
and in a signed run is signed by the run's key at that version, like a version: a record is what
makes a relay skip a version, so a forged one must not be honoured. Records of format 1 (written by
earlier code) carry none of this; what readers honour of them is the bucket layer's to decide (see
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

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from aurora_store.errors import CorruptError
from aurora_store.format import hostile_json, signing
from aurora_store.format.keys import MAX_VERSION, RETENTION_DIR
from aurora_store.format.manifest import Signature
from aurora_store.format.manifest_parser import B64_SIG, HEX64, KEY_ID

FORMAT = "aurora-retention/2"
LEGACY = "aurora-retention/1"
"""Records written by earlier code: no run, no latest version, no signature."""
_DOMAIN = b"aurora-retention/2\0"
DIR = RETENTION_DIR
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
    latest: int | None = None
    """The latest version committed when it was written; every retired version is below it (None:
    a record of format 1)."""
    origin: str | None = None
    """The run it belongs to: its version 0's hash (None: a record of format 1)."""
    signature: Signature | None = None
    """The signature over :attr:`body` by the run's key at :attr:`latest` (None: unsigned)."""
    body: bytes = b""
    """What the signature covers: the record's canonical JSON without its ``signature`` field."""

    @property
    def legacy(self) -> bool:
        return self.latest is None

    def verify(self, key: Ed25519PublicKey, what: str) -> None:
        """UnauthenticatedError unless the record carries a valid signature by ``key``."""
        signing.verify_message(_DOMAIN, self.body, self.signature, key, what)


def _body(retired: Retired, created_ms: int, latest: int, origin: str) -> dict[str, object]:
    return {
        "format": FORMAT,
        "created_ms": created_ms,
        "latest": latest,
        "origin": origin,
        "retired": [list(r) for r in retired.ranges],
    }


def _canonical(doc: dict[str, object]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def encode(
    retired: Retired, created_ms: int, *, latest: int, origin: str, key: Ed25519PrivateKey | None = None
) -> tuple[str, bytes]:
    """A record's key and bytes: ``retired`` versions of the run whose version 0's hash is
    ``origin``, written when ``latest`` was its latest committed version; signed with ``key`` (the
    run's key at ``latest``) in a signed run, unsigned (``key`` None) in an unsigned one."""
    if retired.ranges and not (retired.ranges[0][0] >= 1 and retired.ranges[-1][1] < latest <= MAX_VERSION):
        raise ValueError(
            "retired versions are between 1 and the latest committed version, exclusive (version 0 and the "
            "latest are never retired)"
        )
    if not HEX64.fullmatch(origin):
        raise ValueError(f"origin must be a version hash (64 hex digits), got {origin!r:.80}")
    doc = _body(retired, created_ms, latest, origin)
    sig = None if key is None else signing.sign_message(_DOMAIN, _canonical(doc), key).to_dict()
    data = _canonical({**doc, "signature": sig}) + b"\n"
    return f"{DIR}/{created_ms:013d}-{hashlib.sha256(data).hexdigest()[:32]}.json", data


def is_record_key(key: str) -> bool:
    """``key`` (relative to the run) names a retention record."""
    head, _, name = key.rpartition("/")
    return head == DIR and _NAME.fullmatch(name) is not None


def decode(data: bytes, key: str) -> Record:
    """Parse a record as hostile input: its key must be its content's hash, every range in bounds
    and ascending, version 0 never retired; in format 2, every retired version below ``latest``,
    ``origin`` a version hash and ``signature`` null or well-formed (whether it verifies, and with
    which key, is the reader's to check: it knows the run)."""
    if len(data) > MAX_RECORD_BYTES:
        raise CorruptError(f"{key}: retention record over {MAX_RECORD_BYTES} bytes")
    if not is_record_key(key) or hashlib.sha256(data).hexdigest()[:32] != key.rsplit("-", 1)[-1][:32]:
        raise CorruptError(f"{key}: a retention record's name is its time and the hash of its bytes")
    try:
        doc = hostile_json.loads(data)
    except ValueError as exc:
        raise CorruptError(f"{key}: retention record is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") not in (FORMAT, LEGACY):
        raise CorruptError(f"{key}: not a retention record of format {FORMAT} (or {LEGACY})")
    fields = {"format", "created_ms", "retired", "latest", "origin", "signature"}
    if doc["format"] == FORMAT and set(doc) != fields:
        raise CorruptError(f"{key}: a record of format {FORMAT} has exactly the fields {sorted(fields)}")
    created, ranges = doc.get("created_ms"), doc.get("retired")
    if not (isinstance(created, int) and _uint(created) and created < 10**13):
        raise CorruptError(f"{key}: created_ms must be Unix milliseconds")
    if int(key.rsplit("/", 1)[-1][:13]) != created:
        raise CorruptError(f"{key}: its name's time is not its created_ms {created}")
    if not isinstance(ranges, list):
        raise CorruptError(f"{key}: retired must be a list of [first, last] ranges")
    out: list[tuple[int, int]] = []
    after = 0
    for r in ranges:
        ok = isinstance(r, list) and len(r) == 2 and all(_uint(x) for x in r)
        if not ok or not after < r[0] <= r[1] <= MAX_VERSION:
            raise CorruptError(
                f"{key}: retired ranges must be ascending, disjoint [first, last] pairs of versions >= 1, got {r!r:.80}"
            )
        out.append((r[0], r[1]))
        after = r[1] + 1
    retired = Retired(tuple(out))
    if doc["format"] == LEGACY:
        return Record(retired, created)
    latest, origin, sig = doc["latest"], doc["origin"], doc["signature"]
    if not _uint(latest) or not latest <= MAX_VERSION:
        raise CorruptError(f"{key}: latest must be a version")
    if out and out[-1][1] >= latest:
        raise CorruptError(f"{key}: retires version {out[-1][1]}, not below the latest version {latest} it names")
    if not isinstance(origin, str) or not HEX64.fullmatch(origin):
        raise CorruptError(f"{key}: origin must be a version hash (64 hex digits)")
    signature = None if sig is None else _signature(sig, key)
    return Record(retired, created, latest, origin, signature, _canonical(_body(retired, created, latest, origin)))


def _uint(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _signature(raw: object, key: str) -> Signature:
    if not isinstance(raw, dict) or set(raw) != {"alg", "key_id", "sig"}:
        raise CorruptError(f"{key}: signature must be null or an object of alg, key_id and sig")
    alg, key_id, sig = raw["alg"], raw["key_id"], raw["sig"]
    if alg != "ed25519" or not isinstance(key_id, str) or not KEY_ID.fullmatch(key_id):
        raise CorruptError(f"{key}: signature must be an ed25519 signature naming a key id (16 hex digits)")
    if not isinstance(sig, str) or not B64_SIG.fullmatch(sig):
        raise CorruptError(f"{key}: signature.sig must be a base64 Ed25519 signature")
    return Signature(alg, key_id, sig)
