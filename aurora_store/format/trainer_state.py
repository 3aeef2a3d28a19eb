"""The commit document of a saved trainer state (``trainer/state-NNNNNNNNNN/state.json``).

A trainer state is the FP32 masters, the optimizer's moments and the RNG states a trainer needs to
continue exactly where a committed version left off. Its objects are written first; ``state.json``
last, as a manifest commits a version. Format ``aurora-trainer-state/2`` binds the state to its
version and run and, in a signed run, is signed like a version:

- ``version`` and ``version_hash``: the committed version whose weights the state holds (a loader
  refuses a state whose hash is not that version's);
- ``origin``: the run's lineage (version 0's version hash, in version 0's state too; null only in a
  run of the legacy manifest format), so a state of another run is refused;
- ``tensors``: name, size and SHA-256 of the tensor file, so the document covers its bytes;
- ``trainer``: what the trainer keeps (optimizer step counts and hyper-parameters, RNG states, data
  position), opaque here;
- ``signature``: Ed25519 by the run's signing key over ``b"aurora-trainer-state/2\\0"`` followed by
  the SHA-256 of the canonical encoding of every other field (null in an unsigned run).

``aurora-trainer-state/1`` (written before the binding existed) is still read: it has no hash, no
run and no signature: a trainer trusts one only in a run with no state of the current format.
Pure JSON and bytes: no I/O, no torch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from aurora_store.errors import ChainError, CorruptError
from aurora_store.format import hostile_json, signing
from aurora_store.format.keys import MAX_VERSION
from aurora_store.format.manifest import Manifest, Signature, canonical
from aurora_store.format.manifest_parser import B64_SIG, HEX64, KEY_ID

FORMAT = "aurora-trainer-state/2"
LEGACY = "aurora-trainer-state/1"
MAX_DOC_BYTES = 1 << 20
"""A state document holds step counts, hyper-parameters and RNG states: kilobytes."""
DOMAIN = b"aurora-trainer-state/2\0"

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")


@dataclass(frozen=True, slots=True)
class TensorFile:
    """The state's tensor file, as the document names it."""

    name: str
    size: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size, "sha256": self.sha256}

    @staticmethod
    def of(name: str, data: bytes | memoryview) -> TensorFile:
        return TensorFile(name, len(data), hashlib.sha256(data).hexdigest())

    def check(self, data: bytes | memoryview, what: str) -> None:
        """Raise CorruptError unless ``data`` is the file this document names."""
        if len(data) != self.size or hashlib.sha256(data).hexdigest() != self.sha256:
            raise CorruptError(f"{what}: {self.name} is not the file its state.json names (size or SHA-256 differs)")


@dataclass(frozen=True, slots=True)
class StateDoc:
    """A parsed ``state.json``. ``version_hash``, ``origin`` and ``tensors`` are None only in the
    legacy format."""

    version: int
    trainer: dict[str, Any]
    version_hash: str | None = None
    origin: str | None = None
    tensors: TensorFile | None = None
    signature: Signature | None = None
    format: str = FORMAT

    @property
    def legacy(self) -> bool:
        return self.format == LEGACY

    def body(self) -> dict[str, Any]:
        """Every field the signature covers."""
        assert not self.legacy and self.tensors is not None, "only the current format is written"
        return {
            "format": self.format,
            "version": self.version,
            "version_hash": self.version_hash,
            "origin": self.origin,
            "tensors": self.tensors.to_dict(),
            "trainer": self.trainer,
        }

    def digest(self) -> bytes:
        return hashlib.sha256(canonical(self.body())).digest()

    def to_bytes(self) -> bytes:
        return canonical({**self.body(), "signature": None if self.signature is None else self.signature.to_dict()})


def new(
    version: int,
    version_hash: str,
    origin: str | None,
    tensors: TensorFile,
    trainer: dict[str, Any],
    key: Ed25519PrivateKey | None,
) -> StateDoc:
    """The document committing the state of committed version ``version`` of the run whose origin
    (version 0's hash; None in a legacy aurora/1 run) is ``origin``, signed when ``key`` is given.
    ``trainer`` must be JSON with finite numbers only."""
    doc = StateDoc(version, trainer, version_hash, origin, tensors)
    doc.to_bytes()  # refuses NaN and what JSON cannot hold before anything is written
    return doc if key is None else dataclasses.replace(doc, signature=signing.sign_message(DOMAIN, doc.digest(), key))


