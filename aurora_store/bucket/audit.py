"""Audit: verify every committed version of a run, object by object, and say which one is bad.

For each version, in order: the manifest (parse, hash, signature with a verify key), its
chain link (no gap, parent hash, consecutive versions), its stats, every object (size and
SHA-256), then its weights: the history is materialized forward once, each full version
loaded from its shards and compared with the delta chain before it, each delta applied
transactionally and its digest checked. Returns a structured result; prints nothing.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from aurora_store.bucket.reader import Reader
from aurora_store.bucket.retention import records
from aurora_store.codec.words import HostWords
from aurora_store.errors import ChainError, CorruptError, MissingError, StoreError
from aurora_store.format.blocks import changed_by
from aurora_store.format.keys import manifest_key
from aurora_store.format.manifest import Manifest, check_link
from aurora_store.format.retention import Retired

if TYPE_CHECKING:
    from aurora_store.bucket.run import Run
    from aurora_store.format.weights import WeightState

OK, FAILED, UNVERIFIED = "ok", "failed", "unverified"
"""Row statuses; ``unverified``: the version's own objects are sound but its weights depend on a failed one."""


@dataclass(slots=True)
class VersionAudit:
    """One committed version's audit row (fields are None where its manifest could not be read)."""

    version: int
    kind: str | None = None
    version_hash: str | None = None
    parent_hash: str | None = None
    weights_digest: str | None = None
    created: str | None = None
    step: int | None = None
    segments: int | None = None
    """Objects the manifest names (segments or shards, plus a full version's index)."""
    bytes: int | None = None
    changed: int | None = None
    """Elements that differ from the parent; None where the manifest says it did not count them."""
    counted: bool | None = None
    """False for a full version published without its parent's bits (``stats.counted``, aurora/5)."""
    elements: int | None = None
    signed: bool | None = None
    key_id: str | None = None
    rolls_back_to: int | None = None
    """The version whose trainer state this one continues from, when not its parent's (a restart)."""
    abandons: list[int] | None = None
    """The versions that rollback abandons."""
    status: str = OK
    error: str | None = None
    type: str | None = None
    """Exception class of ``error``."""
    object: str | None = None
    """URL of the object that failed."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class AuditError:
    """The first failure: which version, which object (URL), what and of what type."""

    version: int
    object: str
    error: str
    type: str

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "object": self.object, "error": self.error, "type": self.type}


@dataclass(slots=True)
class AuditResult:
    uri: str
    versions: list[VersionAudit]
    first_error: AuditError | None
    retired: int = 0
    """Versions ``aurora gc`` retired (their absence is not a gap)."""
    bad_records: list[str] = dataclasses.field(default_factory=list)
    """Retention records ignored, in whole or in part (``key: why``: unreadable, not the run's, unsigned
    or badly signed in a signed run, retiring a version not below the latest): what they do not
    retire is no excuse for a gap, and any of them fails the audit."""

    @property
    def ok(self) -> bool:
        return self.first_error is None and not self.bad_records

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "versions": [r.to_dict() for r in self.versions],
            "first_error": None if self.first_error is None else self.first_error.to_dict(),
            "retired": self.retired,
            "bad_records": self.bad_records,
            "rollbacks": self.rollbacks,
        }

    @property
    def rollbacks(self) -> list[dict[str, Any]]:
        """The versions a restarted trainer published from an older state than their parent's."""
        return [
            {"version": r.version, "rolls_back_to": r.rolls_back_to, "abandons": r.abandons}
            for r in self.versions
            if r.rolls_back_to is not None
        ]


class _Failed(Exception):
    """A check failed on object ``url``."""

    def __init__(self, url: str, exc: StoreError) -> None:
        super().__init__(str(exc))
        self.url = url
        self.exc = exc
        self.state: WeightState | None = None
        """Weights at the failed version when they could still be verified (a full version after a gap)."""


