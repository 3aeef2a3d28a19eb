"""Ed25519 signatures over manifests.

The signed message is ``b"aurora-manifest/1\\0" + bytes.fromhex(version_hash)``; the
version hash covers every other field, so the signature covers the whole manifest
and, through the parent hash, the chain. A key rotation (format aurora/4) is signed twice:
``signature`` by the outgoing key as above, ``rotation_signature`` by the incoming key over
``b"aurora-rotation/1\\0" + bytes.fromhex(version_hash)``. Keys may be given as cryptography key
objects, raw 32-byte keys, PEM bytes or text, or PEM files.
"""

from __future__ import annotations

import base64
import dataclasses
import os

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from aurora_store.errors import StoreError, UnauthenticatedError, UnsupportedError
from aurora_store.format.manifest import Manifest, Rotation, Signature, raw_key_id
from aurora_store.localfile import read_regular

_DOMAIN = b"aurora-manifest/1\0"
_ROTATION_DOMAIN = b"aurora-rotation/1\0"
SigningKeyLike = Ed25519PrivateKey | bytes | str | os.PathLike[str]
VerifyKeyLike = Ed25519PublicKey | Ed25519PrivateKey | bytes | str | os.PathLike[str]


def raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(key: Ed25519PublicKey) -> str:
    return raw_key_id(raw_public(key))


def public_b64(key: Ed25519PublicKey) -> str:
    """A public key as a manifest names it: base64 of its raw 32 bytes."""
    return base64.b64encode(raw_public(key)).decode()


def public_from_b64(text: str) -> Ed25519PublicKey:
    """The public key a (parsed) manifest names."""
    return Ed25519PublicKey.from_public_bytes(base64.b64decode(text, validate=True))


def same_key(a: Ed25519PublicKey, b: Ed25519PublicKey) -> bool:
    return raw_public(a) == raw_public(b)


def rotation(old: Ed25519PrivateKey, new: Ed25519PrivateKey) -> Rotation:
    """The rotation from ``old`` to ``new``, as a manifest names it."""
    return Rotation(
        key_id(new.public_key()), public_b64(new.public_key()), key_id(old.public_key()), public_b64(old.public_key())
    )


def _read(material: bytes | str | os.PathLike[str]) -> bytes:
    """Key bytes: given as bytes, as PEM text (what an ``AURORA_*`` environment variable may hold), or as a path."""
    if isinstance(material, bytes):
        return material
    if isinstance(material, str) and material.lstrip().startswith("-----BEGIN"):
        return material.encode()
    try:
        return read_regular(material, 1 << 16)  # a FIFO is refused, never waited on
    except OSError as exc:
        raise StoreError(f"cannot read key file {os.fspath(material)!r}: {exc.strerror or exc}") from None


def load_signing_key(key: SigningKeyLike) -> Ed25519PrivateKey:
    if isinstance(key, Ed25519PrivateKey):
        return key
    raw = _read(key)
    if len(raw) == 32:
        return Ed25519PrivateKey.from_private_bytes(raw)
    try:
        loaded = serialization.load_pem_private_key(raw, password=None)
    except (ValueError, TypeError) as exc:
        raise StoreError(f"signing key is neither 32 raw bytes nor an unencrypted PEM private key ({exc})") from None
    if not isinstance(loaded, Ed25519PrivateKey):
        raise UnsupportedError("signing key must be an Ed25519 private key")
    return loaded


def load_verify_key(key: VerifyKeyLike) -> Ed25519PublicKey:
    if isinstance(key, Ed25519PublicKey):
        return key
    if isinstance(key, Ed25519PrivateKey):
        return key.public_key()
    raw = _read(key)
    if len(raw) == 32:
        return Ed25519PublicKey.from_public_bytes(raw)
    try:
        loaded = serialization.load_pem_public_key(raw)
    except (ValueError, TypeError) as exc:
        raise StoreError(f"verify key is neither 32 raw bytes nor a PEM public key ({exc})") from None
    if not isinstance(loaded, Ed25519PublicKey):
        raise UnsupportedError("verify key must be an Ed25519 public key")
    return loaded


def generate_keypair() -> tuple[bytes, bytes]:
    """A new (private PEM, public PEM) pair, for ``aurora keygen`` and tests."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return private, public


def sign(version_hash: str, key: Ed25519PrivateKey) -> Signature:
    return sign_message(_DOMAIN, bytes.fromhex(version_hash), key)


def sign_message(domain: bytes, message: bytes, key: Ed25519PrivateKey) -> Signature:
    """A signature over ``domain + message`` (each kind of signed document has a domain of its own,
    so a signature over one kind is never valid for another)."""
    sig = key.sign(domain + message)
    return Signature("ed25519", key_id(key.public_key()), base64.b64encode(sig).decode())


def verify_message(domain: bytes, message: bytes, s: Signature | None, key: Ed25519PublicKey, what: str) -> None:
    """Raise UnauthenticatedError unless ``s`` is a valid signature by ``key`` over ``domain + message``."""
    if s is None:
        raise UnauthenticatedError(f"{what}: unsigned, but a verify key was given")
    if s.alg != "ed25519":
        raise UnauthenticatedError(f"{what}: signature algorithm {s.alg!r}, expected 'ed25519'")
    if s.key_id != key_id(key):
        raise UnauthenticatedError(f"{what}: signed by key {s.key_id}, expected {key_id(key)}")
    try:
        key.verify(base64.b64decode(s.sig, validate=True), domain + message)
    except (InvalidSignature, ValueError):
        raise UnauthenticatedError(f"{what}: signature does not verify with key {key_id(key)}") from None


def seal(m: Manifest, key: Ed25519PrivateKey | None, rotate_to: Ed25519PrivateKey | None = None) -> Manifest:
    """``m`` with its version hash set and, when a key is given, its signature; with ``rotate_to``
    (``m.rotation`` names it), its rotation signature by that key too."""
    m = dataclasses.replace(m, version_hash=m.compute_hash())
    if rotate_to is not None:
        assert key is not None and m.rotation is not None and m.rotation.key_id == key_id(rotate_to.public_key())
        rs = sign_message(_ROTATION_DOMAIN, bytes.fromhex(m.version_hash), rotate_to)
        m = dataclasses.replace(m, rotation_signature=rs)
    return m if key is None else dataclasses.replace(m, signature=sign(m.version_hash, key))


def verify(manifest: Manifest, key: Ed25519PublicKey, what: str) -> None:
    """Raise UnauthenticatedError unless ``manifest`` carries a valid signature by ``key``."""
    _verify(manifest.signature, _DOMAIN, manifest, key, what)


def verify_rotation(manifest: Manifest, what: str) -> tuple[Ed25519PublicKey, Ed25519PublicKey]:
    """Raise UnauthenticatedError unless rotation ``manifest`` is signed by both keys it names;
    returns them (outgoing, incoming). Whether either key is one to trust is the caller's to know."""
    r = manifest.rotation
    assert r is not None
    old, new = public_from_b64(r.previous_public_key), public_from_b64(r.public_key)
    _verify(manifest.signature, _DOMAIN, manifest, old, f"{what} (the outgoing key's signature)")
    _verify(manifest.rotation_signature, _ROTATION_DOMAIN, manifest, new, f"{what} (the incoming key's signature)")
    return old, new


def _verify(s: Signature | None, domain: bytes, manifest: Manifest, key: Ed25519PublicKey, what: str) -> None:
    if s is None:
        raise UnauthenticatedError(f"{what}: manifest is unsigned but a verify key was given")
    verify_message(domain, bytes.fromhex(manifest.version_hash), s, key, what)
