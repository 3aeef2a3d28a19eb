"""The manifest parser: every byte of a manifest is hostile until proven otherwise.

Order of checks: size cap, then JSON with no floats, NaNs or repeated fields, then
strict types and field sets, then ranges and coverage (blocks tile their segment,
ranges stay inside their tensor, shards hold every tensor once), then the hash.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import itertools
import json
import re
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from typing import Any

from aurora_store import codec
from aurora_store.errors import CorruptError, LimitError, StoreError
from aurora_store.format import dtypes
from aurora_store.format.keys import FILES_DIR, MAX_VERSION, check_file_name, check_object_key, manifest_key
from aurora_store.format.manifest import (
    CLASSED_FORMATS,
    FORMAT,
    FORMAT_V5,
    FORMAT_V6,
    FORMATS,
    LEGACY,
    ROTATING_FORMATS,
    Block,
    Manifest,
    Parent,
    Rollback,
    Rotation,
    RunLineage,
    Segment,
    Signature,
    Stats,
    TensorSpec,
    raw_key_id,
)

MAX_ELEMENTS = 1 << 48
HEX64 = re.compile(r"[0-9a-f]{64}")
HEX32 = re.compile(r"[0-9a-f]{32}")
KEY_ID = re.compile(r"[0-9a-f]{16}")
B64_SIG = re.compile(r"[A-Za-z0-9+/]{86}==")
B64_KEY = re.compile(r"[A-Za-z0-9+/]{43}=")
"""An Ed25519 public key: base64 of its raw 32 bytes."""
ROTATION_FIELDS = frozenset({"rotation", "rotation_signature"})
"""Optional top-level fields of format aurora/4 (together or not at all)."""
_COMMON = frozenset({"tensor", "start", "stop", "codec", "offset", "length"})


class _Reader:
    """Typed accessors over an untrusted JSON object, naming the manifest in errors."""

    def __init__(self, what: str) -> None:
        self.what = what

    def fail(self, msg: str) -> CorruptError:
        return CorruptError(f"{self.what}: {msg}")

    def obj(
        self, v: Any, name: str, keys: AbstractSet[str], optional: AbstractSet[str] = frozenset()
    ) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise self.fail(f"{name} must be an object")
        missing = keys - v.keys()
        extra = v.keys() - keys - optional
        if missing or extra:
            raise self.fail(f"{name} has missing fields {sorted(missing)} / unknown fields {sorted(extra)}")
        return v

    def int_(self, v: Any, name: str, lo: int = 0, hi: int = 1 << 62) -> int:
        if type(v) is not int or not lo <= v <= hi:
            raise self.fail(f"{name} must be an integer in [{lo}, {hi}], got {v!r}"[:300])
        return v

    def str_(self, v: Any, name: str, pattern: re.Pattern[str] | None = None, max_len: int = 4096) -> str:
        if not isinstance(v, str) or len(v) > max_len or (pattern is not None and not pattern.fullmatch(v)):
            raise self.fail(
                f"{name} must be a string{' matching ' + pattern.pattern if pattern else ''}, got {v!r}"[:300]
            )
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise self.fail(f"{name} is not valid Unicode") from None
        return v

    def list_(self, v: Any, name: str) -> list[Any]:
        if not isinstance(v, list):
            raise self.fail(f"{name} must be a list")
        return v


# ---------------------------------------------------------------- the fields a publisher chooses
#
# One rule for each, used by the parser (on a manifest's bytes: CorruptError) and by the
# publisher (on its caller's arguments, before the first byte is written: StoreError), so a
# publisher can never commit a manifest its own readers refuse.

MAX_META_ENTRIES = 1024
MAX_META_KEY = 256
MAX_META_VALUE = 16384
MAX_NAME = 1024
RESERVED_NAMES = frozenset({"__metadata__"})
"""Tensor names a safetensors file keeps for itself."""
Fail = Callable[[str], Exception]


def _unicode(v: str, name: str, fail: Fail) -> str:
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise fail(f"{name} is not valid Unicode (a lone surrogate)") from None
    return v


def check_step(step: Any, fail: Fail) -> int | None:
    """A version's training step: None, or an integer in [0, 2**62]."""
    if step is not None and (type(step) is not int or not 0 <= step <= 1 << 62):
        raise fail(f"step must be None or an integer in [0, {1 << 62}], got {step!r}"[:300])
    return step


