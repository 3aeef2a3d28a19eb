"""Version manifests: frozen dataclasses, canonical JSON, and a hostile-input parser.

A manifest is one canonical JSON object (sorted keys, no whitespace, ASCII, integers
only: no floats). ``version_hash`` is the SHA-256 of the canonical encoding of every
other field except ``signature``; ``parent`` carries the parent's version hash, so
the hashes chain. The parser treats every byte as hostile: size cap first, then
strict types, then coverage and ranges, then the hash. No I/O and no torch here.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from aurora_store import dtypes
from aurora_store.errors import CorruptError

FORMAT = "aurora/1"
MAX_ELEMENTS = 1 << 48
_KEY_RE = re.compile(r"[A-Za-z0-9._\-]+(/[A-Za-z0-9._\-]+)*")
HEX64 = re.compile(r"[0-9a-f]{64}")
HEX32 = re.compile(r"[0-9a-f]{32}")
KEY_ID = re.compile(r"[0-9a-f]{16}")
B64_SIG = re.compile(r"[A-Za-z0-9+/]{86}==")
MAX_VERSION = 10**10 - 1
"""Versions are ten-digit directory names."""


def canonical(obj: Any) -> bytes:
    """The one byte encoding that hashes and signatures cover."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def version_dir(version: int) -> str:
    return f"versions/{version:010d}"


def manifest_key(version: int) -> str:
    return f"{version_dir(version)}/manifest.json"


FILES_DIR = "files"
_FILE_NAME = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9._\-]{0,254}")


def check_file_name(name: str, what: str) -> str:
    """An attachment name: a plain file name such as ``tokenizer_config.json``."""
    if not isinstance(name, str) or not _FILE_NAME.fullmatch(name):
        raise CorruptError(
            f"{what}: attachment name {name!r} must be a plain file name of [A-Za-z0-9._-] (not starting with '.')"[
                :300
            ]
        )
    return name


def check_key(key: str, version: int, what: str) -> str:
    """A key named by a manifest must be a plain relative path inside its version's directory."""
    prefix = version_dir(version) + "/"
    if (
        not isinstance(key, str)
        or len(key) > 512
        or not _KEY_RE.fullmatch(key)
        or any(part in (".", "..") for part in key.split("/"))
        or not key.startswith(prefix)
    ):
        raise CorruptError(f"{what}: key {key!r} escapes the run prefix (must be a plain path under {prefix!r})")
    return key


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def width(self) -> int:
        return dtypes.dtype(self.dtype).width

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True, slots=True)
class Block:
    """A range ``[start, stop)`` of one tensor's elements, coded inside a segment."""

    tensor: int
    start: int
    stop: int
    codec: str
    offset: int
    length: int
    count: int
    gap_width: int = 0
    escapes: int = 0
    split: int = 0
    streams: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "tensor": self.tensor,
            "start": self.start,
            "stop": self.stop,
            "codec": self.codec,
            "offset": self.offset,
            "length": self.length,
            "count": self.count,
        }
        if self.codec == "sparse":
            d.update(gap_width=self.gap_width, escapes=self.escapes, split=self.split, streams=list(self.streams))
        return d


@dataclass(frozen=True, slots=True)
class Segment:
    """One immutable object of a version: a delta segment or a safetensors shard."""

    key: str
    size: int
    sha256: str
    blocks: tuple[Block, ...] = ()
    tensors: tuple[int, ...] = ()

    def to_dict(self, kind: str) -> dict[str, Any]:
        d: dict[str, Any] = {"key": self.key, "size": self.size, "sha256": self.sha256}
        if kind == "delta":
            d["blocks"] = [b.to_dict() for b in self.blocks]
        else:
            d["tensors"] = list(self.tensors)
        return d


@dataclass(frozen=True, slots=True)
class Parent:
    version: int
    version_hash: str


@dataclass(frozen=True, slots=True)
class Stats:
    elements: int
    changed: int
    bytes: int
    chain_bytes: int
    full_bytes: int

    def to_dict(self) -> dict[str, int]:
        return {
            "elements": self.elements,
            "changed": self.changed,
            "bytes": self.bytes,
            "chain_bytes": self.chain_bytes,
            "full_bytes": self.full_bytes,
        }


@dataclass(frozen=True, slots=True)
class Signature:
    alg: str
    key_id: str
    sig: str

    def to_dict(self) -> dict[str, str]:
        return {"alg": self.alg, "key_id": self.key_id, "sig": self.sig}


@dataclass(frozen=True, slots=True)
class Manifest:
    version: int
    kind: str
    parent: Parent | None
    created: str
    step: int | None
    tensors: tuple[TensorSpec, ...]
    segments: tuple[Segment, ...]
    index: Segment | None
    stats: Stats
    weights_digest: str
    meta: dict[str, str] = field(default_factory=dict)
    files: tuple[Segment, ...] = ()
    """The run's attached files (config, tokenizer) at publish time, so the signature covers them."""
    version_hash: str = ""
    signature: Signature | None = None

    def body(self) -> dict[str, Any]:
        """Every field the version hash covers."""
        return {
            "format": FORMAT,
            "version": self.version,
            "kind": self.kind,
            "parent": None
            if self.parent is None
            else {"version": self.parent.version, "version_hash": self.parent.version_hash},
            "created": self.created,
            "step": self.step,
            "tensors": [t.to_dict() for t in self.tensors],
            "segments": [s.to_dict(self.kind) for s in self.segments],
            "index": None if self.index is None else self.index.to_dict("full"),
            "stats": self.stats.to_dict(),
            "weights_digest": self.weights_digest,
            "meta": dict(self.meta),
            "files": [f.to_dict("full") | {"tensors": []} for f in self.files],
        }

    def compute_hash(self) -> str:
        return hashlib.sha256(canonical(self.body())).hexdigest()

    def to_bytes(self) -> bytes:
        doc = self.body()
        doc["version_hash"] = self.version_hash
        doc["signature"] = None if self.signature is None else self.signature.to_dict()
        return canonical(doc)

    @property
    def objects(self) -> tuple[Segment, ...]:
        """Every object the manifest names (segments, then the index of a full version)."""
        return self.segments + ((self.index,) if self.index is not None else ())

    @staticmethod
    def from_bytes(
        data: bytes,
        *,
        expect_version: int | None = None,
        max_bytes: int = 64 << 20,
        max_segment_bytes: int = 4 << 30,
        what: str | None = None,
    ) -> Manifest:
        """Parse untrusted manifest bytes; ``what`` (the object's URL) prefixes every error."""
        from aurora_store.manifest_parser import parse

        return parse(data, expect_version, max_bytes, max_segment_bytes, what)
