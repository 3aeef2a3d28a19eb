"""Result entries of the ``results`` stream, as an actor writes them and the trainer reads them.

An entry names the job, the lease's fencing token, the actor, the version it generated with and
that version's hash, and carries its payload (:mod:`aurora_store.format.results`, packed binary)
in one of two ways: inline (field ``bin``, at most :data:`INLINE_MAX` bytes), or by reference to
an immutable, content-addressed object in the actor's region bucket (``ref``, ``sha256``,
``size``, ``region``), which the trainer fetches and checks against the hash. An actor with an
identity adds ``cert`` (its certificate, :mod:`aurora_store.format.identity`) and ``sig`` (its
signature over the result); an entry without them is unsigned (what actors before identities
wrote), and whether an unsigned result is admitted is the trainer's call. Entries are read
with a client that does not decode (payloads are bytes), at most :data:`READ_BYTES` per read:
an entry is never larger than ``INLINE_MAX`` plus its small fields when its writer is honest, and
a larger one is refused unread.

Everything here is hostile input: :func:`parse_result` never raises, it marks the entry
``malformed`` with the reason. :class:`ResultStream` (``JobBoard.results``) submits, reads and
discards results; what the trainer tells an actor about them is :mod:`aurora_store.coord.notices`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aurora_store.coord import wire
from aurora_store.coord.errors import JobError
from aurora_store.coord.keyspace import Keyspace
from aurora_store.coord.lease import Lease

INLINE_MAX = 64 << 10
"""The largest payload an entry carries inline; larger ones go to the actor's region bucket."""
READ_BYTES = 4 << 20
"""Bytes one read of the results stream may return (from honest writers): entries per read =
``READ_BYTES // (INLINE_MAX + 2 KiB)`` (small fields and a certificate)."""
ENTRIES_PER_READ = max(1, READ_BYTES // (INLINE_MAX + 2048))
MAX_FIELD_BYTES = 256
"""Any field but ``bin`` and ``cert`` longer than this makes the entry malformed."""
MAX_CERT_FIELD = 2048
"""A ``cert`` field is cut to this many bytes (over any certificate :mod:`aurora_store.format.identity`
accepts, so a longer one is still refused as too long); the identity gate checks the rest."""
RESULTS_MAXLEN = 100_000
_REF = re.compile(r"results/[0-9a-f]{64}\.bin")


@dataclass(frozen=True, slots=True)
class Ref:
    """A payload in a region's bucket: its key, SHA-256 and size."""

    region: str
    key: str
    sha256: str
    size: int


@dataclass(frozen=True, slots=True)
class Result:
    """A submitted result, as read back by the trainer."""

    id: str
    job: str
    token: int
    actor: str
    version: int
    version_hash: str
    inline: bytes | None = None
    """The payload's bytes when the entry carries them."""
    ref: Ref | None = None
    """Where the payload is when it does not."""
    malformed: str | None = None
    """Why the entry is unusable (its fields failed their checks), None if it parsed."""
    cert: bytes | None = None
    """The submitting actor's certificate, as read (unchecked; at most MAX_CERT_FIELD bytes kept);
    None: the result is unsigned."""
    sig: str | None = None
    """The actor's signature over the result, as read (unchecked); None: the result is unsigned."""


def _text(f: dict[Any, Any], name: str) -> Any:
    raw = f.get(name.encode(), f.get(name))
    if isinstance(raw, bytes):
        if len(raw) > MAX_FIELD_BYTES:
            raise wire.BadEntry(f"bad_{name}", f"{name} is {len(raw)} bytes")
        try:
            return raw.decode("ascii")
        except UnicodeDecodeError:
            raise wire.BadEntry(f"bad_{name}", f"{name} is not ASCII") from None
    return raw


def parse_result(eid: Any, f: dict[Any, Any]) -> Result:
    """A results-stream entry (as a non-decoding client returns it) as the trainer may act on it; a
    damaged one comes back with ``malformed`` set to the reason (and whatever of job and actor could
    be read), never raises."""
    sid = eid.decode("ascii", "replace") if isinstance(eid, bytes) else str(eid)
    try:
        job = wire.name(_text(f, "job"), "job")
        actor = wire.name(_text(f, "actor"), "actor")
        token = wire.uint(_text(f, "token"), "token")
        version = wire.version(_text(f, "version"))
        version_hash = wire.hex64(_text(f, "version_hash"), "version_hash")
        cert, sig = _identity(f)
        inline = f.get(b"bin", f.get("bin"))
        if inline is not None:
            if not isinstance(inline, bytes):
                raise wire.BadEntry("bad_payload", "an inline payload is bytes")
            if len(inline) > INLINE_MAX:
                raise wire.BadEntry("payload_too_large", f"inline payload of {len(inline)} bytes, over {INLINE_MAX}")
            return Result(sid, job, token, actor, version, version_hash, inline=inline, cert=cert, sig=sig)
        key = _text(f, "ref")
        if not (isinstance(key, str) and _REF.fullmatch(key)):
            raise wire.BadEntry("bad_payload", f"neither an inline payload nor a results/ reference: {key!r:.80}")
        sha = wire.hex64(_text(f, "sha256"), "sha256")
        if key != f"results/{sha}.bin":
            raise wire.BadEntry("bad_payload", f"reference {key} is not the object of hash {sha}")
        ref = Ref(wire.name(_text(f, "region"), "region"), key, sha, wire.uint(_text(f, "size"), "size", 1 << 40))
        return Result(sid, job, token, actor, version, version_hash, ref=ref, cert=cert, sig=sig)
    except wire.BadEntry as exc:
        try:
            bad_job, bad_actor = (str(_text(f, k) or "")[:200] for k in ("job", "actor"))
        except wire.BadEntry:
            bad_job = bad_actor = ""
        return Result(sid, bad_job, -1, bad_actor, -1, "", malformed=exc.reason)


def _identity(f: dict[Any, Any]) -> tuple[bytes | None, str | None]:
    """The entry's certificate and signature, unchecked (the trainer's identity gate checks them, and
    a bad one is its drop reason, not a malformed entry): only cut to a size that still shows it was
    too large, and the signature made text whatever its bytes."""
    cert = f.get(b"cert", f.get("cert"))
    if cert is not None:
        cert = bytes(cert[:MAX_CERT_FIELD]) if isinstance(cert, (bytes, bytearray)) else b""
    sig = f.get(b"sig", f.get("sig"))
    if sig is not None:
        sig = sig[:200].decode("ascii", "replace") if isinstance(sig, (bytes, bytearray)) else ""
    return cert, sig


def entry(
    job: str,
    token: int,
    actor: str,
    version: int,
    version_hash: str,
    *,
    inline: bytes | None,
    ref: Ref | None,
    cert: bytes | None = None,
    sig: str | None = None,
) -> dict[str, Any]:
    """The fields of a result entry, as :func:`parse_result` reads them back."""
    fields: dict[str, Any] = {
        "job": job,
        "token": token,
        "actor": actor,
        "version": version,
        "version_hash": version_hash,
    }
    if inline is not None:
        fields["bin"] = inline
    elif ref is not None:
        fields.update(ref=ref.key, sha256=ref.sha256, size=ref.size, region=ref.region)
    if cert is not None and sig is not None:
        fields.update(cert=cert, sig=sig)
    return fields


class ResultStream:
    """The ``results`` stream of a run: actors submit, the trainer reads and discards."""

    def __init__(self, keys: Keyspace) -> None:
        self.keys = keys

    @property
    def key(self) -> str:
        return self.keys.key("results")

    def submit(
        self,
        lease: Lease,
        *,
        actor: str,
        version: int,
        version_hash: str,
        payload: bytes | None = None,
        ref: Ref | None = None,
        cert: bytes | None = None,
        sig: str | None = None,
    ) -> str:
        """Post a result for ``lease``, its payload inline (at most INLINE_MAX bytes) or by reference
        to a bucket object, signed when ``cert`` and ``sig`` are given; the trainer decides whether to
        admit it."""
        if (payload is None) == (ref is None):
            raise JobError(f"result for job {lease.job!r}: give its payload or a reference to it, not both")
        if payload is not None and not isinstance(payload, bytes):
            raise JobError(f"result for job {lease.job!r}: a payload is bytes (aurora_store.format.results)")
        if payload is not None and len(payload) > INLINE_MAX:
            raise JobError(f"result for job {lease.job!r} is {len(payload)} bytes, over {INLINE_MAX} inline")
        fields = entry(
            lease.job, lease.token, actor, version, version_hash, inline=payload, ref=ref, cert=cert, sig=sig
        )
        # the decoding client: a write's bytes go as they are, and its reply is an id; an actor needs no
        # client of its own for bytes (on a cluster each client costs Redis a COMMAND, a millisecond)
        rid = self.keys.call(self.keys.r.xadd, self.key, fields, maxlen=RESULTS_MAXLEN, approximate=True)
        return rid.decode() if isinstance(rid, bytes) else str(rid)

    def read(self, after: str, *, block_ms: int = 500, count: int = ENTRIES_PER_READ) -> list[Result]:
        """Results submitted after stream id ``after`` (at most ``count``, so a read is bounded in bytes),
        parsed as hostile input: a damaged entry comes back with :attr:`Result.malformed` set (so the
        reader moves past it and counts it)."""
        reply = self.keys.xread({self.key: after}, count=count, block=max(block_ms, 1), binary=True)
        return [parse_result(eid, f) for _stream, entries in reply or [] for eid, f in entries]

    def discard(self, ids: Sequence[str]) -> None:
        """Remove results from the stream once admitted or dropped: Redis keeps only those in flight."""
        if ids:
            self.keys.call(self.keys.r.xdel, self.key, *ids)

    def last_id(self) -> str:
        """The id to read results after to see only those submitted from now on."""
        last = self.keys.call(self.keys.rb.xrevrange, self.key, count=1)
        return last[0][0].decode("ascii") if last else "0-0"
