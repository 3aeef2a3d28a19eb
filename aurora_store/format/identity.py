"""Actor certificates and result signatures: who may submit results to a run.

An operator holds a *fleet key* (Ed25519; ``aurora keygen``). It signs one certificate per actor
(``aurora actor-cert issue``): a small canonical JSON document naming the actor, its own Ed25519
public key, the run it may serve (or ``"*"``), a validity window in Unix seconds and a serial
number. The trainer trusts the fleet's public key only; an actor signs every result it submits
with its own key, and sends its certificate along (:mod:`aurora_store.coord.results`).

Certificate (``aurora-actor-cert/1``), exactly these keys, serialised canonically (keys sorted,
no whitespace, ASCII): ``actor``, ``format``, ``issuer`` (the fleet key's id: first 16 hex digits
of the SHA-256 of its raw public key), ``key`` (the actor's raw public key, 64 hex digits),
``not_after``, ``not_before`` (integers, Unix seconds), ``run``, ``serial`` (integer) and ``sig``
(base64 of the fleet's Ed25519 signature over ``b"aurora-actor-cert/1\\0"`` + the canonical JSON
of every other key). A document that is not byte-for-byte its canonical form is refused, so one
certificate has one hash.

Result signature: Ed25519 by the actor's key over ``b"aurora-result/1\\0"`` + the canonical JSON of
``actor``, ``job``, ``payload_sha256``, ``run``, ``token``, ``version``, ``version_hash``; base64.

Revocation list: UTF-8 text, one entry a line, ``serial:N`` (a certificate's serial) or
``key:ID`` (an actor key's id, 16 hex digits: every certificate of that key); ``#`` starts a
comment. See :func:`parse_revocations`.

Pure: bytes and keys in, values out; no I/O. Everything parsed here is hostile input.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from aurora_store.errors import UnauthenticatedError
from aurora_store.format.manifest import raw_key_id
from aurora_store.format.manifest_parser import B64_SIG, HEX64, KEY_ID
from aurora_store.format.signing import key_id, raw_public

CERT_FORMAT = "aurora-actor-cert/1"
CERT_DOMAIN = b"aurora-actor-cert/1\0"
RESULT_DOMAIN = b"aurora-result/1\0"
MAX_CERT_BYTES = 1024
"""A certificate is about 400 bytes; a larger document is refused unread."""
MAX_TIME_S = 1 << 40
MAX_SERIAL = (1 << 53) - 1
SIG_CHARS = 88
"""Base64 of a 64-byte Ed25519 signature."""
_KEYS = frozenset({"actor", "format", "issuer", "key", "not_after", "not_before", "run", "serial", "sig"})
_NAME = re.compile(r"[A-Za-z0-9_.:@+=\-]{1,200}")
_RUN = re.compile(r"\*|[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")


REASONS = (
    "unsigned",
    "bad_cert",
    "uncertified",
    "revoked",
    "cert_expired",
    "cert_not_yet_valid",
    "wrong_cert_run",
    "wrong_cert_actor",
    "bad_signature",
)
"""Why a result is not from a certified actor: the trainer's drop reasons (one owner, read by the
trainer's gate and by the actor that is told of them)."""


