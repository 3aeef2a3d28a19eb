"""Building a full version: safetensors shards plus a HF-style index. No I/O."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator

import numpy as np

from aurora_store import safetensors_format
from aurora_store.delta import SealedObject, segment_key
from aurora_store.manifest import Segment, TensorSpec, version_dir

INDEX_NAME = "model.safetensors.index.json"


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
    data = safetensors_format.build(
        [(s.name, s.dtype, s.shape, words[s.name]) for s in members],
        metadata={"format": "pt"},
    )
    key, sha = segment_key(version, ordinal, data, "safetensors")
    return SealedObject(Segment(key, len(data), sha, tensors=tuple(sorted(position[s.name] for s in members))), data)


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
    key = f"{version_dir(version)}/{INDEX_NAME.removesuffix('.json')}-{sha[:32]}.json"
    return SealedObject(Segment(key, len(index), sha), index)


def build_shards(
    version: int, specs: tuple[TensorSpec, ...], words: dict[str, np.ndarray], shard_bytes: int
) -> Iterator[SealedObject]:
    """Yield safetensors shards of about ``shard_bytes``, each as it is built, then the index."""
    entries = []
    for g, members in enumerate(plan_shards(specs, shard_bytes)):
        obj = build_shard(version, g, specs, members, words)
        entries.append(obj.entry)
        yield obj
    yield build_index(version, specs, entries)