def parse(data: bytes, *, expect_version: int, what: str) -> StateDoc:
    """``state.json`` bytes another process wrote, checked field by field (CorruptError if not)."""
    if len(data) > MAX_DOC_BYTES:
        raise CorruptError(f"{what}: {len(data)} bytes, more than a trainer state document's {MAX_DOC_BYTES}")
    try:
        doc = hostile_json.loads(data)
    except ValueError as exc:
        raise CorruptError(f"{what}: not JSON ({exc})"[:300]) from None
    if not isinstance(doc, dict):
        raise CorruptError(f"{what}: not a JSON object")
    fmt = doc.get("format")
    if fmt == LEGACY:
        return _legacy(doc, expect_version, what)
    if fmt != FORMAT:
        raise CorruptError(f"{what}: format {str(fmt)[:40]!r}, expected {FORMAT!r} or {LEGACY!r}")
    fields = {"format", "version", "version_hash", "origin", "tensors", "trainer", "signature"}
    if set(doc) != fields:
        raise CorruptError(f"{what}: fields {sorted(doc)[:12]}, expected {sorted(fields)}")
    version = _version(doc["version"], expect_version, what)
    version_hash = _text(doc["version_hash"], HEX64, "version_hash", what)
    origin = None if doc["origin"] is None else _text(doc["origin"], HEX64, "origin", what)
    t = doc["tensors"]
    if not isinstance(t, dict) or set(t) != {"name", "size", "sha256"}:
        raise CorruptError(f"{what}: tensors must be {{name, size, sha256}}")
    size = t["size"]
    if type(size) is not int or not 0 <= size < 1 << 50:
        raise CorruptError(f"{what}: tensors.size must be a byte count")
    tensors = TensorFile(
        _text(t["name"], _NAME, "tensors.name", what), size, _text(t["sha256"], HEX64, "tensors.sha256", what)
    )
    if not isinstance(doc["trainer"], dict):
        raise CorruptError(f"{what}: trainer must be an object")
    signature = None
    if doc["signature"] is not None:
        s = doc["signature"]
        if not isinstance(s, dict) or set(s) != {"alg", "key_id", "sig"}:
            raise CorruptError(f"{what}: signature must be {{alg, key_id, sig}}")
        signature = Signature(
            _text(s["alg"], re.compile("ed25519"), "signature.alg", what),
            _text(s["key_id"], KEY_ID, "signature.key_id", what),
            _text(s["sig"], B64_SIG, "signature.sig", what),
        )
    return StateDoc(version, doc["trainer"], version_hash, origin, tensors, signature)


def check(doc: StateDoc, version: Manifest, key: Ed25519PublicKey | None, what: str) -> None:
    """Raise unless ``doc`` is the state of committed ``version`` of this run: bound by its hash and
    run (ChainError) and, when ``key`` is given, signed by it (UnauthenticatedError). A legacy
    document has nothing to check; whether to trust one is the caller's decision."""
    if doc.legacy:
        return
    if doc.version_hash != version.version_hash:
        raise ChainError(
            f"{what}: belongs to version hash {doc.version_hash}, version {version.version} is {version.version_hash}"
        )
    lineage = version.lineage
    origin = lineage.origin if lineage is not None else None
    if doc.origin != origin:
        raise ChainError(f"{what}: belongs to run {doc.origin}, this run is {origin}")
    if key is not None:
        signing.verify_message(DOMAIN, doc.digest(), doc.signature, key, what)


def _legacy(doc: dict[str, Any], expect_version: int, what: str) -> StateDoc:
    version = _version(doc.get("version"), expect_version, what)
    body = {k: v for k, v in doc.items() if k not in ("format", "version")}
    return StateDoc(version, body, format=LEGACY)


def _version(v: Any, expect: int, what: str) -> int:
    if type(v) is not int or not 0 <= v <= MAX_VERSION or v != expect:
        raise CorruptError(f"{what}: is not the trainer state of version {expect}")
    return v


def _text(v: Any, pattern: re.Pattern[str], name: str, what: str) -> str:
    if not isinstance(v, str) or not pattern.fullmatch(v):
        raise CorruptError(f"{what}: {name} is malformed")
    return v
