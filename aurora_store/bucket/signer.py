"""The key a run's publishers sign with, and a rotation to the next one.

A run owns one :class:`Signer` and hands it to its publishers (a sharded trainer's ranks'
publishers share it), so after a key rotation commits, everything of the run that signs (versions,
trainer states, results the trainer writes) signs with the new key. Reading and verifying what is
signed is the reader's key chain (:mod:`aurora_store.bucket.keychain`); this is the writing side.
"""

from __future__ import annotations

import itertools
from typing import Any

from aurora_store.bucket.plan import Latest
from aurora_store.bucket.reader import Reader
from aurora_store.errors import StoreError, UnauthenticatedError
from aurora_store.format import signing
from aurora_store.format.manifest import Manifest, Rotation


class Signer:
    """The private key a run's versions are signed with (None: they are not signed), and the key the
    next version rotates the run to, if one is pending."""

    def __init__(self, key: Any, reader: Reader, uri: str) -> None:
        self.key = signing.load_signing_key(key) if key is not None else None
        self.rotating: Any = None
        """The Ed25519 private key the next version rotates the run to (:meth:`rotate_to`), if any."""
        self.reader, self.uri = reader, uri

    @property
    def key_id(self) -> str | None:
        """The id of the key versions are signed with (None: they are not signed)."""
        return None if self.key is None else signing.key_id(self.key.public_key())

    def rotate_to(self, key: Any) -> None:
        """Publish the next version as a key rotation to ``key`` (an Ed25519 private key, or what
        :func:`~aurora_store.format.signing.load_signing_key` reads), signed by the current key and
        ``key``; once it commits, sign with ``key``. If the run is already signed by ``key`` (a
        publisher restarted after its rotation), :meth:`rotation_for` just moves to it."""
        new = signing.load_signing_key(key)
        if self.key is None:
            raise StoreError(
                f"{self.uri}: a key rotation needs the run's current signing key to sign it "
                "(--signing-key, with the new key as --rotate-signing-key)"
            )
        if signing.key_id(new.public_key()) == self.key_id:
            raise StoreError(f"{self.uri}: the key to rotate to is the signing key itself ({self.key_id})")
        self.rotating = new

    def rotation_for(self, latest: Latest | None) -> Rotation | None:
        """The rotation the next version after ``latest`` carries: None without one pending, or when the
        run is already signed by the key to rotate to (then this signer moves to it now)."""
        if self.rotating is None:
            return None
        new_id = signing.key_id(self.rotating.public_key())
        if latest is not None and latest.lineage.signed_by == new_id:
            self.key, self.rotating = self.rotating, None
            return None
        assert self.key is not None
        if latest is not None and latest.lineage.signed_by is not None:
            used = [e.key_id for e in self.reader.keys_at(latest.version, self.uri).eras]
            if new_id in used:  # readers refuse a rotation back to a key the run used
                raise StoreError(f"{self.uri}: key {new_id} signed this run before; rotate to a new key")
        return signing.rotation(self.key, self.rotating)

    def check_not_retired(self, latest: Latest | None) -> None:
        """UnauthenticatedError, saying so, if this signer's key is one the run rotated away from (a
        trainer restarted with the old key alone): rotating again is not the way on, its current key is."""
        current = latest.lineage.signed_by if latest is not None else None
        if current is None or self.key_id is None or self.key_id == current:
            return
        assert latest is not None
        eras = self.reader.keys_at(latest.version, self.uri).eras
        for era, after in itertools.pairwise(eras):
            if era.key_id == self.key_id:
                raise UnauthenticatedError(
                    f"{self.uri}: key {self.key_id} was retired at version {after.since}, when the run was "
                    f"rotated to key {after.key_id}; the run is signed by key {current} now: publish with it "
                    "(--signing-key, AURORA_SIGNING_KEY)"
                )

    def unreadable(self, exc: UnauthenticatedError) -> UnauthenticatedError:
        """What a publisher that cannot verify its run's latest should be told: what it lacks, or how to
        rotate to its key if that key is new to the run (``exc`` itself otherwise)."""
        if self.key is None and self.reader.verify_key is None:
            return UnauthenticatedError(
                f"{self.uri}: the run is signed; publish with its key (--signing-key, AURORA_SIGNING_KEY)",
                url=exc.url,
            )
        if self.key is not None and self.rotating is None:
            return UnauthenticatedError(
                f"{exc}; if {self.key_id} is a new key for this run, publish the next version as a key "
                "rotation: with the run's current key as --signing-key and the new one as "
                "--rotate-signing-key (Run.publish(..., rotate_to=NEW))",
                url=exc.url,
            )
        return exc

    def seal(self, m: Manifest, *, rotates: bool) -> Manifest:
        """``m`` signed (and, where the version ``rotates`` the key, countersigned by the new key)."""
        return signing.seal(m, self.key, self.rotating if rotates else None)

    def rotated(self) -> None:
        """A version rotating the key committed: sign with the new key from now on."""
        if self.rotating is not None:
            self.key, self.rotating = self.rotating, None
