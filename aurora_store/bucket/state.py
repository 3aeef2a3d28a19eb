"""The trainer's resumable states in the home bucket: immutable objects under
``trainer/state-NNNNNNNNNN-<version_hash[:16]>/``, committed by ``state.json``, written last (as a
manifest commits a version). A state is named by the hash of the version it belongs to, so the
trainer can write it before that version's commit: a state whose version never committed (the
trainer died in between) names a hash no committed version has, and the version the restarted
trainer publishes in its place gets a name of its own. What goes into the objects is the
trainer's business (:mod:`trainer.state`); this module owns where they live and the commit rule.
Bytes only: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.errors import StoreError
from aurora_store.format.keys import STATE_COMMIT, STATE_DIR, committed_state, is_file_name, state_dir


@dataclass(frozen=True, order=True, slots=True)
class StateName:
    """Which trainer state: of ``version``, for the version whose hash starts with ``tag`` (None: a
    state written by earlier code, named by its version alone)."""

    version: int
    tag: str | None = None

    @staticmethod
    def of(version: int, version_hash: str) -> StateName:
        return StateName(version, version_hash[:16])

    @property
    def dir(self) -> str:
        return state_dir(self.version, self.tag)

    def belongs_to(self, version_hash: str) -> bool:
        """Whether this state may be the one of the version with ``version_hash`` (a legacy name may)."""
        return self.tag is None or version_hash.startswith(self.tag)


class StateStore:
    """Saved trainer states of the run under ``store``."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def names(self) -> list[StateName]:
        """Every committed state, by version (then tag)."""
        found = (committed_state(key) for key in self.store.list_keys(STATE_DIR))
        return sorted((StateName(v, tag) for v, tag in filter(None, found)), key=lambda n: (n.version, n.tag or ""))

    def versions(self) -> list[int]:
        """Versions with a committed state, ascending."""
        return sorted({n.version for n in self.names()})

    def url(self, name: StateName, obj: str = "") -> str:
        return self.store.url(f"{name.dir}/{obj}" if obj else name.dir)

    def put(self, name: StateName, obj: str, data: bytes | memoryview) -> None:
        """Write object ``obj`` of state ``name`` (immutable; the same bytes again are a no-op)."""
        self.store.put_immutable(_key(name, obj), data, verify=lambda existing: existing == data)

    def commit(self, name: StateName, doc: bytes) -> None:
        """Write ``state.json``, after every other object of the state: the commit."""
        self.store.put_immutable(f"{name.dir}/{STATE_COMMIT}", doc, verify=lambda existing: existing == doc)

    def get(self, name: StateName, obj: str, *, max_bytes: int) -> bytes:
        """Object ``obj`` of state ``name`` (MissingError if absent)."""
        return self.store.get(_key(name, obj), max_bytes=max_bytes)

    def get_commit(self, name: StateName, *, max_bytes: int) -> bytes:
        """The ``state.json`` that committed state ``name``."""
        return self.store.get(f"{name.dir}/{STATE_COMMIT}", max_bytes=max_bytes)


def _key(name: StateName, obj: str) -> str:
    if not is_file_name(obj) or obj == STATE_COMMIT:
        raise StoreError(f"trainer state object name {obj!r} must be a plain file name other than {STATE_COMMIT}")
    return f"{name.dir}/{obj}"
