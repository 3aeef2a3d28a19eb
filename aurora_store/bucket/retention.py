"""A run's retention records, read from its bucket and checked against the run (the format is
:mod:`aurora_store.format.retention`).

A record is honoured only when it is the run's (docs/FORMAT.md, "Retention"): of its origin; in a
signed run, signed by the run's key at the latest version it names (unsigned, or badly signed, it
is ignored); retiring only versions below the latest version committed now (a record never retires
the latest version, let alone one to come). A record of format 1, written by earlier code, names no
run and is signed by no one: it is honoured only below the latest full version committed that it
does not retire, so it can excuse history no one needs and never hide a version a reader must copy
or apply to reach the latest one. And no record, however signed, is honoured if it retires the parent of
a committed delta that no record retires: a key rotated out since could otherwise date a record in its
own era and hide a version every reader needs. Every record ignored, in whole or in part, is reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aurora_store.errors import StoreError, UnauthenticatedError
from aurora_store.format import retention
from aurora_store.format.retention import Record, Retired

if TYPE_CHECKING:
    from aurora_store.bucket.reader import Reader


@dataclass(slots=True)
class Records:
    """What a run's retention records retire, as far as they are honoured."""

    keys: list[str] = field(default_factory=list)
    """The records honoured (in whole or in part)."""
    retired: Retired = field(default_factory=Retired)
    """The versions they retire together."""
    bad: list[str] = field(default_factory=list)
    """The records ignored, in whole or in part, and why (``key: why``)."""
    latest: dict[str, int] = field(default_factory=dict)
    """The highest version each honoured record retires, by key (what a relay waits for at its
    destination before it copies the record there)."""


def records(reader: Reader) -> Records:
    """The retention records of ``reader``'s run, each checked as the module says."""
    out = Records()
    store = reader.store
    found: list[tuple[str, Record]] = []
    for key in store.list_keys(retention.DIR):
        try:
            found.append((key, retention.decode(store.get(key, max_bytes=retention.MAX_RECORD_BYTES), key)))
        except StoreError as exc:
            out.bad.append(f"{key}: {exc}")
    if not found:
        return out
    committed = reader.versions()
    newest = committed[-1] if committed else -1
    present = set(committed)
    for key, record in found:
        try:
            if record.legacy:
                left = _latest_full_left(reader, committed, record.retired)
                honoured = Retired(tuple((a, min(b, left - 1)) for a, b in record.retired.ranges if a < left))
                if honoured != record.retired:
                    out.bad.append(
                        f"{key}: a record of format {retention.LEGACY} (unsigned, written by earlier code) is "
                        f"honoured only below version {left}, the latest full version committed it does not retire"
                    )
            else:
                _check(reader, key, record, newest)
                honoured = record.retired
            _hides_nothing(reader, key, honoured, present)
        except StoreError as exc:
            out.bad.append(f"{key}: {exc}")
            continue
        if honoured.ranges:
            out.keys.append(key)
            out.retired = out.retired | honoured
            out.latest[key] = honoured.ranges[-1][1]
        elif not record.retired.ranges:
            out.keys.append(key)  # retires nothing: honoured, trivially
            out.latest[key] = 0
    return out


def _hides_nothing(reader: Reader, key: str, retired: Retired, committed: set[int]) -> None:
    """UnauthenticatedError if a version ``retired`` holds is the parent of a committed delta it does not
    retire: that delta could not be read, copied or applied. Whoever signed it (a key rotated out since, a
    writer of the legacy format), a record only excuses history that no later version needs; each record
    gc writes does so on its own (what it keeps starts at a full version), so one record is judged alone
    and a bad one cannot make a good one look bad. One manifest read per retired range."""
    for _, last in retired.ranges:
        after = last + 1
        if after not in committed:
            continue  # retired by another record, or missing: nothing to read through this one
        m = reader.manifest(after)
        if m.kind == "delta" and m.parent is not None and m.parent.version in retired:
            raise UnauthenticatedError(
                f"{reader.store.url(key)}: retires version {m.parent.version}, the parent of version {after}, "
                "a delta it does not retire: a record never hides a version a later one needs"
            )


def _check(reader: Reader, key: str, record: Record, newest: int) -> None:
    """StoreError unless format-2 ``record`` is the run's and signed as the run requires."""
    url = reader.store.url(key)
    lineage = reader.lineage()
    if record.origin != lineage.origin:
        raise UnauthenticatedError(f"{url}: a record of run {record.origin}, not of this run ({lineage.origin})")
    if record.retired.ranges and record.retired.ranges[-1][1] >= newest:
        raise UnauthenticatedError(
            f"{url}: retires version {record.retired.ranges[-1][1]}, not below the latest committed version {newest}"
        )
    if lineage.signed_by is None:
        if record.signature is not None:
            raise UnauthenticatedError(f"{url}: a signed record in an unsigned run")
        return
    if record.signature is None:
        raise UnauthenticatedError(f"{url}: unsigned, in a run signed by key {lineage.signed_by}")
    assert record.latest is not None
    at = min(record.latest, newest)
    keys = reader.keys_at(at, url)
    era = keys.era(at)
    if era.public is None:
        raise UnauthenticatedError(f"{url}: the run's key at version {at} ({era.key_id}) is not known")
    record.verify(era.public, url)


def _latest_full_left(reader: Reader, committed: list[int], retired: Retired) -> int:
    """The latest committed full version not in ``retired`` (0, version 0, when none can be read)."""
    for v in reversed(committed):
        if v in retired:
            continue
        try:
            if reader.manifest(v).kind == "full":
                return v
        except StoreError:
            continue
    return 0
