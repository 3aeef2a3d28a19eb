"""Replay: write any committed version as a Hugging Face model directory (transformers, vLLM).

The weights come from :meth:`Run.materialize_words` (every hash, link, digest and, with a
verify key, signature checked), go out as safetensors shards with a HF index, next to the
run's attached files and an ``aurora_replay.json`` provenance record. The directory is
built beside the target and renamed into place, so a reader never sees half of it. No torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aurora_store.errors import ConflictError, StoreError
from aurora_store.format import safetensors_file
from aurora_store.format.full import plan_shards
from aurora_store.localfile import open_regular, read_regular

if TYPE_CHECKING:
    from aurora_store.bucket.run import Run
    from aurora_store.format.manifest import Manifest, Segment
    from aurora_store.format.weights import WeightState

log = logging.getLogger("aurora.replay")
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
    replaced = _check_target(run, out, force)
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
        _install(tmp, out, replaced)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ReplayResult(out, m.version, m.version_hash, m.weights_digest, shards, total, files, skipped)


def _check_target(run: Run, out: str, force: bool) -> list[str]:
    """Refuse a target replay may not write; with ``force``, the files of an earlier replay it may
    replace (those :func:`_ours` proves replay wrote)."""
    if os.path.lexists(out):
        if not os.path.isdir(out) or os.path.islink(out):
            raise ConflictError(f"{out} exists and is not a directory; replay writes a directory")
        present = os.listdir(out)
        if present and not force:
            raise ConflictError(f"{out} is not empty; choose another --out or pass --force to replace it")
        if present:
            return _ours(run, out, present)
    elif not os.path.isdir(os.path.dirname(out)):
        raise StoreError(f"{os.path.dirname(out)} does not exist; create the parent of --out first")
    return []


_SHARD = re.compile(r"model(-[0-9]{5}-of-[0-9]{5})?\.safetensors")
"""What replay names its shards (:func:`_write_shards`)."""


def _ours(run: Run, out: str, present: list[str]) -> list[str]:
    """``present`` (the entries of ``out``), once each is shown to be replay's to replace: a regular
    file (never a link or a directory) under one of replay's own names (its provenance record, index
    or shards), or an attachment whose bytes are the ones ``run`` vouches for under that name at the
    version the provenance record names. The record itself is unsigned, so it proves nothing alone: a
    file it lists is deleted only when the run says the same. Anything else is never deleted."""
    try:
        record = json.loads(read_regular(os.path.join(out, PROVENANCE), 1 << 20))
        if not isinstance(record, dict):
            raise TypeError
    except (OSError, ValueError, TypeError, RecursionError):
        raise ConflictError(
            f"{out} is not a directory replay wrote (no readable {PROVENANCE}); --force replaces only those: "
            "choose another --out"
        ) from None
    vouched: dict[str, Segment] | None = None
    foreign = []
    for name in sorted(present):
        path = os.path.join(out, name)
        if not stat.S_ISREG(os.lstat(path).st_mode):
            foreign.append(f"{name} (not a regular file)")
        elif name in (PROVENANCE, INDEX) or _SHARD.fullmatch(name):
            continue
        else:
            if vouched is None:
                vouched = _attachments(run, record)
            f = vouched.get(name)
            if f is None or not _same_bytes(path, f):
                foreign.append(name)
    if foreign:
        shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
        raise ConflictError(
            f"{out} holds files replay cannot show it wrote ({shown}); --force never deletes those: "
            "move them away or choose another --out"
        )
    return present


def _attachments(run: Run, record: dict[str, object]) -> dict[str, Segment]:
    """The attachments ``run`` vouches for at the version ``record`` names, by file name (none when
    that version is not in ``run``, or not with the record's hash)."""
    version, version_hash = record.get("version"), record.get("version_hash")
    if not isinstance(version, int) or isinstance(version, bool) or not isinstance(version_hash, str):
        return {}
    try:
        m = run.manifest(version)
    except StoreError:
        return {}
    if m.version_hash != version_hash:
        return {}
    return {f.key.split("/", 1)[1]: f for f in m.files}


def _same_bytes(path: str, f: Segment) -> bool:
    """Whether the regular file at ``path`` holds exactly the bytes ``f`` names (size, then SHA-256)."""
    try:
        fd = open_regular(path)
    except OSError:
        return False
    try:
        if os.fstat(fd).st_size != f.size:
            return False
        h, at = hashlib.sha256(), 0
        while at < f.size:
            chunk = os.pread(fd, min(f.size - at, 16 << 20), at)
            if not chunk:
                return False
            h.update(chunk)
            at += len(chunk)
        return h.hexdigest() == f.sha256
    finally:
        os.close(fd)


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


def _install(tmp: str, out: str, replaced: list[str]) -> None:
    """Rename the finished directory into place; an earlier replay's directory goes only after, and
    of it only the files ``replaced`` (what :func:`_ours` proved replay's): anything that appeared in
    it since is left there, in the renamed old directory, and said so."""
    if not os.path.lexists(out):
        os.rename(tmp, out)
    elif not os.listdir(out):
        os.replace(tmp, out)  # POSIX rename replaces an empty directory atomically
    else:
        assert replaced
        old = f"{tmp}.old"
        os.rename(out, old)
        os.rename(tmp, out)
        for name in replaced:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(old, name))
        try:
            os.rmdir(old)
        except OSError:
            log.warning("%s: files replay did not write appeared while it ran; they are kept in %s", out, old)
    _fsync_dir(os.path.dirname(out))