def audit(run: Run, *, on_version: Callable[[VersionAudit, int], None] | None = None) -> AuditResult:
    """Verify every committed version of ``run``; ``on_version(row, total)`` after each one."""
    # A fresh reader: cached manifests must not hide damage done since they were read.
    reader = Reader(run.store, run.config.limits, run.reader.verify_key)
    versions = reader.versions()
    found = records(reader)
    retired, bad_records = found.retired, found.bad
    if not versions:
        url = run.store.url("versions/")
        return AuditResult(run.uri, [], AuditError(0, url, f"{url}: no committed versions", MissingError.__name__))
    rows: list[VersionAudit] = []
    first: AuditError | None = None
    prev: Manifest | None = None
    state: WeightState | None = None
    listed_before = -1
    hashes: dict[int, str] = {}
    for v in versions:
        row = VersionAudit(v)
        m: Manifest | None = None
        try:
            m = _manifest(reader, v, row)
            hashes[v] = m.version_hash
            _check_rollback(reader, m, hashes)
            state = _check_version(reader, m, prev, state, row, listed_before, retired)
        except _Failed as f:
            state = f.state
            row.status, row.object, row.type = FAILED, f.url, type(f.exc).__name__
            row.error = str(f.exc) if f.url in str(f.exc) else f"{f.url}: {f.exc}"
            if first is None:
                first = AuditError(v, f.url, row.error, row.type)
        prev, listed_before = m, v
        rows.append(row)
        if on_version is not None:
            on_version(row, len(versions))
    return AuditResult(run.uri, rows, first, len(retired), bad_records)


def _check_rollback(reader: Reader, m: Manifest, hashes: dict[int, str]) -> None:
    """A rollback names a version of this chain by its hash (where that version is still here to say)."""
    back = m.rolls_back_to
    if back is not None and back.version in hashes and hashes[back.version] != back.version_hash:
        raise _Failed(
            reader.store.url(manifest_key(m.version)),
            ChainError(
                f"version {m.version} rolls back to version {back.version} by hash {back.version_hash}, "
                f"which is {hashes[back.version]}"
            ),
        )


def _manifest(reader: Reader, v: int, row: VersionAudit) -> Manifest:
    url = reader.store.url(manifest_key(v))
    try:
        m = reader.manifest(v)
    except StoreError as exc:
        raise _Failed(url, exc) from None
    row.kind, row.version_hash, row.weights_digest = m.kind, m.version_hash, m.weights_digest
    row.parent_hash = m.parent.version_hash if m.parent else None
    row.created, row.step, row.segments = m.created, m.step, len(m.objects)
    row.bytes, row.elements, row.counted = m.stats.bytes, m.stats.elements, m.stats.counted
    row.changed = m.stats.changed if m.stats.counted else None
    row.signed = m.signature is not None
    row.key_id = m.signature.key_id if m.signature else None
    if m.rolls_back_to is not None:
        row.rolls_back_to, row.abandons = m.rolls_back_to.version, list(m.rolls_back_to.abandons)
    return m


def _check_version(
    reader: Reader,
    m: Manifest,
    prev: Manifest | None,
    state: WeightState | None,
    row: VersionAudit,
    listed_before: int,
    retired: Retired,
) -> WeightState | None:
    """Check one parsed manifest against its parent and its objects; returns the weights at ``m`` if known.

    A gap before ``m`` fails it (unless gc retired every version in it and ``m`` is a full version,
    which needs none of them), but a full ``m`` is still loaded so the deltas after it can be checked."""
    v = m.version
    gap = None
    if v > 0 and (prev is None or prev.version != v - 1):
        if listed_before == v - 1:
            row.status = UNVERIFIED  # the parent's manifest exists but failed its own checks
        elif not retired.covers(listed_before + 1, v - 1) or m.kind != "full":
            missing = reader.store.url(manifest_key(v - 1))
            if v - 1 not in retired:
                why = f"version {v} is committed but its parent version {v - 1} is missing ({missing} does not exist)"
            elif not retired.covers(listed_before + 1, v - 1):
                why = f"version {v} is committed but versions after {listed_before} are missing, not retired by gc"
            else:
                why = f"version {v} is a delta on version {v - 1}, which gc retired ({missing} does not exist)"
            gap = _Failed(missing, ChainError(why))
    try:
        state = _check_contents(reader, m, prev, state, row)
    except _Failed:
        if gap is not None:
            raise gap from None
        raise
    if gap is not None:
        gap.state = state
        raise gap
    return state


