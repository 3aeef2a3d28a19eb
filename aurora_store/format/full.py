"""Full versions: safetensors shards plus a HF-style index, built and checked. No I/O."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

import numpy as np

from aurora_store.errors import CorruptError
from aurora_store.format import safetensors_file
from aurora_store.format.delta import SealedObject, seal
from aurora_store.format.keys import index_key
from aurora_store.format.manifest import Manifest, Segment, TensorSpec


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
    version: int, ordinal: int, specs: tuple[TensorSpec, ...], members: list[TensorSpec], words: dict[str, np.ndarray]
) -> SealedObject:
    """One safetensors shard holding ``members`` (a group of :func:`plan_shards`), as object ``ordinal``."""
    position = {s.name: i for i, s in enumerate(specs)}
    data = safetensors_file.build(
        [(s.name, s.dtype, s.shape, words[s.name]) for s in members],
        metadata={"format": "pt"},
    )
    return seal(version, ordinal, data, "safetensors", tensors=tuple(sorted(position[s.name] for s in members)))


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


def check_index(data: bytes, m: Manifest, what: str) -> None:
    """A full version's index must map every tensor to the shard the manifest puts it in."""
    try:
        doc = json.loads(data)
        weight_map = doc["weight_map"]
    except (ValueError, KeyError, TypeError, RecursionError):
        raise CorruptError(f"{what}: not a safetensors index") from None
    expected = {m.tensors[i].name: s.key.rsplit("/", 1)[1] for s in m.segments for i in s.tensors}
    if weight_map != expected:
        raise CorruptError(f"{what}: weight_map does not match the manifest's shards")


def read_shard(data: bytes, m: Manifest, seg: Segment, what: str) -> dict[str, np.ndarray]:
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
