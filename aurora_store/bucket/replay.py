"""Replay: write any committed version as a Hugging Face model directory (transformers, vLLM).

The weights come from :meth:`Run.materialize_words` (every hash, link, digest and, with a
verify key, signature checked), go out as safetensors shards with a HF index, next to the
run's attached files and an ``aurora_replay.json`` provenance record. The directory is
built beside the target and renamed into place, so a reader never sees half of it. No torch.

A LoRA run's version (:class:`Adapter`: what its run spec says) replays as a PEFT adapter directory
(``adapter_model.safetensors``, ``adapter_config.json``) with its base as a HF directory in
``base/`` (``PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(out + "/base"), out)``),
or with ``merge`` as one HF directory of the merged weights: each target's ``W + (alpha / r) B A``,
computed in FP32 from the BF16 words and rounded to BF16 (to nearest, ties to even).

A quantized run's version (``scheme``: what its run spec says) replays as the quantized checkpoint it
is, the words and scales as published, its ``config.json`` naming the scheme's
``quantization_config`` (:func:`~aurora_store.quant.schemes.hf_quantization_config`), which vLLM
loads; or with ``dequantize`` as BF16 weights: each projection's ``words x scale`` in FP32, rounded
to BF16 (to nearest, ties to even), its scales dropped, the run's own ``config.json``.
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from aurora_store.errors import ConflictError, StoreError
from aurora_store.format import dtypes, safetensors_file
from aurora_store.format.full import plan_shards
from aurora_store.format.keys import LORA_BASE_FILE
from aurora_store.format.manifest import TensorSpec
from aurora_store.format.weights import WeightState, full_digest
from aurora_store.localfile import open_regular, read_regular
from aurora_store.quant import schemes

if TYPE_CHECKING:
    from aurora_store.bucket.run import Run
    from aurora_store.format.manifest import Manifest, Segment

log = logging.getLogger("aurora.replay")
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
PROVENANCE = "aurora_replay.json"
ADAPTER = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
BASE_DIR = "base"
CONFIG = "config.json"
PEFT_PREFIX = "base_model.model."
"""What PEFT puts before a module's name in an adapter's tensor names."""
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


@dataclass(frozen=True, slots=True)
class Adapter:
    """A LoRA run's adapter and base, as its run spec names them (the store reads no run spec: the
    caller passes these)."""

    rank: int
    alpha: float
    targets: tuple[str, ...]
    base_files: tuple[str, ...]
    base_digest: str


def replay(
    run: Run,
    version: int | None,
    out: str,
    *,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    force: bool = False,
    progress: Progress | None = None,
    adapter: Adapter | None = None,
    merge: bool = False,
    scheme: str | None = None,
    dequantize: bool = False,
) -> ReplayResult:
    """Write ``version`` (latest when None) of ``run`` bit-exact as a HF model directory at ``out``;
    of a LoRA run (``adapter``), a PEFT adapter directory with its base in ``base/``, or with
    ``merge`` the merged weights as one HF directory; of a quantized run (``scheme``), the quantized
    checkpoint, or with ``dequantize`` its BF16 weights."""
    if shard_bytes < 1:
        raise StoreError(f"shard_bytes must be >= 1, got {shard_bytes}")
    if merge and adapter is None:
        raise StoreError("--merge is for a LoRA run: this run's versions hold full weights")
    if dequantize and scheme is None:
        raise StoreError("--dequantize is for a run of quantized weights: this run's versions hold BF16 weights")
    out = os.path.abspath(os.fspath(out))
    if adapter is not None and not merge and force and os.path.isdir(out) and os.listdir(out):
        raise ConflictError(f"{out} is not empty; --force replaces full-weight replays only: remove it first")
    replaced = _check_target(run, out, force)
    step = progress or (lambda stage, done, total: None)
    step("materialize", 0, 1)
    state = run.materialize_words(version)
    step("materialize", 1, 1)
    m = run.manifest(state.version)
    if adapter is not None:
        from aurora_store.bucket.lora_base import load_base

        base = load_base(run, m, adapter.base_files, adapter.base_digest)
        if merge:
            state = merged(base, state, adapter)
    rewrite: dict[str, Callable[[bytes], bytes]] = {}
    if scheme is not None and dequantize:
        state = dequantized(state, scheme)
    elif scheme is not None:
        rewrite[CONFIG] = lambda data: quantized_config(data, scheme)
    tmp = os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.tmp-{uuid.uuid4().hex[:12]}")
    os.makedirs(tmp)
    try:
        if adapter is None or merge:
            shards, total = _write_shards(tmp, state, shard_bytes, step)
            files, skipped = _write_attachments(run, m, tmp, set(shards) | {INDEX, PROVENANCE}, step, rewrite)
        else:
            shards, total = _write_adapter(tmp, state, adapter)
            os.makedirs(os.path.join(tmp, BASE_DIR))
            base_dir = os.path.join(tmp, BASE_DIR)
            base_shards, _ = _write_shards(base_dir, base, shard_bytes, step)
            files, skipped = _write_attachments(run, m, base_dir, set(base_shards) | {INDEX, PROVENANCE}, step)
            shards += [f"{BASE_DIR}/{n}" for n in base_shards]
            _fsync_dir(base_dir)
        record: dict[str, object] = {
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
        if adapter is not None:
            record["lora"] = {"layout": "merged" if merge else "peft", "base_digest": adapter.base_digest}
            if merge:
                record["merged_digest"] = state.digest.hex()
        if scheme is not None:
            record["quantization"] = {"scheme": scheme, "layout": "dequantized" if dequantize else "quantized"}
            if dequantize:
                record["dequantized_digest"] = state.digest.hex()
        _write(tmp, PROVENANCE, json.dumps(record, indent=2).encode() + b"\n")
        _fsync_dir(tmp)
        _install(tmp, out, replaced)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ReplayResult(out, m.version, m.version_hash, m.weights_digest, shards, total, files, skipped)


def _write_adapter(tmp: str, state: WeightState, adapter: Adapter) -> tuple[list[str], int]:
    for name, data in adapter_files(state.specs, state.words, adapter).items():
        _write(tmp, name, data)
    return [ADAPTER], sum(s.numel * s.width for s in state.specs)


def adapter_files(
    specs: Sequence[TensorSpec], words: Mapping[str, np.ndarray], adapter: Adapter
) -> dict[str, bytes | bytearray]:
    """A PEFT adapter directory's files: a version's matrices as PEFT saves them (``adapter_model.
    safetensors``) and the config that names their shape (``adapter_config.json``), which
    ``PeftModel.from_pretrained`` and vLLM's LoRA loader read."""
    data = safetensors_file.build([(s.name, s.dtype, s.shape, words[s.name]) for s in specs], metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "r": adapter.rank,
        "lora_alpha": adapter.alpha,
        "target_modules": list(adapter.targets),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "base_model_name_or_path": BASE_DIR,
    }
    return {ADAPTER: data, ADAPTER_CONFIG: json.dumps(config, indent=2).encode() + b"\n"}


