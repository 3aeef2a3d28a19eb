"""Building a full version: safetensors shards plus a HF-style index. No I/O."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator

import numpy as np

from aurora_store import safetensors_format
from aurora_store.delta import SealedObject, segment_key
from aurora_store.manifest import Segment, TensorSpec, version_dir

INDEX_NAME = "model.safetensors.index.json"


def build_shards(
    version: int, specs: tuple[TensorSpec, ...], words: dict[str, np.ndarray], shard_bytes: int
) -> Iterator[SealedObject]:
    """Yield safetensors shards of about ``shard_bytes`` (one tensor never splits), then the index."""
    groups: list[list[int]] = [[]]
    fill = 0
    for i, s in enumerate(specs):
        n = s.numel * s.width
        if groups[-1] and fill + n > shard_bytes:
            groups.append([])
            fill = 0
        groups[-1].append(i)
        fill += n
    weight_map: dict[str, str] = {}
    total = 0
    for g, members in enumerate(groups):
        ordered = sorted(members, key=lambda i: (-specs[i].width, specs[i].name))  # aligned for zero-copy mmap
        data = safetensors_format.build(
            [(specs[i].name, specs[i].dtype, specs[i].shape, words[specs[i].name]) for i in ordered],
            metadata={"format": "pt"},
        )
        key, sha = segment_key(version, g, data, "safetensors")
        for i in members:
            weight_map[specs[i].name] = key.rsplit("/", 1)[1]
            total += specs[i].numel * specs[i].width
        yield SealedObject(Segment(key, len(data), sha, tensors=tuple(members)), data)
    index = json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2, sort_keys=True).encode()
    sha = hashlib.sha256(index).hexdigest()
    key = f"{version_dir(version)}/{INDEX_NAME.removesuffix('.json')}-{sha[:32]}.json"
    yield SealedObject(Segment(key, len(index), sha), index)
