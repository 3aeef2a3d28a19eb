"""Retention: delete the versions and trainer states no one can still need (``aurora gc``).

What is kept, whatever else is asked: version 0 (the run's lineage, and the KL reference the
trainer rebuilds from it), every key rotation (readers learn the run's signing keys from them),
the last ``keep_last`` versions, the last ``keep_fulls`` full versions,
every version at or after the oldest one a live actor holds or a region is at (the ``floor``:
relays copy what comes after a region's version), the versions of the kept trainer states, and
the whole chain (back to its full version) of every kept delta, so every kept version still
replays bit-exact. Everything else committed is retired.

Deleting is safe while the trainer publishes and relays copy: a plan covers the versions
committed when it was made (a version committed later is newer than all of them, so kept), a
retention record naming the versions about to go is written before the first deletion, each
retired version's manifest goes before its objects (no reader starts on a version being
deleted), and a gc killed half-way is finished by the next one (it deletes what is left of
every retired version). See docs/FORMAT.md, "Retention".

Offloaded result payloads (``results/<sha256>.bin``, FORMAT.md §13) are garbage once the trainer
has admitted their result, which it does within a lease: :func:`plan_results` retires those older
than an age, judged by the time the store reports. That needs no Redis (no one holds a payload),
and nothing under ``results/`` but a payload's own name is ever deleted.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.bucket.retention import records
from aurora_store.bucket.run import Run
from aurora_store.bucket.state import StateName, checked
from aurora_store.errors import CorruptError, RetentionError, StoreError
from aurora_store.format import retention, signing
from aurora_store.format.keys import (
    MANIFEST,
    RESULTS_DIR,
    STATE_COMMIT,
    STATE_DIR,
    VERSIONS_DIR,
    check_result_key,
    manifest_key,
    parse_state_dir,
    rotation_marker_key,
)
from aurora_store.format.manifest import Manifest
from aurora_store.format.retention import Retired

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

log = logging.getLogger("aurora.gc")


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """What to keep."""

    keep_last: int
    """The newest this many committed versions."""
    keep_fulls: int
    """The newest this many full versions."""
    keep_states: int = 2
    """The newest this many saved trainer states (with their versions' chains); at least one, which a
    restarted trainer resumes from."""
    holds: dict[str, int] | None = None
    """What live actors hold and regions are at, by who (from Redis); None: no one was asked,
    which only a dry run allows."""


@dataclass(slots=True)
class RetentionPlan:
    """What a gc would do to one run."""

    uri: str
    committed: list[int]
    kept: dict[int, str]
    """Every committed version kept, with the first reason it is."""
    retire: list[int]
    """Committed versions to retire now."""
    retired: Retired
    """Versions earlier gcs retired (their records')."""
    leftovers: dict[int, list[str]] = field(default_factory=dict)
    """Objects still there of versions retired earlier (a gc killed half-way)."""
    objects: dict[int, list[str]] = field(default_factory=dict)
    """The keys under each version retired now, its manifest last."""
    states_kept: list[int] = field(default_factory=list)
    states_deleted: dict[StateName, list[str]] = field(default_factory=dict)
    bad_states: list[str] = field(default_factory=list)
    """States that do not verify as a restart would (junk under a state's name, another key's, an unsigned
    one in a signed run), and why: never counted as kept; deleted once older than the newest kept one."""
    stray_markers: list[int] = field(default_factory=list)
    """Kept versions with a ``key-rotation`` marker beside a manifest that rotates no key (planted, or left
    by a trainer killed mid-rotation that then published the version without one): each costs every new
    reader a manifest read, so the markers go (the versions stay)."""
    records: list[str] = field(default_factory=list)
    bad_records: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    """Manifests that could not be read: the chains through them are unknown, so nothing is deleted."""
    freed_bytes: int = 0
    """Bytes of the retired versions' objects (their manifests' stats)."""

    def to_dict(self) -> dict[str, object]:
        return {
            "uri": self.uri,
            "committed": len(self.committed),
            "kept": {str(v): why for v, why in sorted(self.kept.items())},
            "retire": self.retire,
            "retired_before": len(self.retired),
            "leftover_objects": sum(map(len, self.leftovers.values())),
            "states_kept": self.states_kept,
            "states_deleted": sorted({n.version for n in self.states_deleted}),
            "bad_states": self.bad_states,
            "stray_markers": self.stray_markers,
            "freed_bytes": self.freed_bytes,
            "bad_records": self.bad_records,
            "unreadable": self.unreadable,
        }


def plan(run: Run, policy: RetentionPolicy) -> RetentionPlan:
    """What a gc of ``run`` under ``policy`` would delete, and why every other version stays."""
    store, reader = run.store, run.reader
    if policy.keep_last < 1 or policy.keep_fulls < 1 or policy.keep_states < 1:
        raise ValueError("keep at least the last version, the last full version and the last trainer state")
    found = records(reader)
    record_keys, retired, bad = found.keys, found.retired, found.bad
    committed = reader.versions()
    manifests: dict[int, Manifest] = {}
    unreadable = []

    def read(v: int) -> tuple[int, Manifest | None, str | None]:
        try:
            return v, reader.manifest(v), None
        except StoreError as exc:
            return v, None, f"version {v}: {exc}"

    for v, m, err in store.map(read, committed):
        if m is not None:
            manifests[v] = m
        else:
            unreadable.append(str(err))
    kept: dict[int, str] = {}

    def keep(v: int, why: str) -> None:
        kept.setdefault(v, why)

    if 0 in committed:
        keep(0, "version 0: the run's lineage and the KL reference")
    for v in committed:
        if v in manifests and manifests[v].rotation is not None:
            keep(v, "a key rotation: readers learn the run's keys from it")
    for v in committed[-policy.keep_last :]:
        keep(v, f"one of the last {policy.keep_last}")
    for v in [v for v in committed if v in manifests and manifests[v].kind == "full"][-policy.keep_fulls :]:
        keep(v, f"one of the last {policy.keep_fulls} full versions")
    if policy.holds:
        who, floor = min(policy.holds.items(), key=lambda kv: kv[1])
        for v in committed:
            if v >= floor:
                keep(v, f"at or after version {floor}, which {who} holds")
    # a restart uses the state of a committed version, named by that version's hash: a state of a
    # version above the latest committed one is being written before its commit (or was planted), and
    # one whose hash is not its committed version's belongs to a version that never committed
    latest_committed = committed[-1] if committed else -1

    def usable(n: StateName) -> bool:
        m = manifests.get(n.version)
        return n.version <= latest_committed and (m is None or n.belongs_to(m.version_hash))

    # a state counts as kept only once it verifies as a restart would verify it: junk planted under a
    # state's name (the tags are public manifest hashes) would otherwise be kept in place of real states
    states_kept: list[StateName] = []
    bad_states: list[str] = []
    for n in reversed([n for n in run.state.names() if usable(n)]):
        if len(states_kept) == policy.keep_states:
            break
        try:
            checked(
                run.state, run.reader, n, manifests[n.version] if n.version in manifests else run.manifest(n.version)
            )
        except StoreError as exc:
            bad_states.append(str(exc))
            continue
        states_kept.insert(0, n)
    for s in states_kept:
        if s.version in committed:
            keep(s.version, "a kept trainer state's version")
    for v in sorted(kept, reverse=True):  # each kept delta's chain, back to its full version
        m = manifests.get(v)
        while m is not None and m.kind == "delta" and m.parent is not None:
            keep(m.parent.version, f"in the chain of version {v}")
            m = manifests.get(m.parent.version)
    by_version = _under(store, VERSIONS_DIR)
    retire = [v for v in committed if v not in kept]
    p = RetentionPlan(
        store.uri, committed, kept, retire, retired, records=record_keys, bad_records=bad, unreadable=unreadable
    )
    committed_set = set(committed)
    latest = committed[-1] if committed else -1
    for v, keys in by_version.items():
        if v in retired and v not in committed_set and v < latest:  # never a version being published now
            p.leftovers[v] = keys
    for v in retire:
        mkey = manifest_key(v)
        p.objects[v] = [*(k for k in by_version.get(v, []) if k != mkey), mkey]
        p.freed_bytes += manifests[v].stats.bytes if v in manifests else 0
    marker_keys = {rotation_marker_key(v) for v in committed if v in manifests and manifests[v].rotation is None}
    p.stray_markers = sorted(v for v, keys in by_version.items() if v not in p.objects and marker_keys & set(keys))
    p.states_kept = [n.version for n in states_kept]
    p.bad_states = bad_states
    newest = states_kept[-1].version if states_kept else None
    for name, keys in _states(store).items():
        if name in states_kept or newest is None or name.version > newest:
            continue  # kept, or a state being written now
        commit = next((k for k in keys if k.endswith("/" + STATE_COMMIT)), None)
        p.states_deleted[name] = [*(k for k in keys if k != commit), *([commit] if commit else [])]
    return p


def apply(run: Run, p: RetentionPlan, *, now_ms: int | None = None) -> dict[str, int]:
    """Carry out plan ``p``: record, then delete (see the module's docstring for the order). Returns counts."""
    store = run.store
    if p.unreadable:
        raise RetentionError(
            f"{store.uri}: {len(p.unreadable)} manifest(s) could not be read ({p.unreadable[0]}); the chains "
            "through them are unknown, so gc deletes nothing: run aurora audit"
        )
    retired = p.retired | p.retire
    wrote = None
    if p.retire or len(p.records) > 1:
        created = now_ms if now_ms is not None else int(time.time() * 1000)
        latest = p.committed[-1]
        origin, key = _record_signer(run, latest)
        wrote, data = retention.encode(retired, created, latest=latest, origin=origin, key=key)
        store.put_if_absent(wrote, data)  # the intent, before the first deletion
    counts = {"versions": 0, "objects": 0, "states": 0, "records": 0, "markers": 0, "temporaries": 0}
    for v in p.retire:
        keys = p.objects[v]
        counts["objects"] += store.delete([keys[-1]])  # the manifest first: no reader starts on it now
        counts["objects"] += store.delete(keys[:-1])
        counts["versions"] += 1
        log.info("%s: retired version %d (%d objects)", store.uri, v, len(keys))
    for keys in p.leftovers.values():
        counts["objects"] += store.delete([k for k in keys if k.endswith("/" + MANIFEST)])
        counts["objects"] += store.delete([k for k in keys if not k.endswith("/" + MANIFEST)])
    counts["markers"] = store.delete([rotation_marker_key(v) for v in p.stray_markers])
    for keys in p.states_deleted.values():
        store.delete(keys[-1:])  # state.json first: a trainer never resumes from a state half-deleted
        store.delete(keys[:-1])
        counts["states"] += 1
    if wrote is not None:
        counts["records"] = store.delete([k for k in p.records if k != wrote])
    counts["temporaries"] = store.sweep_temporaries()
    return counts


def _record_signer(run: Run, latest: int) -> tuple[str, Ed25519PrivateKey | None]:
    """The run's origin and the key its retention record is signed with: none in an unsigned run,
    the run's key at ``latest`` in a signed one (RetentionError, before anything is deleted, when
    this gc was not given that key)."""
    lineage = run.reader.lineage()
    assert lineage.origin is not None
    if lineage.signed_by is None:
        return lineage.origin, None
    url = run.store.url(retention.DIR)
    era = run.reader.keys_at(latest, url).era(latest)
    key = run.signing_key
    if key is None:
        raise RetentionError(
            f"{url}: the run is signed by key {era.key_id}, and so is every retention record in it: give gc "
            "the run's signing key (--signing-key or AURORA_SIGNING_KEY); nothing was deleted"
        )
    if signing.key_id(key.public_key()) != era.key_id:
        raise RetentionError(
            f"{url}: the signing key given is {signing.key_id(key.public_key())}, the run's key at version "
            f"{latest} is {era.key_id}; nothing was deleted"
        )
    return lineage.origin, key


@dataclass(slots=True)
class ResultsPlan:
    """What a gc would do under ``results/``: delete the payloads older than ``max_age_s``."""

    max_age_s: int
    """0: results are not collected (nothing was listed)."""
    now: float
    expired: list[tuple[str, int]] = field(default_factory=list)
    """Payloads to delete, with their sizes."""
    young: int = 0
    """Payloads kept for being younger than ``max_age_s``."""
    undated: list[str] = field(default_factory=list)
    """Payloads kept because the store reports no modification time for them that can be read."""
    foreign: list[str] = field(default_factory=list)
    """Keys under ``results/`` that are not a payload's name: never deleted, only reported."""

    @property
    def expired_bytes(self) -> int:
        return sum(size for _, size in self.expired)

    def to_dict(self) -> dict[str, object]:
        return {
            "max_age_s": self.max_age_s,
            "expired": len(self.expired),
            "expired_bytes": self.expired_bytes,
            "young": self.young,
            "undated": self.undated,
            "foreign": self.foreign,
        }


def plan_results(store: ObjectStore, max_age_s: int, *, now: float | None = None) -> ResultsPlan:
    """Which offloaded payloads of ``store``'s run are older than ``max_age_s`` seconds at ``now``
    (default: the present); ``max_age_s`` 0 collects none and lists nothing."""
    if max_age_s < 0:
        raise ValueError(f"results max age must be >= 0 seconds, got {max_age_s}")
    p = ResultsPlan(max_age_s, time.time() if now is None else now)
    if max_age_s == 0:
        return p
    for key, size, modified in store.list_modified(RESULTS_DIR):
        try:
            check_result_key(key)
        except CorruptError:
            p.foreign.append(key)
            continue
        if modified is None:
            p.undated.append(key)
        elif p.now - modified > max_age_s:
            p.expired.append((key, size))
        else:
            p.young += 1
    return p


def apply_results(store: ObjectStore, p: ResultsPlan) -> int:
    """Delete the payloads plan ``p`` found expired; returns how many were still there. A payload is
    immutable and content-addressed, so one found old stays old: a retried put of the same bytes
    finds it there and writes nothing."""
    removed = store.delete([key for key, _ in p.expired])
    if removed:
        log.info("%s: deleted %d results/ payloads older than %d s", store.uri, removed, p.max_age_s)
    return removed


def _under(store: ObjectStore, directory: str) -> dict[int, list[str]]:
    """Every key under ``versions/``, by the version its directory names."""
    out: dict[int, list[str]] = defaultdict(list)
    for key in store.list_keys(directory):
        parts = key.split("/")
        if len(parts) >= 3 and len(parts[1]) == 10 and parts[1].isdigit():
            out[int(parts[1])].append(key)
    return dict(out)


def _states(store: ObjectStore) -> dict[StateName, list[str]]:
    """Every key under ``trainer/``, by the state its directory names."""
    out: dict[StateName, list[str]] = defaultdict(list)
    for key in store.list_keys(STATE_DIR):
        parts = key.split("/")
        found = parse_state_dir(parts[1]) if len(parts) >= 3 else None
        if found is not None:
            out[StateName(*found)].append(key)
    return dict(out)
