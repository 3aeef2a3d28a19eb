"""An actor's identity: its Ed25519 key and the fleet's certificate for it; every result is signed.

The key and certificate come from ``--identity-key`` and ``--identity-cert`` (``aurora actor-cert
issue`` writes both). They are checked against each other, this actor's worker id and the run at
start, so a misconfigured actor stops at once instead of having every result dropped. The
signature covers the result's run, job, lease token, actor, version, version hash and payload
SHA-256 (:func:`aurora_store.format.identity.result_message`).
"""

from __future__ import annotations

import logging
import os
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from aurora_store.coord.lease import Lease
from aurora_store.errors import ConfigError, StoreError
from aurora_store.format import identity as ident
from aurora_store.format.signing import key_id, load_signing_key, raw_public
from aurora_store.localfile import read_regular

log = logging.getLogger("aurora.actor")


def read_cert(material: str) -> bytes:
    """A certificate's bytes: the JSON document itself (what ``$AURORA_IDENTITY_CERT`` may hold) or its file."""
    if material.lstrip().startswith("{"):
        return material.strip().encode()
    try:
        return read_regular(material, ident.MAX_CERT_BYTES + 1).strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the actor certificate {os.fspath(material)!r}: {exc.strerror or exc}") from None


class Identity:
    """Signs this actor's results with its key; its certificate travels with each."""

    def __init__(self, key: Ed25519PrivateKey, cert: bytes, *, actor: str, run: str) -> None:
        try:
            parsed = ident.parse_cert(cert)
        except ident.CertError as exc:
            raise ConfigError(f"actor certificate: {exc}") from None
        if parsed.key != raw_public(key.public_key()).hex():
            raise ConfigError(
                f"actor certificate (serial {parsed.serial}) is for key {parsed.key_id}, not this actor's key "
                f"{key_id(key.public_key())}"
            )
        if parsed.actor != actor:
            raise ConfigError(f"actor certificate names actor {parsed.actor!r}, this actor is {actor!r}")
        now = time.time()
        why = parsed.covers(now_s=now, run=run)
        if why is not None:
            raise ConfigError(
                f"actor certificate (serial {parsed.serial}) does not cover run {run!r} now: {why} "
                f"(valid {parsed.not_before}..{parsed.not_after}, run {parsed.run!r})"
            )
        self.key, self.cert, self.parsed = key, parsed.encode(), parsed
        self.actor, self.run = actor, run
        log.info(
            "actor %s signs its results (certificate serial %d, fleet key %s, valid for %.1f more days)",
            actor,
            parsed.serial,
            parsed.issuer,
            (parsed.not_after - now) / 86400,
        )

    @classmethod
    def load(cls, key: str, cert: str, *, actor: str, run: str) -> Identity:
        """From ``--identity-key`` (PEM file or text) and ``--identity-cert`` (file or JSON text)."""
        try:
            signing_key = load_signing_key(key)
        except StoreError as exc:
            raise ConfigError(f"--identity-key: {exc}") from None
        return cls(signing_key, read_cert(cert), actor=actor, run=run)

    def sign(self, lease: Lease, *, version: int, version_hash: str, payload_sha256: str) -> str:
        """The signature of this actor's result for ``lease``."""
        message = ident.result_message(
            run=self.run,
            job=lease.job,
            token=lease.token,
            actor=self.actor,
            version=version,
            version_hash=version_hash,
            payload_sha256=payload_sha256,
        )
        return ident.sign_result(self.key, message)
