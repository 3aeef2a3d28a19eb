"""Which results come from a certified actor: the trainer's identity gate.

With a fleet key (``--fleet-key``), a result is admitted only if it carries a certificate the fleet
key signed (:mod:`aurora_store.format.identity`), valid now, for this run, not revoked, naming the
actor the result names (and the lease's holder is checked against that name when the result is
admitted), and a signature by the certificate's key over exactly this result's run, job, lease
token, actor, version, version hash and payload hash. A result that fails is a drop reason, never
an exception; the check runs before a referenced payload is fetched (the signature covers the
hash the reference names). Each certificate is verified once (cached by its hash); each result
costs one Ed25519 verification and, for an inline payload, one SHA-256.

Without a fleet key every result passes, as before identities (said once in the log).

The revocation list (``--revoked-actors FILE``) is read at start (a bad one stops the trainer) and
again whenever the file changes, looked at no more than every :data:`RELOAD_S` seconds: a revocation
takes effect within that time, without a restart. A list that later fails to read keeps the last
good one in force and is said in the log.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from aurora_store.coord.results import Result
from aurora_store.errors import ConfigError
from aurora_store.format import identity as ident
from aurora_store.format.signing import key_id, load_verify_key
from aurora_store.localfile import read_regular

log = logging.getLogger("aurora.trainer")
RELOAD_S = 5.0
"""How often, at most, the revocation list's file is looked at for changes."""
CACHE = 4096
"""Certificates (verified or refused) remembered by hash."""


class ResultGate:
    """Checks each result's certificate and signature against the fleet key (see the module's doc)."""

    def __init__(
        self,
        fleet: Ed25519PublicKey | None,
        run: str,
        *,
        revoked: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.fleet, self.run, self.clock = fleet, run, clock
        self.revoked_path = revoked
        self.revocations = ident.Revocations()
        self._stamp: tuple[int, int] | None = None
        self._looked = time.monotonic()
        self.reload_s = RELOAD_S
        self._cache: OrderedDict[bytes, tuple[ident.ActorCert, Ed25519PublicKey] | str] = OrderedDict()
        self._lock = threading.Lock()
        self.cert_checks = 0
        """Certificates verified against the fleet key (each one once, while cached)."""
        self.signature_checks = 0
        """Result signatures verified."""
        if revoked is not None:
            if fleet is None:
                raise ConfigError("--revoked-actors needs --fleet-key: without it results are not authenticated")
            try:
                self._reload()
            except (OSError, ValueError) as exc:
                raise ConfigError(f"--revoked-actors: cannot read {revoked!r}: {exc}") from None
        if fleet is None:
            log.warning(
                "no --fleet-key: results are not authenticated (anyone who can write Redis can submit in an "
                "actor's name); see docs/SECURITY.md"
            )
        else:
            fid = key_id(fleet)
            log.info("admitting only results signed by actors certified by fleet key %s", fid)

    @classmethod
    def of(cls, fleet_key: str | None, run: str, *, revoked: str | None = None) -> ResultGate:
        """The gate for the trainer's ``--fleet-key`` (a PEM public key file or text) and ``--revoked-actors``."""
        return cls(None if fleet_key is None else load_verify_key(fleet_key), run, revoked=revoked)

    @property
    def on(self) -> bool:
        """Whether results are authenticated."""
        return self.fleet is not None

    def check(self, res: Result) -> str | None:
        """Why ``res`` is not from a certified actor (a drop reason), or None when it is (or the gate is off)."""
        if self.fleet is None:
            return None
        if res.cert is None or res.sig is None:
            return "unsigned"
        self._maybe_reload()
        got = self._cert(res.cert, self.fleet)
        if isinstance(got, str):
            return got
        cert, key = got
        if self.revocations.revokes(cert):
            return "revoked"
        why = cert.covers(now_s=self.clock(), run=self.run)
        if why is not None:
            return why
        if cert.actor != res.actor:
            return "wrong_cert_actor"
        if res.inline is not None:
            sha = hashlib.sha256(res.inline).hexdigest()
        elif res.ref is not None:
            sha = res.ref.sha256
        else:
            return "bad_signature"
        message = ident.result_message(
            run=self.run,
            job=res.job,
            token=res.token,
            actor=res.actor,
            version=res.version,
            version_hash=res.version_hash,
            payload_sha256=sha,
        )
        with self._lock:
            self.signature_checks += 1
        return None if ident.verify_result(key, res.sig, message) else "bad_signature"

    def _cert(self, raw: bytes, fleet: Ed25519PublicKey) -> tuple[ident.ActorCert, Ed25519PublicKey] | str:
        """The certificate in ``raw`` and its key if the fleet key signed it, else why not; cached by hash."""
        h = hashlib.sha256(raw).digest()
        with self._lock:
            hit = self._cache.get(h)
            if hit is not None:
                self._cache.move_to_end(h)
                return hit
        got: tuple[ident.ActorCert, Ed25519PublicKey] | str
        try:
            cert = ident.parse_cert(raw)
            ident.verify_cert(cert, fleet)
            got = (cert, cert.public_key())
        except ident.CertError as exc:
            got = exc.reason
        except ValueError:  # a key that is not a point of the curve
            got = "bad_cert"
        with self._lock:
            self.cert_checks += 1
            self._cache[h] = got
            while len(self._cache) > CACHE:
                self._cache.popitem(last=False)
        return got

    def _maybe_reload(self) -> None:
        if self.revoked_path is None or time.monotonic() - self._looked < self.reload_s:
            return
        try:
            self._reload()
        except (OSError, ValueError) as exc:
            log.error("revocation list %s unreadable (%s); the last one read stays in force", self.revoked_path, exc)

    def _reload(self) -> None:
        assert self.revoked_path is not None
        self._looked = time.monotonic()
        st = os.stat(self.revoked_path)
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        raw = read_regular(self.revoked_path, ident.MAX_REVOCATIONS_BYTES + 1)  # a FIFO is refused, not waited on
        self.revocations = ident.parse_revocations(raw, self.revoked_path)
        self._stamp = stamp
        log.info(
            "revocation list %s: %d serials, %d actor keys revoked",
            self.revoked_path,
            len(self.revocations.serials),
            len(self.revocations.keys),
        )