class CertError(UnauthenticatedError):
    """A certificate or a result signature that does not hold; ``reason`` is the trainer's drop reason."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def canonical(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


@dataclass(frozen=True, slots=True)
class ActorCert:
    """An actor's certificate: the fleet vouches that ``key`` is ``actor``'s, for ``run``, in the window."""

    actor: str
    key: str
    """The actor's raw Ed25519 public key, 64 hex digits."""
    run: str
    """The run id it may serve, or ``"*"`` for any."""
    not_before: int
    not_after: int
    """Validity, Unix seconds: valid while ``not_before <= now < not_after``."""
    serial: int
    issuer: str
    """The fleet key's id."""
    sig: str = ""
    """Base64 of the fleet's signature over :meth:`message`."""

    def body(self) -> dict[str, Any]:
        return {
            "actor": self.actor,
            "format": CERT_FORMAT,
            "issuer": self.issuer,
            "key": self.key,
            "not_after": self.not_after,
            "not_before": self.not_before,
            "run": self.run,
            "serial": self.serial,
        }

    def message(self) -> bytes:
        """What the fleet key signs."""
        return CERT_DOMAIN + canonical(self.body())

    def encode(self) -> bytes:
        return canonical({**self.body(), "sig": self.sig})

    @property
    def key_id(self) -> str:
        """The actor key's id (what a revocation list may name)."""
        return raw_key_id(bytes.fromhex(self.key))

    def public_key(self) -> Ed25519PublicKey:
        return Ed25519PublicKey.from_public_bytes(bytes.fromhex(self.key))

    def covers(self, *, now_s: float, run: str) -> str | None:
        """Why this certificate does not cover a result of ``run`` at ``now_s`` (a drop reason), or None."""
        if now_s < self.not_before:
            return "cert_not_yet_valid"
        if now_s >= self.not_after:
            return "cert_expired"
        if self.run not in ("*", run):
            return "wrong_cert_run"
        return None


def issue(
    actor: str,
    actor_key: Ed25519PublicKey,
    fleet: Ed25519PrivateKey,
    *,
    run: str,
    not_before: int,
    not_after: int,
    serial: int,
) -> ActorCert:
    """A certificate for ``actor``'s key, signed by the fleet key (checked as :func:`parse_cert` would)."""
    unsigned = ActorCert(
        actor=actor,
        key=raw_public(actor_key).hex(),
        run=run,
        not_before=not_before,
        not_after=not_after,
        serial=serial,
        issuer=key_id(fleet.public_key()),
    )
    _check_fields(unsigned.body() | {"sig": "A" * 86 + "=="})
    sig = base64.b64encode(fleet.sign(unsigned.message())).decode("ascii")
    return parse_cert(dataclasses.replace(unsigned, sig=sig).encode())


def parse_cert(raw: Any) -> ActorCert:
    """The certificate in ``raw`` (bytes as read from Redis or a file), checked field by field; it is
    not yet known to be the fleet's (:func:`verify_cert`). Raises :class:`CertError` (``bad_cert``)."""
    if not isinstance(raw, (bytes, bytearray)):
        raise CertError("bad_cert", f"a certificate is bytes, got {type(raw).__name__}")
    if not 0 < len(raw) <= MAX_CERT_BYTES:
        raise CertError("bad_cert", f"certificate of {len(raw)} bytes, expected 1 to {MAX_CERT_BYTES}")
    try:
        doc = json.loads(bytes(raw).decode("ascii"), parse_constant=_refuse)
    except (ValueError, RecursionError) as exc:
        raise CertError("bad_cert", f"certificate is not ASCII JSON ({exc})"[:200]) from None
    if not isinstance(doc, dict):
        raise CertError("bad_cert", f"certificate is a JSON {type(doc).__name__}, not an object")
    cert = _check_fields(doc)
    if cert.encode() != bytes(raw):
        raise CertError("bad_cert", "certificate is not in canonical form (sorted keys, no spaces, ASCII)")
    return cert


def _refuse(token: str) -> Any:
    raise ValueError(f"{token} is not a JSON number")