def check_meta(meta: Any, fail: Fail) -> dict[str, str]:
    """A version's free-form metadata: at most 1024 string keys (256 characters) to string values (16384)."""
    if not isinstance(meta, dict):
        raise fail(f"meta must map strings to strings, got {type(meta).__name__}")
    if len(meta) > MAX_META_ENTRIES:
        raise fail(f"meta has {len(meta)} entries, over the cap of {MAX_META_ENTRIES}")
    for k, v in meta.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise fail(f"meta must map strings to strings, got {k!r}: {v!r}"[:300])
        if not k or len(k) > MAX_META_KEY or len(v) > MAX_META_VALUE:
            raise fail(f"meta {k[:40]!r}: keys are 1-{MAX_META_KEY} characters, values at most {MAX_META_VALUE}")
        _unicode(k, f"meta key {k[:40]!r}", fail)
        _unicode(v, f"meta {k[:40]!r}", fail)
    return dict(meta)


def check_tensor_name(name: Any, fail: Fail) -> str:
    """A tensor's name: a non-empty Unicode string of at most 1024 characters, not one safetensors reserves."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME:
        raise fail(f"a tensor name must be a non-empty string of at most {MAX_NAME} characters, got {name!r}"[:300])
    if name in RESERVED_NAMES:
        raise fail(f"{name!r} cannot name a tensor: safetensors files reserve it")
    return _unicode(name, f"tensor name {name[:40]!r}", fail)


def _no_floats(text: str) -> Any:
    raise CorruptError(f"manifest contains a non-integer number {text!r}")


def _no_dupes(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise CorruptError(f"manifest repeats field {k!r}")
        out[k] = v
    return out


def parse_manifest(
    data: bytes,
    *,
    expect_version: int | None = None,
    max_bytes: int = 16 << 20,
    max_segment_bytes: int = 4 << 30,
    what: str | None = None,
) -> Manifest:
    """Parse untrusted manifest bytes; ``what`` (the object's URL) prefixes every error."""
    if what is None:
        what = "manifest" if expect_version is None else manifest_key(expect_version)
    if len(data) > max_bytes:
        raise LimitError(f"{what}: {len(data)} bytes exceeds the manifest cap of {max_bytes}")
    try:
        doc = json.loads(
            data.decode("utf-8"),
            parse_float=_no_floats,
            parse_constant=_no_floats,
            object_pairs_hook=_no_dupes,
        )
    except StoreError as exc:
        raise CorruptError(f"{what}: {exc}") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CorruptError(f"{what}: not valid JSON ({exc})"[:400]) from None
    r = _Reader(what)
    top = {
        "files",
        "format",
        "version",
        "kind",
        "parent",
        "created",
        "step",
        "tensors",
        "segments",
        "index",
        "stats",
        "weights_digest",
        "meta",
        "version_hash",
        "signature",
    }
    if not isinstance(doc, dict):
        raise r.fail("manifest must be an object")
    fmt = doc.get("format")
    if fmt not in FORMATS:
        raise r.fail(f"format {fmt!r}, expected one of {FORMATS}"[:300])
    r.obj(
        doc,
        "manifest",
        top if fmt == LEGACY else top | {"run"},
        ROTATION_FIELDS | {"rolls_back_to"} if fmt in ROTATING_FORMATS else frozenset(),
    )
    version = r.int_(doc["version"], "version", 0, MAX_VERSION)
    if expect_version is not None and version != expect_version:
        raise r.fail(f"declares version {version}, expected {expect_version}")
    kind = doc["kind"]
    if kind not in ("full", "delta"):
        raise r.fail(f"kind {kind!r}, expected 'full' or 'delta'")
    if version == 0 and kind != "full":
        raise r.fail("version 0 must be full")
    parent = None
    if doc["parent"] is None:
        if version != 0:
            raise r.fail("only version 0 may have no parent")
    else:
        p = r.obj(doc["parent"], "parent", {"version", "version_hash"})
        parent = Parent(
            r.int_(p["version"], "parent.version", 0, MAX_VERSION),
            r.str_(p["version_hash"], "parent.version_hash", HEX64),
        )
        if parent.version != version - 1:
            raise r.fail(f"parent is version {parent.version}, expected {version - 1}")
    created = r.str_(doc["created"], "created", max_len=64)
    step = check_step(doc["step"], r.fail)
    tensors = _parse_tensors(r, doc["tensors"])
    segments = tuple(
        _parse_segment(r, s, i, kind, version, tensors, max_segment_bytes, fmt)
        for i, s in enumerate(r.list_(doc["segments"], "segments"))
    )
    index = None
    if kind == "full":
        if doc["index"] is None:
            raise r.fail("a full version must name its safetensors index")
        ix = r.obj(doc["index"], "index", {"key", "size", "sha256", "tensors"})
        if ix["tensors"] != []:
            raise r.fail("index.tensors must be an empty list")
        index = Segment(
            check_object_key(ix["key"], version, what),
            r.int_(ix["size"], "index.size", 0, max_segment_bytes),
            r.str_(ix["sha256"], "index.sha256", HEX64),
        )
        _check_shard_coverage(r, segments, tensors)
    elif doc["index"] is not None:
        raise r.fail("a delta version has no index")
    else:
        _check_block_coverage(r, segments, tensors)
    keys = [s.key for s in segments] + ([index.key] if index else [])
    if len(set(keys)) != len(keys) or manifest_key(version) in keys:
        raise r.fail("names an object twice (or names the manifest itself)")
    stats = _parse_stats(r, doc["stats"], fmt, kind, version)
    if stats.elements != sum(t.numel for t in tensors):
        raise r.fail(f"stats.elements {stats.elements} does not match the tensor table")
    digest = r.str_(doc["weights_digest"], "weights_digest", HEX32)
    meta = check_meta(doc["meta"], r.fail)
    files = tuple(_parse_file(r, f, i, max_segment_bytes) for i, f in enumerate(r.list_(doc["files"], "files")))
    if [f.key for f in files] != sorted({f.key for f in files}):
        raise r.fail("files must be unique and sorted by key")
    signature = None if doc["signature"] is None else _parse_signature(r, doc["signature"], "signature")
    run = None if fmt == LEGACY else _parse_run(r, doc["run"], version)
    rotation, rotation_signature = None, None
    if ROTATION_FIELDS & doc.keys():
        rotation, rotation_signature = _parse_rotation(r, doc, version, run)
    rollback = _parse_rollback(r, doc["rolls_back_to"], parent) if "rolls_back_to" in doc else None
    m = Manifest(
        version,
        kind,
        parent,
        created,
        step,
        tensors,
        segments,
        index,
        stats,
        digest,
        dict(meta),
        files,
        r.str_(doc["version_hash"], "version_hash", HEX64),
        signature,
        run,
        fmt,
        rotation=rotation,
        rotation_signature=rotation_signature,
        rolls_back_to=rollback,
    )
    if m.compute_hash() != m.version_hash:
        raise r.fail(f"version_hash {m.version_hash} does not match its contents ({m.compute_hash()})")
    return m


def _parse_stats(r: _Reader, raw: Any, fmt: str, kind: str, version: int) -> Stats:
    """``stats``; in aurora/5 also ``counted``, only ever false, only in a full version with a parent,
    whose ``changed`` is then ``elements`` (one spelling per meaning: the hash covers the bytes)."""
    names = ("elements", "changed", "bytes", "chain_bytes", "full_bytes")
    st = r.obj(raw, "stats", set(names), {"counted"} if fmt == FORMAT_V5 else frozenset())
    elements, changed, nbytes, chain, full = (r.int_(st[k], f"stats.{k}") for k in names)
    stats = Stats(elements, changed, nbytes, chain, full)
    if "counted" not in st:
        return stats
    if st["counted"] is not False:
        raise r.fail("stats.counted may only be false (a counted version omits it)")
    if kind != "full" or version == 0:
        raise r.fail("stats.counted is false only in a full version with a parent")
    if stats.changed != stats.elements:
        raise r.fail(f"stats.changed must be stats.elements ({stats.elements}) when stats.counted is false")
    return dataclasses.replace(stats, counted=False)


def _parse_rollback(r: _Reader, raw: Any, parent: Parent | None) -> Rollback:
    """A rollback (aurora/4): present only when there is one (never null: the hash would not cover it)."""
    d = r.obj(raw, "rolls_back_to", {"version", "version_hash", "abandons"})
    if parent is None:
        raise r.fail("version 0 rolls back to nothing")
    to = r.int_(d["version"], "rolls_back_to.version", 0, parent.version - 1) if parent.version > 0 else None
    if to is None:
        raise r.fail("rolls_back_to names a version before its parent, and the parent is version 0")
    rollback = Rollback.of(to, r.str_(d["version_hash"], "rolls_back_to.version_hash", HEX64), parent.version)
    if d["abandons"] != list(rollback.abandons):
        raise r.fail(f"rolls_back_to.abandons must be versions {to + 1}..{parent.version}, every one, ascending"[:300])
    return rollback


def _parse_signature(r: _Reader, raw: Any, name: str) -> Signature:
    s = r.obj(raw, name, {"alg", "key_id", "sig"})
    return Signature(
        r.str_(s["alg"], f"{name}.alg", re.compile("ed25519")),
        r.str_(s["key_id"], f"{name}.key_id", KEY_ID),
        r.str_(s["sig"], f"{name}.sig", B64_SIG),
    )


def _parse_public_key(r: _Reader, raw: Any, name: str, key_id: str) -> str:
    """A base64 raw Ed25519 public key whose id is ``key_id``."""
    text = r.str_(raw, name, B64_KEY)
    try:
        key = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise r.fail(f"{name} is not valid base64") from None
    if len(key) != 32:
        raise r.fail(f"{name} holds {len(key)} bytes, an Ed25519 public key 32")
    if raw_key_id(key) != key_id:
        raise r.fail(f"{name} has key id {raw_key_id(key)}, the manifest names it {key_id}")
    return text


def _parse_rotation(
    r: _Reader, doc: dict[str, Any], version: int, run: RunLineage | None
) -> tuple[Rotation, Signature | None]:
    """A key rotation (aurora/4): both keys named and bound to their ids, the run's signer the new key."""
    if not doc.keys() >= ROTATION_FIELDS:
        raise r.fail("rotation and rotation_signature go together")
    if version == 0:
        raise r.fail("version 0 starts its run's signing: it cannot rotate a key")
    d = r.obj(doc["rotation"], "rotation", {"key_id", "public_key", "previous", "previous_public_key"})
    key_id = r.str_(d["key_id"], "rotation.key_id", KEY_ID)
    previous = r.str_(d["previous"], "rotation.previous", KEY_ID)
    rotation = Rotation(
        key_id,
        _parse_public_key(r, d["public_key"], "rotation.public_key", key_id),
        previous,
        _parse_public_key(r, d["previous_public_key"], "rotation.previous_public_key", previous),
    )
    if key_id == previous:
        raise r.fail(f"rotation.key_id {key_id} is the key it rotates from")
    if run is None or run.signed_by != key_id:
        raise r.fail(f"a rotation to key {key_id} must carry run.signed_by {key_id}")
    raw_sig = doc["rotation_signature"]  # who signed what is the readers' to check (UnauthenticatedError)
    return rotation, None if raw_sig is None else _parse_signature(r, raw_sig, "rotation_signature")


def _parse_run(r: _Reader, raw: Any, version: int) -> RunLineage:
    d = r.obj(raw, "run", {"origin", "signed_by"})
    if version == 0:
        if d["origin"] is not None:
            raise r.fail("version 0 is its run's origin: run.origin must be null")
        origin = None
    else:
        origin = r.str_(d["origin"], "run.origin", HEX64)
    signed_by = None if d["signed_by"] is None else r.str_(d["signed_by"], "run.signed_by", KEY_ID)
    return RunLineage(origin, signed_by)


def _parse_tensors(r: _Reader, raw: Any) -> tuple[TensorSpec, ...]:
    out = []
    for i, t in enumerate(r.list_(raw, "tensors")):
        t = r.obj(t, f"tensors[{i}]", {"name", "dtype", "shape"})
        where = f"tensors[{i}]"

        def fail(msg: str, where: str = where) -> Exception:
            return r.fail(f"{where}: {msg}")

        name = check_tensor_name(t["name"], fail)
        try:
            dtypes.dtype(t["dtype"])
        except StoreError as exc:
            raise r.fail(f"tensors[{i}]: {exc}") from None
        shape = tuple(
            r.int_(s, f"tensors[{i}].shape", 0, MAX_ELEMENTS) for s in r.list_(t["shape"], f"tensors[{i}].shape")
        )
        if len(shape) > 64:
            raise r.fail(f"tensors[{i}] has {len(shape)} dimensions")
        spec = TensorSpec(name, t["dtype"], shape)
        if spec.numel > MAX_ELEMENTS:
            raise LimitError(f"{r.what}: tensor {name!r} has {spec.numel} elements, over the cap")
        out.append(spec)
    names = [t.name for t in out]
    if names != sorted(set(names)):
        raise r.fail("tensor names must be unique and sorted")
    return tuple(out)


def _parse_segment(
    r: _Reader,
    raw: Any,
    i: int,
    kind: str,
    version: int,
    tensors: tuple[TensorSpec, ...],
    max_segment_bytes: int,
    fmt: str,
) -> Segment:
    name = f"segments[{i}]"
    s = r.obj(raw, name, {"key", "size", "sha256", "blocks" if kind == "delta" else "tensors"})
    key = check_object_key(s["key"], version, r.what)
    size = s["size"]
    if type(size) is int and size > max_segment_bytes:
        raise LimitError(f"{r.what}: {name} {key} is {size} bytes, over the segment cap of {max_segment_bytes}")
    size = r.int_(size, f"{name}.size")
    sha = r.str_(s["sha256"], f"{name}.sha256", HEX64)
    if kind == "full":
        idx = tuple(r.int_(t, f"{name}.tensors", 0, len(tensors) - 1) for t in r.list_(s["tensors"], f"{name}.tensors"))
        return Segment(key, size, sha, tensors=idx)
    blocks = []
    offset = 0
    for j, b in enumerate(r.list_(s["blocks"], f"{name}.blocks")):
        bn = f"{name}.blocks[{j}]"
        if not isinstance(b, dict):
            raise r.fail(f"{bn} must be an object")
        name_ = b.get("codec")
        c = codec.get(name_)
        if c is None:
            raise r.fail(f"{bn}: codec {name_!r}, expected one of {codec.names()}"[:300])
        if c.name == "classed" and fmt not in CLASSED_FORMATS:
            raise r.fail(f"{bn}: the classed codec needs format {FORMAT} or later, the manifest is {fmt}")
        b = r.obj(b, bn, _COMMON | c.fields)
        t = r.int_(b["tensor"], f"{bn}.tensor", 0, len(tensors) - 1)
        spec = tensors[t]
        start = r.int_(b["start"], f"{bn}.start", 0, spec.numel)
        stop = r.int_(b["stop"], f"{bn}.stop", start + 1 if spec.numel else 0, spec.numel)
        if stop <= start:
            raise r.fail(f"{bn} covers no elements of {spec.name!r}")
        off = r.int_(b["offset"], f"{bn}.offset")
        length = r.int_(b["length"], f"{bn}.length", 1, size)
        if off != offset:
            raise r.fail(f"{bn} starts at byte {off}, expected {offset} (blocks must tile the segment)")
        offset += length
        dt = dtypes.dtype(spec.dtype)
        if c.sparse_only and not dt.sparse:
            raise r.fail(f"{bn}: {c.name} coding is not allowed for dtype {spec.dtype}")
        if c.sparse_only and dt.narrow and fmt != FORMAT_V6:
            raise r.fail(f"{bn}: {c.name} coding of dtype {spec.dtype} needs format {FORMAT_V6}, the manifest is {fmt}")
        header = c.parse_header(b, length=length, span=dt.span(stop - start), what=f"{r.what}: {bn}")
        blocks.append(Block(t, start, stop, c.name, off, length, header))
    if offset != size:
        raise r.fail(f"{name} {key}: blocks cover {offset} bytes of {size}")
    return Segment(key, size, sha, blocks=tuple(blocks))


def _check_shard_coverage(r: _Reader, segments: tuple[Segment, ...], tensors: tuple[TensorSpec, ...]) -> None:
    seen = sorted(t for s in segments for t in s.tensors)
    if seen != list(range(len(tensors))):
        raise r.fail("shards must hold every tensor exactly once")


def _check_block_coverage(r: _Reader, segments: tuple[Segment, ...], tensors: tuple[TensorSpec, ...]) -> None:
    ranges = sorted((b.tensor, b.start, b.stop) for s in segments for b in s.blocks)
    for (t0, _, e0), (t1, s1, _) in itertools.pairwise(ranges):
        if t0 == t1 and s1 < e0:
            raise r.fail(f"blocks of tensor {tensors[t0].name!r} overlap at element {s1}")


def _parse_file(r: _Reader, raw: Any, i: int, max_bytes: int) -> Segment:
    f = r.obj(raw, f"files[{i}]", {"key", "size", "sha256", "tensors"})
    key = r.str_(f["key"], f"files[{i}].key", max_len=512)
    prefix, _, name = key.partition("/")
    if prefix != FILES_DIR:
        raise CorruptError(f"{r.what}: files[{i}] key {key!r} escapes the run prefix (must be {FILES_DIR}/<name>)")
    check_file_name(name, r.what)
    if f["tensors"] != []:
        raise r.fail(f"files[{i}].tensors must be an empty list")
    return Segment(
        key, r.int_(f["size"], f"files[{i}].size", 0, max_bytes), r.str_(f["sha256"], f"files[{i}].sha256", HEX64)
    )