def merged(base: WeightState, adapter: WeightState, shape: Adapter) -> WeightState:
    """``base`` with every adapted weight replaced by ``W + (alpha / r) B A`` (FP32, rounded to BF16)."""
    scale = np.float32(shape.alpha / shape.rank)
    specs = {s.name: s for s in base.specs}
    words = dict(base.words)
    done = set()
    for s in adapter.specs:
        if not s.name.endswith(".lora_A.weight"):
            continue
        module = s.name.removeprefix(PEFT_PREFIX).removesuffix(".lora_A.weight")
        b_name = s.name.replace(".lora_A.weight", ".lora_B.weight")
        target = specs.get(f"{module}.weight")
        b_spec = adapter.spec(b_name) if b_name in adapter.words else None
        if target is None or b_spec is None or not s.name.startswith(PEFT_PREFIX):
            raise StoreError(f"adapter tensor {s.name!r}: the base has no {module}.weight, or the adapter no lora_B")
        if {target.dtype, s.dtype, b_spec.dtype} != {"BF16"} or len(target.shape) != 2:
            raise StoreError(f"{module}: merging needs BF16 matrices, got {target.dtype} {target.shape}")
        a = dtypes.bf16_widened(adapter.words[s.name]).reshape(s.shape)
        b = dtypes.bf16_widened(adapter.words[b_name]).reshape(b_spec.shape)
        w = dtypes.bf16_widened(base.words[target.name]).reshape(target.shape)
        if b.shape[0] != w.shape[0] or a.shape[1] != w.shape[1] or a.shape[0] != b.shape[1]:
            raise StoreError(f"{module}: adapter shapes {b.shape} x {a.shape} do not fit the weight's {w.shape}")
        words[target.name] = dtypes.bf16_words(w + scale * (b @ a)).reshape(-1)
        done.add(target.name)
    if not done:
        raise StoreError("the adapter adapts no weight of the base")
    return WeightState(base.specs, words, digest=full_digest(base.specs, words))


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
            if f is None or not (_same_bytes(path, f) or _rewritten(run, record, name, path, f)):
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