def _check_contents(
    reader: Reader, m: Manifest, prev: Manifest | None, state: WeightState | None, row: VersionAudit
) -> WeightState | None:
    v = m.version
    try:
        if prev is not None and prev.version == v - 1:
            check_link(prev, m)
        _check_stats(m, prev)
    except StoreError as exc:
        raise _Failed(reader.store.url(manifest_key(v)), exc) from None
    try:
        reader.verify_files(m)
        if m.kind == "full":
            new = reader.load_full(m)
            if state is not None and state.version == v - 1 and m.stats.counted:
                _check_full_changed(m, state, new)  # an uncounted version declares no count to check
            return new
        if state is None or state.version != v - 1:
            # the weights it applies to are unknown, and symbol streams cannot be decoded without them:
            # check every object's size and hash, nothing more
            for _ in reader.store.map(reader.fetch, m.segments):
                pass
            row.status = UNVERIFIED
            return None
        blocks = reader.decode_delta(m, HostWords(state.words))
        changed = changed_by(state, blocks)
        reader.apply_delta(state, m, blocks)
        if changed != m.stats.changed:
            raise ChainError(f"version {v}: stats.changed is {m.stats.changed}, applying it changes {changed} elements")
        return state
    except StoreError as exc:
        raise _Failed(_blame(reader, m, exc), exc) from None


def _check_stats(m: Manifest, prev: Manifest | None) -> None:
    """The numbers ``aurora ls`` shows must be the manifest's true ones."""
    size = sum(o.size for o in m.objects)
    full_bytes = sum(t.numel * t.width for t in m.tensors)
    chain = 0 if m.kind == "full" else size + (prev.stats.chain_bytes if prev and prev.kind == "delta" else 0)
    checks = [("bytes", m.stats.bytes, size), ("full_bytes", m.stats.full_bytes, full_bytes)]
    if m.kind == "full" or (prev is not None and prev.version == m.version - 1):
        checks.append(("chain_bytes", m.stats.chain_bytes, chain))
    if m.stats.changed > m.stats.elements:
        checks.append(("changed", m.stats.changed, m.stats.elements))
    for name, got, want in checks:
        if got != want:
            raise CorruptError(f"version {m.version}: stats.{name} is {got}, expected {want}")


def _check_full_changed(m: Manifest, before: WeightState, after: WeightState) -> None:
    """A full version against the chain before it: it must differ in exactly ``stats.changed`` elements."""
    if before.specs != m.tensors:
        changed = m.stats.elements  # a new layout starts a new chain: every element counts as changed
    else:
        changed = sum(int(np.count_nonzero(before.words[t.name] != after.words[t.name])) for t in m.tensors)
    if changed != m.stats.changed:
        raise ChainError(
            f"version {m.version}: full version differs from version {before.version} in {changed} "
            f"elements, stats.changed says {m.stats.changed}"
        )


def _blame(reader: Reader, m: Manifest, exc: StoreError) -> str:
    """The object the error is about; else the manifest, which vouched for every object."""
    return exc.url or reader.store.url(manifest_key(m.version))


# ---------------------------------------------------------------- ledger

LEDGER_COLUMNS = (
    "version",
    "kind",
    "version_hash",
    "parent_hash",
    "weights_digest",
    "created",
    "step",
    "segments",
    "bytes",
    "changed",
    "counted",
    "elements",
    "signed",
    "key_id",
    "status",
    "error",
    "object",
)


def write_ledger(result: AuditResult, path: str) -> None:
    """Write one Parquet row per audited version to ``path`` (atomically: temp file, then rename)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = {
        "version": pa.int64(),
        "step": pa.int64(),
        "segments": pa.int64(),
        "bytes": pa.int64(),
        "changed": pa.int64(),
        "elements": pa.int64(),
        "signed": pa.bool_(),
        "counted": pa.bool_(),
    }
    schema = pa.schema([pa.field(c, types.get(c, pa.string())) for c in LEDGER_COLUMNS])
    rows = [{c: getattr(r, c) for c in LEDGER_COLUMNS} for r in result.versions]
    table = pa.Table.from_pylist(rows, schema=schema)
    path = os.path.abspath(path)
    if not os.path.isdir(os.path.dirname(path)):
        raise StoreError(f"cannot write the ledger {path}: {os.path.dirname(path)} does not exist")
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex[:12]}")
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