def _check_fields(doc: dict[str, Any]) -> ActorCert:
    if set(doc) != _KEYS:
        missing, extra = sorted(_KEYS - set(doc)), sorted(set(doc) - _KEYS)
        raise CertError("bad_cert", f"certificate keys: missing {missing}, unexpected {extra[:5]}"[:200])
    if doc["format"] != CERT_FORMAT:
        raise CertError("bad_cert", f"certificate format {doc['format']!r:.40}, expected {CERT_FORMAT!r}")

    def text(name: str, pattern: re.Pattern[str]) -> str:
        v = doc[name]
        if not (isinstance(v, str) and pattern.fullmatch(v)):
            raise CertError("bad_cert", f"certificate {name} {v!r:.80} does not match {pattern.pattern}")
        return v

    def integer(name: str, hi: int) -> int:
        v = doc[name]
        if not (type(v) is int and 0 <= v <= hi):
            raise CertError("bad_cert", f"certificate {name} {v!r:.40} is not an integer in [0, {hi}]")
        return v

    cert = ActorCert(
        actor=text("actor", _NAME),
        key=text("key", HEX64),
        run=text("run", _RUN),
        not_before=integer("not_before", MAX_TIME_S),
        not_after=integer("not_after", MAX_TIME_S),
        serial=integer("serial", MAX_SERIAL),
        issuer=text("issuer", KEY_ID),
        sig=text("sig", B64_SIG),
    )
    if cert.not_after <= cert.not_before:
        raise CertError("bad_cert", f"certificate window [{cert.not_before}, {cert.not_after}) is empty")
    return cert


def verify_cert(cert: ActorCert, fleet: Ed25519PublicKey) -> None:
    """Raise :class:`CertError` (``uncertified``) unless the fleet key signed ``cert``."""
    fleet_id = key_id(fleet)
    if cert.issuer != fleet_id:
        raise CertError("uncertified", f"certificate of {cert.actor!r} issued by key {cert.issuer}, not {fleet_id}")
    try:
        fleet.verify(base64.b64decode(cert.sig, validate=True), cert.message())
    except (InvalidSignature, binascii.Error, ValueError):
        raise CertError("uncertified", f"certificate of {cert.actor!r} does not verify with key {fleet_id}") from None


def result_message(
    *, run: str, job: str, token: int, actor: str, version: int, version_hash: str, payload_sha256: str
) -> bytes:
    """What an actor signs for one result: everything the trainer checks a result against."""
    return RESULT_DOMAIN + canonical(
        {
            "actor": actor,
            "job": job,
            "payload_sha256": payload_sha256,
            "run": run,
            "token": token,
            "version": version,
            "version_hash": version_hash,
        }
    )


def sign_result(key: Ed25519PrivateKey, message: bytes) -> str:
    return base64.b64encode(key.sign(message)).decode("ascii")


def verify_result(key: Ed25519PublicKey, sig: Any, message: bytes) -> bool:
    """Whether ``sig`` (base64 text, hostile) is ``key``'s signature over ``message``."""
    if not (isinstance(sig, str) and len(sig) == SIG_CHARS and B64_SIG.fullmatch(sig)):
        return False
    try:
        key.verify(base64.b64decode(sig, validate=True), message)
    except (InvalidSignature, binascii.Error, ValueError):
        return False
    return True


MAX_REVOCATIONS_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Revocations:
    """Certificates the trainer no longer honours: by serial, or every certificate of an actor key."""

    serials: frozenset[int] = frozenset()
    keys: frozenset[str] = frozenset()

    def revokes(self, cert: ActorCert) -> bool:
        return cert.serial in self.serials or cert.key_id in self.keys


def parse_revocations(raw: bytes, what: str) -> Revocations:
    """The revocation list in ``raw`` (an operator's file); :class:`ValueError` naming the line of an
    entry that is neither ``serial:N`` nor ``key:ID`` (a list half understood must not be half applied)."""
    if len(raw) > MAX_REVOCATIONS_BYTES:
        raise ValueError(f"{what}: {len(raw)} bytes, over {MAX_REVOCATIONS_BYTES}")
    serials: set[int] = set()
    keys: set[str] = set()
    for n, line in enumerate(raw.decode("utf-8").splitlines(), 1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        kind, _, value = entry.partition(":")
        value = value.strip()
        if kind.strip() == "serial" and value.isascii() and value.isdigit() and int(value) <= MAX_SERIAL:
            serials.add(int(value))
        elif kind.strip() == "key" and KEY_ID.fullmatch(value):
            keys.add(value)
        else:
            raise ValueError(f"{what}, line {n}: {entry[:80]!r} is neither serial:N nor key:<16 hex digits>")
    return Revocations(frozenset(serials), frozenset(keys))