def _rewritten(run: Run, record: dict[str, object], name: str, path: str, f: Segment) -> bool:
    """Whether ``path`` holds the ``config.json`` a quantized replay writes from the one ``run`` vouches
    for (``f``) under the scheme ``record`` names."""
    q = record.get("quantization")
    if name != CONFIG or not isinstance(q, dict) or q.get("layout") != "quantized":
        return False
    if q.get("scheme") not in schemes.SCHEMES:
        return False
    try:
        want = quantized_config(bytes(run.reader.fetch(f)), str(q["scheme"]))
        return read_regular(path, len(want) + 1) == want
    except (OSError, StoreError):
        return False


def quantized_config(data: bytes, scheme: str) -> bytes:
    """A run's ``config.json`` naming ``scheme``'s ``quantization_config``, for loaders of the quantized
    checkpoint (every other field as the run has it)."""
    from aurora_store.format import hostile_json

    try:
        config = hostile_json.loads(data)
    except ValueError as exc:
        raise StoreError(f"{CONFIG}: not JSON ({exc})"[:300]) from None
    if not isinstance(config, dict):
        raise StoreError(f"{CONFIG}: not a JSON object")
    config["quantization_config"] = schemes.hf_quantization_config(scheme)
    return json.dumps(config, indent=2, sort_keys=True).encode() + b"\n"


def dequantized(state: WeightState, scheme: str) -> WeightState:
    """``state`` with each quantized projection as BF16 (``words x scale`` in FP32, rounded to nearest
    even) and its scale dropped; every other tensor as it is."""
    specs = {s.name: s for s in state.specs}
    words = dict(state.words)
    out: list[TensorSpec] = []
    scales = set()
    for s in state.specs:
        lay = schemes.layout(scheme, s.shape) if len(s.shape) == 2 else None
        scale = schemes.scale_of(s.name, lay.scale_name) if lay is not None and s.name.endswith(".weight") else None
        if lay is None or scale not in specs or s.dtype != lay.dtype:
            continue
        have = specs[scale]
        if have.dtype != "F32" or tuple(have.shape) != lay.scale_shape:
            raise StoreError(f"{scale}: {have.dtype} {list(have.shape)}, expected F32 {list(lay.scale_shape)}")
        q = schemes.Quantized(
            state.words[s.name].reshape(s.shape),
            state.words[scale].view(np.float32).reshape(lay.scale_shape),
            lay.scale_name,
            lay.dtype,
        )
        words[s.name] = dtypes.bf16_words(schemes.dequantize(q)).reshape(-1)
        scales.add(scale)
    for s in state.specs:
        if s.name in scales:
            words.pop(s.name)
        elif words[s.name] is not state.words[s.name]:
            out.append(TensorSpec(s.name, "BF16", s.shape))
        else:
            out.append(s)
    specs_out = tuple(out)
    return WeightState(specs_out, words, state.version, state.version_hash, full_digest(specs_out, words))


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
    run: Run,
    m: Manifest,
    tmp: str,
    reserved: set[str],
    step: Progress,
    rewrite: Mapping[str, Callable[[bytes], bytes]] | None = None,
) -> tuple[dict[str, str], list[str]]:
    """Copy the attachments version ``m`` vouches for, each verified against its manifest entry (and
    then passed through ``rewrite``'s function of its name, where it has one).

    Returns their SHA-256s (as the run vouches for them) and the names skipped because they would
    clash with replayed weights."""
    files: dict[str, str] = {}
    skipped = []
    for i, f in enumerate(m.files):
        name = f.key.split("/", 1)[1]
        if LORA_BASE_FILE.match(name):
            continue  # a LoRA run's base: replayed as weights, never copied as a file
        if name in reserved or name.endswith((".safetensors", ".safetensors.index.json")):
            skipped.append(name)
        else:
            data = run.reader.fetch(f)
            change = (rewrite or {}).get(name)
            _write(tmp, name, data if change is None else change(bytes(data)))
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
