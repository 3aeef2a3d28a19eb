"""Full versions: safetensors shards plus a HF-style index, built and checked. No I/O."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from aurora_store.errors import CorruptError
from aurora_store.format import safetensors_file
from aurora_store.format.delta import SealedObject
from aurora_store.format.keys import index_key, object_key
from aurora_store.format.manifest import Manifest, Segment, TensorSpec

_PIECE = 8 << 20
"""Bytes copied into a shard before its hash catches up: small enough to stay in cache."""
_HASHER = ThreadPoolExecutor(1, thread_name_prefix="aurora-sha256")
"""One worker, first in first out: each shard's pieces are hashed in order."""
_SINK = ThreadPoolExecutor(1, thread_name_prefix="aurora-shard-sink")
"""Likewise for the pieces handed to a sink."""


def plan_shards(specs: tuple[TensorSpec, ...], shard_bytes: int) -> list[list[TensorSpec]]:
    """Group tensors (in name order) into shards of about ``shard_bytes``; a tensor never splits.

    Within a shard, wider dtypes come first so every tensor's data is aligned to its width
    (zero-copy mmap loaders need that)."""
    groups: list[list[TensorSpec]] = [[]]
    fill = 0
    for s in specs:
        n = s.numel * s.width
        if groups[-1] and fill + n > shard_bytes:
            groups.append([])
            fill = 0
        groups[-1].append(s)
        fill += n
    return [sorted(g, key=lambda s: (-s.width, s.name)) for g in groups]


def build_shard(
    version: int,
    ordinal: int,
    specs: tuple[TensorSpec, ...],
    members: list[TensorSpec],
    words: Mapping[str, np.ndarray],
    *,
    sink: Callable[[memoryview], None] | None = None,
) -> SealedObject:
    """One safetensors shard holding ``members`` (a group of :func:`plan_shards`), as object ``ordinal``.

    The data is copied once, into the shard's buffer, piece by piece; each piece is SHA-256'd on
    a worker thread as soon as it is copied, so hashing (the slow part) runs beside the copy and
    hashes exactly the bytes that will be uploaded. ``sink``, when given, is handed every piece in
    order on another worker (a local store writes the object while its key is being hashed)."""
    position = {s.name: i for i, s in enumerate(specs)}
    tensors = [(s.name, s.dtype, s.shape, words[s.name]) for s in members]
    head, offsets = safetensors_file.layout(tensors, metadata={"format": "pt"})
    dst = np.empty(offsets[-1], dtype=np.uint8)  # numpy's allocator asks for huge pages: far fewer page faults
    dst[: len(head)] = np.frombuffer(head, dtype=np.uint8)
    data = view = dst.data
    sha = hashlib.sha256()
    jobs: list[Future[None]] = []

    def done(piece: memoryview) -> None:
        jobs.append(_HASHER.submit(sha.update, piece))
        if sink is not None:
            jobs.append(_SINK.submit(sink, piece))

    done(view[: len(head)])
    for (*_, w), lo, hi in zip(tensors, offsets[:-1], offsets[1:], strict=True):
        src = safetensors_file.little_bytes(w)
        for a in range(lo, hi, _PIECE):
            b = min(a + _PIECE, hi)
            dst[a:b] = src[a - lo : b - lo]
            done(view[a:b])
    for f in jobs:
        f.result()  # the first failure (of the sink: a full disk) is raised once every piece is done
    digest = sha.hexdigest()
    members_at = tuple(sorted(position[s.name] for s in members))
    entry = Segment(object_key(version, ordinal, digest, "safetensors"), len(data), digest, tensors=members_at)
    return SealedObject(entry, data)


def shard_words(obj: SealedObject) -> dict[str, np.ndarray]:
    """The words of every tensor of a shard this process built, as views into its buffer (no copy)."""
    entries, base = safetensors_file.parse(obj.data, obj.entry.key)
    return {name: safetensors_file.words(obj.data, base, e) for name, e in entries.items()}


def build_index(version: int, specs: tuple[TensorSpec, ...], shards: Iterable[Segment]) -> SealedObject:
    """The HF-style index of a full version's shards."""
    weight_map: dict[str, str] = {}
    total = 0
    for shard in shards:
        for i in shard.tensors:
            weight_map[specs[i].name] = shard.key.rsplit("/", 1)[1]
            total += specs[i].numel * specs[i].width
    index = json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2, sort_keys=True).encode()
    sha = hashlib.sha256(index).hexdigest()
    return SealedObject(Segment(index_key(version, sha), len(index), sha), index)


def check_index(data: bytes | memoryview, m: Manifest, what: str) -> None:
    """A full version's index must map every tensor to the shard the manifest puts it in."""
    try:
        doc = json.loads(bytes(data))
        weight_map = doc["weight_map"]
    except (ValueError, KeyError, TypeError, RecursionError):
        raise CorruptError(f"{what}: not a safetensors index") from None
    expected = {m.tensors[i].name: s.key.rsplit("/", 1)[1] for s in m.segments for i in s.tensors}
    if weight_map != expected:
        raise CorruptError(f"{what}: weight_map does not match the manifest's shards")


def read_shard(data: bytes | memoryview, m: Manifest, seg: Segment, what: str) -> dict[str, np.ndarray]:
    """The words of every tensor in shard ``seg`` of full version ``m``, checked against the manifest."""
    entries, base = safetensors_file.parse(data, what)
    expected = {m.tensors[i].name: m.tensors[i] for i in seg.tensors}
    if set(entries) != set(expected):
        raise CorruptError(f"{what}: holds tensors {sorted(entries)[:5]}..., manifest says {sorted(expected)[:5]}...")
    out = {}
    for name, spec in expected.items():
        e = entries[name]
        if (e.dtype, e.shape) != (spec.dtype, spec.shape):
            raise CorruptError(
                f"{what}: tensor {name!r} is {e.dtype}{list(e.shape)}, manifest says {spec.dtype}{list(spec.shape)}"
            )
        out[name] = safetensors_file.words(data, base, e)
    return out
