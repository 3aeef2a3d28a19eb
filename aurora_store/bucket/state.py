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
from typing import TYPE_CHECKING

from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.errors import StoreError, UnauthenticatedError
from aurora_store.format import trainer_state
from aurora_store.format.keys import STATE_COMMIT, STATE_DIR, committed_state, is_file_name, state_dir

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from aurora_store.bucket.reader import Reader
    from aurora_store.format.manifest import Manifest


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


def checked(
    states: StateStore, reader: Reader, name: StateName, manifest: Manifest, *, trust_unsigned: bool = False
) -> trainer_state.StateDoc:
    """The committed document of state ``name``, checked as a restart checks it before trusting the state:
    parsed, bound to ``manifest`` (its committed version) and the run, and in a signed run signed by the
    key of that version. In a signed run an unsigned state of the old format is refused unless
    ``trust_unsigned`` (the operator's word that the run was written before states were signed).
    StoreError (CorruptError, ChainError, UnauthenticatedError, MissingError) if it is not to be trusted."""
    where = states.url(name)
    doc = trainer_state.parse(
        states.get_commit(name, max_bytes=trainer_state.MAX_DOC_BYTES), expect_version=name.version, what=where
    )
    key = _key_of(reader, manifest, where)
    if doc.legacy and key is not None and not trust_unsigned:
        raise UnauthenticatedError(
            f"{where}: an unsigned state ({trainer_state.LEGACY}) in a signed run, where anyone who can write "
            "the bucket could have planted it; if this run was written by code from before trainer states "
            "were signed, resume it once with --trust-unsigned-state"
        )
    trainer_state.check(doc, manifest, key, where)
    return doc


def _key_of(reader: Reader, manifest: Manifest, where: str) -> Ed25519PublicKey | None:
    """The key a signed run's state of ``manifest``'s version must be signed by: the one that signs
    that version (after a key rotation, the new key); None in an unsigned run."""
    lineage = manifest.lineage
    if lineage is None or lineage.signed_by is None:
        return None
    era = reader.keys_at(manifest.version, where).era(manifest.version)
    if era.public is None:
        raise UnauthenticatedError(
            f"{where}: the public key {era.key_id} that signs version {manifest.version} is not known"
        )
    return era.public
