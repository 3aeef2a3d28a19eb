"""Replay: write any committed version as a Hugging Face model directory (transformers, vLLM).

The weights come from :meth:`Run.materialize_words` (every hash, link, digest and, with a
verify key, signature checked), go out as safetensors shards with a HF index, next to the
run's attached files and an ``aurora_replay.json`` provenance record. The directory is
built beside the target and renamed into place, so a reader never sees half of it. No torch.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aurora_store.errors import ConflictError, StoreError
from aurora_store.format import safetensors_file
from aurora_store.format.full import plan_shards

if TYPE_CHECKING:
    from aurora_store.bucket.run import Run
    from aurora_store.format.manifest import Manifest
    from aurora_store.format.weights import WeightState

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
PROVENANCE = "aurora_replay.json"
DEFAULT_SHARD_BYTES = 2 << 30
"""Target shard size; each shard is built in memory, so this bounds replay's extra memory."""

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: stage is ``"materialize"``, ``"shards"`` (bytes) or ``"files"``."""


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What :func:`replay` wrote."""

    out: str
    version: int
    version_hash: str
    weights_digest: str
    shards: list[str]
    total_size: int
    """Bytes of tensor data (the index's ``total_size``)."""
    files: dict[str, str] = field(default_factory=dict)
    """Attached files copied into the directory, with their SHA-256."""
    skipped: list[str] = field(default_factory=list)
    """Attached files not copied: they would shadow or add to the replayed weights."""


def replay(
    run: Run,
    version: int | None,
    out: str,
    *,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    force: bool = False,
    progress: Progress | None = None,
) -> ReplayResult:
    """Write ``version`` (latest when None) of ``run`` bit-exact as a HF model directory at ``out``."""
    if shard_bytes < 1:
        raise StoreError(f"shard_bytes must be >= 1, got {shard_bytes}")
    out = os.path.abspath(os.fspath(out))
    _check_target(out, force)
    step = progress or (lambda stage, done, total: None)
    step("materialize", 0, 1)
    state = run.materialize_words(version)
    step("materialize", 1, 1)
    m = run.manifest(state.version)
    tmp = os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.tmp-{uuid.uuid4().hex[:12]}")
    os.makedirs(tmp)
    try:
        shards, total = _write_shards(tmp, state, shard_bytes, step)
        files, skipped = _write_attachments(run, m, tmp, set(shards) | {INDEX, PROVENANCE}, step)
        record = {
            "format": "aurora-replay/1",
            "run": run.uri,
            "version": m.version,
            "kind": m.kind,
            "version_hash": m.version_hash,
            "weights_digest": m.weights_digest,
            "created": m.created,
            "step": m.step,
            "key_id": m.signature.key_id if m.signature else None,
            "shards": shards,
            "files": files,
        }
        _write(tmp, PROVENANCE, json.dumps(record, indent=2).encode() + b"\n")
        _fsync_dir(tmp)
        _install(tmp, out, force)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ReplayResult(out, m.version, m.version_hash, m.weights_digest, shards, total, files, skipped)


def _check_target(out: str, force: bool) -> None:
    if os.path.lexists(out):
        if not os.path.isdir(out) or os.path.islink(out):
            raise ConflictError(f"{out} exists and is not a directory; replay writes a directory")
        present = os.listdir(out)
        if present and not force:
            raise ConflictError(f"{out} is not empty; choose another --out or pass --force to replace it")
        if present:
            _check_replayed(out, present)
    elif not os.path.isdir(os.path.dirname(out)):
        raise StoreError(f"{os.path.dirname(out)} does not exist; create the parent of --out first")


def _check_replayed(out: str, present: list[str]) -> None:
    """``--force`` replaces only a directory an earlier replay wrote: its provenance record names
    every file in it. Anything else (a user's file, another tool's output) is never deleted."""
    try:
        with open(os.path.join(out, PROVENANCE), "rb") as f:
            record = json.loads(f.read(1 << 20))
        ours = {PROVENANCE, INDEX, *record["shards"], *record["files"]}
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        raise ConflictError(
            f"{out} is not a directory replay wrote (no readable {PROVENANCE}); --force replaces only those: "
            "choose another --out"
        ) from None
    foreign = sorted(set(present) - {str(n) for n in ours})
    if foreign:
        shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
        raise ConflictError(f"{out} holds files replay did not write ({shown}); --force never deletes those")


def _write_shards(tmp: str, state: WeightState, shard_bytes: int, step: Progress) -> tuple[list[str], int]:
    groups = plan_shards(state.specs, shard_bytes)
    total = sum(s.numel * s.width for s in state.specs)
    names = (
        [SINGLE]
        if len(groups) == 1
        else [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    )
    weight_map: dict[str, str] = {}
    done = 0
    step("shards", 0, total)
    for name, group in zip(names, groups, strict=True):
        data = safetensors_file.build(
            [(s.name, s.dtype, s.shape, state.words[s.name]) for s in group], metadata={"format": "pt"}
        )
        _write(tmp, name, data)
        del data
        for s in group:
            weight_map[s.name] = name
            done += s.numel * s.width
        step("shards", done, total)
    if len(groups) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        _write(tmp, INDEX, json.dumps(index, indent=2).encode() + b"\n")
    return names, total


def _write_attachments(
    run: Run, m: Manifest, tmp: str, reserved: set[str], step: Progress
) -> tuple[dict[str, str], list[str]]:
    """Copy the attachments version ``m`` vouches for, each verified against its manifest entry.

    Returns their SHA-256s and the names skipped because they would clash with replayed weights."""
    files: dict[str, str] = {}
    skipped = []
    for i, f in enumerate(m.files):
        name = f.key.split("/", 1)[1]
        if name in reserved or name.endswith((".safetensors", ".safetensors.index.json")):
            skipped.append(name)
        else:
            _write(tmp, name, run.reader.fetch(f))
            files[name] = f.sha256
        step("files", i + 1, len(m.files))
    return files, skipped


def _write(directory: str, name: str, data: bytes | bytearray | memoryview) -> None:
    with open(os.path.join(directory, name), "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _install(tmp: str, out: str, force: bool) -> None:
    """Rename the finished directory into place; with ``force``, the old one goes only after."""
    if not os.path.lexists(out):
        os.rename(tmp, out)
    elif not os.listdir(out):
        os.replace(tmp, out)  # POSIX rename replaces an empty directory atomically
    else:
        assert force
        old = f"{tmp}.old"
        os.rename(out, old)
        os.rename(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(os.path.dirname(out))
