"""The targets of ``aurora bench fuzz`` that parse a bucket's bytes, and the registry of all targets.
Seed inputs come from :mod:`bench.fuzz.seeds` (the project's own writers), mutants from
:mod:`bench.fuzz.mutate`, and the Redis and attachment targets from :mod:`bench.fuzz.roles`.

- ``manifest``: ``parse_manifest``, then a reader's run-lineage and signature checks, on the manifests
  of runs published here (signed and unsigned, full and delta) and of the golden ``aurora/1`` run.
- ``segment``: ``decode_block`` (then ``apply_blocks``) on delta segments as an attacker who may rewrite
  an unsigned run's manifest sees them (segment hashes are not checked): block bytes, the zstd streams
  inside blocks (re-framed, the manifest fixed up and re-hashed) and block headers mutated.
- ``safetensors``: ``read_shard``, ``check_index`` and the safetensors header parser on full versions' objects.
- ``redis_events``, ``redis_results``, ``redis_docs``, ``attachments``: see :mod:`bench.fuzz.roles`.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from aurora_store.format.manifest import canonical
from bench.fuzz.mutate import mutate_bytes, mutate_json
from bench.fuzz.roles import attachments, redis_docs, redis_events, redis_results
from bench.fuzz.seeds import WIDTH, Published, published, rehash
from bench.fuzz.target import Target, hexed

# ---------------------------------------------------------------- manifest

ManifestCase = tuple[Published, bytes, int | None]


def manifest(seed: int) -> Target[ManifestCase]:
    from aurora_store.bucket.keychain import check_member, lineage_of
    from aurora_store.format.manifest_parser import parse_manifest
    from aurora_store.format.signing import verify

    pubs = published(seed)
    others = [p.raw for p in pubs]

    def mutate(rng: random.Random, case: ManifestCase) -> ManifestCase:
        p, data, v = case
        if rng.random() < 0.05:
            v = rng.choice((None, p.version + 1, max(p.version - 1, 0), 10**10))
        if rng.random() < 0.6:
            return p, mutate_json(rng, data, fix=lambda r, d: rehash(r, d, p.key)), v
        return p, mutate_bytes(rng, data, others=others), v

    def execute(case: ManifestCase) -> None:
        p, data, v = case
        m = parse_manifest(data, expect_version=v)
        if m.version > 0:
            check_member(m, lineage_of(p.origin), p.origin.format)
        if m.signature is not None and p.verify is not None:
            verify(m, p.verify, "fuzz")

    def show(case: ManifestCase) -> str:
        return f"expect_version {case[2]}: {hexed(case[1])}"

    names = ("format.manifest_parser.parse_manifest", "bucket.reader.check_member", "format.signing.verify")
    return Target("manifest", [(p, p.raw, p.version) for p in pubs], mutate, execute, show, names)


# ---------------------------------------------------------------- segment


@dataclass(frozen=True, slots=True)
class SegCase:
    pub: Published
    manifest: bytes | None
    """None: the published manifest."""
    seg: int
    block: int | None
    """The block to decode; None: every block of every segment, then apply them."""
    data: bytes


def _reframe(rng: random.Random, case: SegCase) -> SegCase:
    """Mutate the bytes inside one zstd stream of one block, re-frame them, and fix the manifest up to match."""
    import zstandard

    from aurora_store.codec import frames

    doc = json.loads(case.manifest or case.pub.raw)
    blocks = doc["segments"][case.seg]["blocks"]
    b_i = rng.randrange(len(blocks))
    b = blocks[b_i]
    start, old_len = b["offset"], b["length"]
    payload = case.data[start : start + old_len]
    lengths = list(b["streams"]) if b["codec"] == "sparse" else [old_len]
    j = rng.randrange(len(lengths))
    at = sum(lengths[:j])
    frame = payload[at : at + lengths[j]]
    raw = zstandard.ZstdDecompressor().decompress(frame) if frame else b""
    raw2 = mutate_bytes(rng, raw, keep_length=rng.random() < 0.7)
    if len(raw2) != len(raw) and b["codec"] == "sparse" and j in (0, 3) and rng.random() < 0.7:
        width = WIDTH.get(doc["tensors"][b["tensor"]]["dtype"], 8)  # so the frame's size is the one expected
        b["count" if j == 0 else "escapes"] = max(j == 0, len(raw2) // (b["gap_width"] if j == 0 else width))
    frame2 = frames.compress(raw2)
    lengths[j] = len(frame2)
    payload2 = payload[:at] + frame2 + payload[at + len(frame) :]
    if b["codec"] == "sparse":
        b["streams"] = lengths
    b["length"] = len(payload2)
    for later in blocks[b_i + 1 :]:
        later["offset"] += len(payload2) - old_len
    data = case.data[:start] + payload2 + case.data[start + old_len :]
    doc["segments"][case.seg] |= {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    rehash(rng, doc, case.pub.key, always=True)
    return replace(case, manifest=canonical(doc), block=b_i, data=data)


def segment(seed: int) -> Target[SegCase]:
    import zstandard

    from aurora_store.bucket.limits import Limits
    from aurora_store.codec.words import HostWords
    from aurora_store.format.blocks import apply_blocks, decode_block
    from aurora_store.format.manifest_parser import parse_manifest

    cap = Limits().max_block_decoded_bytes
    deltas = [p for p in published(seed) if p.manifest.kind == "delta"]
    seeds = [SegCase(p, None, i, None, p.objects[s.key]) for p in deltas for i, s in enumerate(p.manifest.segments)]

    def mutate(rng: random.Random, case: SegCase) -> SegCase:
        r = rng.random()
        try:
            if r < 0.35:
                return _reframe(rng, case)
            if r < 0.6:  # a block's header fields (sometimes anything in the manifest), re-hashed
                raw = case.manifest or case.pub.raw
                b_i = rng.randrange(len(json.loads(raw)["segments"][case.seg]["blocks"]))
                within = None if rng.random() < 0.2 else (lambda d: d["segments"][case.seg]["blocks"][b_i])
                data = mutate_json(rng, raw, within=within, fix=lambda r, d: rehash(r, d, None, True))
                return replace(case, manifest=data, block=b_i)
        except (ValueError, LookupError, TypeError, AttributeError, RecursionError, zstandard.ZstdError):
            pass  # a kept mutant whose manifest no longer has this layout: mutate its bytes instead
        blocks = case.pub.manifest.segments[case.seg].blocks
        b_i = rng.randrange(len(blocks))
        b = blocks[b_i]
        inner = mutate_bytes(rng, case.data[b.offset : b.offset + b.length], keep_length=True)
        data = case.data[: b.offset] + inner + case.data[b.offset + b.length :]
        return replace(case, data=data, block=b_i if rng.random() < 0.85 else None)

    def execute(case: SegCase) -> str | None:
        p = case.pub
        m = p.manifest if case.manifest is None else parse_manifest(case.manifest, expect_version=p.version)
        if m.tensors != p.parent.specs:
            return "layout_changed"  # apply_delta refuses it (a ChainError) before decoding
        if case.seg >= len(m.segments):
            return "no_segment"
        datas = [case.data if i == case.seg else p.objects.get(s.key, b"") for i, s in enumerate(m.segments)]
        if any(len(d) != s.size for d, s in zip(datas, m.segments, strict=True)):
            return "size_refused"  # the reader's GET of exactly seg.size bytes fails
        url = f"memory://aurora-fuzz/{m.segments[case.seg].key}"
        old = HostWords(p.parent.words)
        if case.block is not None:
            seg = m.segments[case.seg]
            if case.block < len(seg.blocks):
                decode_block(m, seg, case.block, memoryview(case.data), url, cap, old)
            return None
        todo = [(s, memoryview(d), b) for s, d in zip(m.segments, datas, strict=True) for b in range(len(s.blocks))]
        apply_blocks(p.parent.copy(), m, [decode_block(m, s, b, d, url, cap, old) for s, d, b in todo])
        return None

    def show(case: SegCase) -> str:
        return f"segment {case.seg} block {case.block}: {hexed(case.data)} manifest: {hexed(case.manifest or b'')}"

    return Target("segment", seeds, mutate, execute, show, ("format.blocks.decode_block", "format.blocks.apply_blocks"))


# ---------------------------------------------------------------- safetensors

TensorsCase = tuple[str, Published | None, int, bytes]


def _mutate_safetensors(rng: random.Random, data: bytes, others: list[bytes]) -> bytes:
    """Bytes; or the JSON header (mutated, re-padded, its length prefix mostly right); or the length prefix."""
    r = rng.random()
    if r < 0.4 or len(data) < 8:
        return mutate_bytes(rng, data, others=others)
    n = int.from_bytes(data[:8], "little")
    head, rest = data[8 : 8 + n], data[8 + n :]
    if r < 0.85:
        head = mutate_json(rng, head.rstrip(b" "))
        head += b" " * (-len(head) % 8 if rng.random() < 0.8 else rng.randrange(8))
        rest = mutate_bytes(rng, rest) if rng.random() < 0.2 else rest
        n = len(head) if rng.random() < 0.9 else rng.choice((0, len(head) - 1, len(head) + 1, 2**63))
    else:
        n = rng.choice((0, 1, 7, n - 1, n + 1, len(data) - 8, len(data) - 7, 100 << 20, (100 << 20) + 1, 2**64 - 1))
    return min(max(0, n), 2**64 - 1).to_bytes(8, "little") + head + rest


def safetensors(seed: int) -> Target[TensorsCase]:
    from aurora_store.format import full, safetensors_file

    seeds: list[TensorsCase] = []
    for p in published(seed):
        if p.manifest.index is not None:
            seeds += [("shard", p, i, p.objects[s.key]) for i, s in enumerate(p.manifest.segments)]
            seeds.append(("index", p, 0, p.objects[p.manifest.index.key]))
    meta = {"format": "pt", "k": "\u00e9"}
    seeds.append(
        ("file", None, 0, bytes(safetensors_file.build([("x", "BF16", (3, 4), np.arange(12, dtype="<u2"))], meta)))
    )
    others = [s[3] for s in seeds]

    def mutate(rng: random.Random, case: TensorsCase) -> TensorsCase:
        kind, p, i, data = case
        if kind != "index":
            return kind, p, i, _mutate_safetensors(rng, data, others)
        return kind, p, i, mutate_json(rng, data) if rng.random() < 0.6 else mutate_bytes(rng, data, others=others)

    def execute(case: TensorsCase) -> None:
        kind, p, i, data = case
        if p is None:
            entries, base = safetensors_file.parse(data, "fuzz.safetensors")
            for e in entries.values():
                safetensors_file.words(data, base, e)
        elif kind == "index":
            full.check_index(data, p.manifest, "fuzz-index.json")
        else:
            full.read_shard(data, p.manifest, p.manifest.segments[i], "fuzz.safetensors")

    def show(case: TensorsCase) -> str:
        return f"{case[0]}: {hexed(case[3])}"

    names = ("format.full.read_shard", "format.full.check_index", "format.safetensors_file.parse")
    return Target("safetensors", seeds, mutate, execute, show, names)


BUILDERS: dict[str, Callable[[int], Target[Any]]] = {
    "manifest": manifest,
    "segment": segment,
    "safetensors": safetensors,
    "redis_events": redis_events,
    "redis_results": redis_results,
    "redis_docs": redis_docs,
    "attachments": attachments,
}


def build(name: str, seed: int) -> Target[Any]:
    return BUILDERS[name](seed)
