"""A signed run's key history: which key signs which versions, learned from its key rotations.

Version 0 fixes the run's first key (``run.signed_by``). A rotation version (format aurora/4)
moves the run to a new key from that version on; it names both public keys and is signed by
both (:func:`aurora_store.format.signing.verify_rotation`), and each rotation must rotate from the
key then in force. So the rotations form a chain of links each signed at both ends, and a reader
that trusts any one key of the chain can trust all of them: the keys after it because each was
introduced by its predecessor, the keys before it because each was vouched for by its successor
(and the parent hashes chain the versions they signed). Pure logic, no I/O: the reader finds the
rotation manifests and hands them over in version order.
"""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from aurora_store.errors import UnauthenticatedError
from aurora_store.format import signing
from aurora_store.format.manifest import Manifest


@dataclass(frozen=True, slots=True)
class KeyEra:
    """Versions ``since`` up to the next rotation are signed by key ``key_id``."""

    since: int
    key_id: str
    public: Ed25519PublicKey | None
    """The key itself, once known (from a rotation that names it, or the reader's own key)."""


class RunKeys:
    """The eras of one signed run's keys, in version order."""

    def __init__(self, first: str) -> None:
        self.eras: list[KeyEra] = [KeyEra(0, first, None)]

    @property
    def first(self) -> str:
        return self.eras[0].key_id

    @property
    def last(self) -> KeyEra:
        return self.eras[-1]

    def era(self, version: int) -> KeyEra:
        """The era ``version`` belongs to."""
        i = bisect.bisect_right([e.since for e in self.eras], version) - 1
        return self.eras[i]

    def previous(self, era: KeyEra) -> KeyEra | None:
        i = self.eras.index(era)
        return self.eras[i - 1] if i > 0 else None

    def add(self, m: Manifest, what: str) -> None:
        """Learn rotation ``m`` (parsed: both keys match their ids), the next one after :attr:`last`.

        UnauthenticatedError unless it is signed by both keys it names, rotates from the key in
        force, and names a key the run has never used."""
        r = m.rotation
        assert r is not None
        last = self.last
        if m.version <= last.since:
            raise UnauthenticatedError(
                f"{what}: the rotation at version {m.version} is not after the one at version {last.since}"
            )
        if r.previous != last.key_id:
            raise UnauthenticatedError(
                f"{what}: version {m.version} rotates from key {r.previous}, but the run is signed by key "
                f"{last.key_id} since version {last.since}"
            )
        if any(e.key_id == r.key_id for e in self.eras):
            raise UnauthenticatedError(f"{what}: version {m.version} rotates back to key {r.key_id}, used before")
        old, new = signing.verify_rotation(m, what)
        if last.public is not None and not signing.same_key(last.public, old):
            raise UnauthenticatedError(
                f"{what}: version {m.version} names a public key for {r.previous} other than the run's"
            )
        self.eras[-1] = dataclasses.replace(last, public=old)
        self.eras.append(KeyEra(m.version, r.key_id, new))

    def bind(self, key: Ed25519PublicKey) -> None:
        """Take ``key`` as the first key when no rotation has named that key yet and its id is the run's first."""
        first = self.eras[0]
        if first.public is None and signing.key_id(key) == first.key_id:
            self.eras[0] = dataclasses.replace(first, public=key)

    def trusts(self, key: Ed25519PublicKey) -> bool:
        """Whether ``key`` is one of the run's keys (and so every key of the chain is to be trusted)."""
        return any(e.public is not None and signing.same_key(e.public, key) for e in self.eras)

    def describe(self) -> str:
        return ", ".join(f"{e.key_id} from version {e.since}" for e in self.eras)
