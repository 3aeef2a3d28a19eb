"""The trainer's resumable state in the home bucket: immutable objects under
``trainer/state-NNNNNNNNNN/``, committed by ``state.json``, written last (as a manifest commits
a version). What goes into the objects is the trainer's business (:mod:`trainer.state`); this
module owns where they live and the commit rule. Bytes only: no torch.
"""

from __future__ import annotations

from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.errors import StoreError
from aurora_store.format.keys import STATE_COMMIT, STATE_DIR, committed_state, is_file_name, state_dir


class StateStore:
    """Saved trainer states of the run under ``store``."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def versions(self) -> list[int]:
        """Versions with a committed state, ascending."""
        found = (committed_state(key) for key in self.store.list_keys(STATE_DIR))
        return sorted(v for v in found if v is not None)

    def url(self, version: int, name: str = "") -> str:
        return self.store.url(f"{state_dir(version)}/{name}" if name else state_dir(version))

    def put(self, version: int, name: str, data: bytes) -> None:
        """Write object ``name`` of the state of ``version`` (immutable; the same bytes again are a no-op)."""
        self.store.put_immutable(_key(version, name), data, verify=lambda existing: existing == data)

    def commit(self, version: int, doc: bytes) -> None:
        """Write ``state.json``, after every other object of the state: the commit."""
        self.store.put_immutable(f"{state_dir(version)}/{STATE_COMMIT}", doc, verify=lambda existing: existing == doc)

    def get(self, version: int, name: str, *, max_bytes: int) -> bytes:
        """Object ``name`` of the state saved at ``version`` (MissingError if absent)."""
        return self.store.get(_key(version, name), max_bytes=max_bytes)

    def get_commit(self, version: int, *, max_bytes: int) -> bytes:
        """The ``state.json`` that committed the state of ``version``."""
        return self.store.get(f"{state_dir(version)}/{STATE_COMMIT}", max_bytes=max_bytes)


def _key(version: int, name: str) -> str:
    if not is_file_name(name) or name == STATE_COMMIT:
        raise StoreError(f"trainer state object name {name!r} must be a plain file name other than {STATE_COMMIT}")
    return f"{state_dir(version)}/{name}"
