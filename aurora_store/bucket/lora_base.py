"""A LoRA run's frozen base: carried by the run once, as attachments, and named by content.

Every version of a LoRA run holds the adapter's matrices only (the run spec's ``LoraSpec``).
The base they adapt is written once, when the run starts, as safetensors attachments
(``lora-base-NNNNN-of-NNNNN.safetensors``, at most :data:`BASE_FILE_BYTES` each, the base model's
own tensor names in the run's dtype). Attachments are listed with their SHA-256 in every manifest
(so a signed run signs them), copied by relays with the run and kept by gc, so an actor in any
region builds its base from its own region's bucket. The run spec names the base by its weight
digest (the digest every manifest records of its weights, :func:`~aurora_store.format.weights.full_digest`):
:func:`load_base` recomputes it, and an engine's base that is not those bits is refused. No torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from aurora_store.errors import CorruptError
from aurora_store.format import safetensors_file
from aurora_store.format.digest import Digest
from aurora_store.format.full import plan_shards
from aurora_store.format.keys import LORA_BASE_FILE, lora_base_file
from aurora_store.format.manifest import TensorSpec
from aurora_store.format.weights import WeightState, full_digest

if TYPE_CHECKING:
    from aurora_store.bucket.run import Run
    from aurora_store.format.manifest import Manifest

BASE_FILE_BYTES = 1 << 29
"""Largest tensor data of one base attachment (512 MiB): each is read whole into memory, one at a time,
and an attachment may be at most 1 GiB (:data:`aurora_store.bucket.attachments.MAX_BYTES`)."""


class WrongBaseError(CorruptError):
    """The base an engine or a file holds is not the base the LoRA run names."""


def attach_base(
    run: Run,
    specs: tuple[TensorSpec, ...],
    words: dict[str, np.ndarray],
    *,
    file_bytes: int = BASE_FILE_BYTES,
    write: bool = True,
) -> tuple[str, tuple[str, ...]]:
    """Attach the base ``specs``/``words`` to ``run``; returns its weight digest (hex) and the
    attachments' names, for the run spec's ``LoraSpec`` (``write=False``: only those). Attaching the
    same base again is a no-op; other bytes under those names are a ConflictError (attachments are
    immutable)."""
    specs = tuple(sorted(specs, key=lambda s: s.name))
    groups = plan_shards(specs, file_bytes)
    names = tuple(lora_base_file(i, len(groups)) for i in range(len(groups)))
    if write:
        for name, group in zip(names, groups, strict=True):
            data = safetensors_file.build([(s.name, s.dtype, s.shape, words[s.name]) for s in group], {"format": "pt"})
            run.files.put(name, bytes(data))
    return full_digest(specs, words).hex(), names


def base_files(name: str) -> bool:
    """Whether attachment ``name`` holds part of a LoRA run's base (what readers of a run's small
    files, config and tokenizer, leave alone)."""
    return LORA_BASE_FILE.match(name) is not None


def load_base(run: Run, m: Manifest, files: tuple[str, ...], digest: str) -> WeightState:
    """The base a LoRA run names (its attachments ``files``, weight digest ``digest``), from the
    attachments version ``m`` vouches for (each checked against its size and SHA-256 there), as host
    words; a WrongBaseError if their digest is not ``digest``, a CorruptError if a file is missing or
    malformed."""
    listed = {f.key.rsplit("/", 1)[-1] for f in m.files}
    missing = [n for n in files if n not in listed]
    if missing:
        raise CorruptError(f"{run.uri}: version {m.version} lists no attachment {missing[0]}, part of the LoRA base")
    specs: list[TensorSpec] = []
    words: dict[str, np.ndarray] = {}
    for name in files:
        data = run.reader.files(m, names={name}.__contains__)[name]
        what = f"{run.uri} attachment {name}"
        entries, start = safetensors_file.parse(data, what)
        for e in entries.values():
            if e.name in words:
                raise CorruptError(f"{what}: tensor {e.name!r} is in two of the base's files")
            specs.append(TensorSpec(e.name, e.dtype, e.shape))
            words[e.name] = safetensors_file.words(data, start, e)
    ordered = tuple(sorted(specs, key=lambda s: s.name))
    got = full_digest(ordered, words).hex()
    if got != digest:
        raise WrongBaseError(
            f"{run.uri}: the LoRA base attached to the run has weight digest {got}, the run names {digest}"
        )
    return WeightState(ordered, words, digest=Digest.from_hex(got))
