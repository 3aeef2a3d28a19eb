"""The trainer's resumable state: FP32 masters, optimizer moments, RNG, position.

Saved through the run's :class:`~aurora_store.bucket.state.StateStore`
(``trainer/state-<version>-<version_hash[:16]>/``, see docs/FORMAT.md): ``tensors.safetensors``
(master weights and AdamW moments, by HF name) and ``state.json``
(:mod:`aurora_store.format.trainer_state`: the version hash and run it belongs to, the tensor file's
SHA-256, step counts, hyper-parameters and RNG states, signed in a signed run), written last: its
existence is the commit, as a manifest is for a version. No pickle.

:class:`StateWriter` saves off the training thread. The training thread captures what is small (RNG
and step counts) and hands over references to the live tensors; a writer thread serialises them
while the next step's rollouts are collected and its forward and backward passes run (none of which
moves a weight or a moment), and the training thread waits for that copy only before the next
optimizer update. Hashing, the upload and the commit overlap the next step entirely. The version
itself may be committed by the writer too, once its state is (``then``): a state then exists for
every committed version, and a trainer killed at any moment resumes exactly.
"""

from __future__ import annotations

import base64
import json
import logging
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from safetensors.torch import load as st_load

from aurora_store.bucket.run import Run
from aurora_store.bucket.state import StateName, checked
from aurora_store.errors import CorruptError, MissingError, StoreError
from aurora_store.format import safetensors_file, trainer_state

log = logging.getLogger("aurora.trainer")

TENSORS = "tensors.safetensors"


@dataclass(frozen=True, slots=True)
class SavedState:
    version: int
    extra: dict[str, Any]


@dataclass(slots=True)
class SaveCost:
    """What saving states has cost so far."""

    saves: int = 0
    training_thread_s: float = 0.0
    """Seconds the training thread spent capturing states, waiting for a writer's copy before an
    update, and waiting for the writer to finish (when it falls a step behind)."""
    writer_s: float = 0.0
    """Seconds of the writer thread (serialise, hash, upload, commit): overlapped with training."""
    bytes: int = 0
    failed: int = 0
    last_version: int = -1
    """The newest version whose state is committed."""
    errors: list[str] = field(default_factory=list)
    commit_delay_s: float = 0.0
    """Seconds from each save until what followed it (the version's commit) was done, summed."""
    followed: int = 0
    """Saves that something followed (versions committed after their state)."""


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor, on the CPU: a DTensor shard is gathered (a collective: every rank must call)."""
    full = getattr(t, "full_tensor", None)
    return (full() if full is not None else t).detach().cpu()


def _like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``full`` laid out as ``like``: this rank's shard when ``like`` is a DTensor."""
    mesh = getattr(like, "device_mesh", None)
    if mesh is None:
        return full.to(like.device)
    from torch.distributed.tensor import distribute_tensor

    on_mesh = full.to(device=mesh.device_type, dtype=like.dtype)
    return distribute_tensor(on_mesh, mesh, like.placements)  # type: ignore[attr-defined]


@dataclass(slots=True)
class _Capture:
    """One version's state as the training thread hands it to the writer."""

    version: int
    version_hash: str
    origin: str | None
    tensors: Callable[[], dict[str, torch.Tensor]]
    """The tensors, read when called (live references: valid until the next optimizer update)."""
    trainer: dict[str, Any]
    key: Ed25519PrivateKey | None = None
    """Signs the state: the key that signs its version."""
    then: Callable[[], object] | None = None
    """What to do once the state is saved (or could not be): the version's commit."""
    copied: threading.Event = field(default_factory=threading.Event)
    started: float = field(default_factory=time.perf_counter)


def trained(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The parameters a state saves: those training changes (every one, or a LoRA run's adapter; its
    frozen base is the run's own, read back from the run on resume, and is not saved again with each
    state). A state that holds more (a LoRA state written before this rule) is read the same way."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def _capture(
    version: int,
    version_hash: str,
    origin: str | None,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    rng: random.Random,
    extra: dict[str, Any],
    *,
    sharded: bool,
) -> _Capture:
    names = {id(p): n for n, p in model.named_parameters()}
    steps: dict[str, float] = {}
    moments: list[tuple[str, torch.Tensor]] = []
    for group in opt.param_groups:
        for p in group["params"]:
            n = names.get(id(p))
            if n is None:
                raise StoreError("trainer state: the optimizer holds a parameter the model does not have")
            st = opt.state.get(p, {})
            moments += [(f"opt/{n}/{k}", st[k]) for k in ("exp_avg", "exp_avg_sq") if k in st]
            if "step" in st:
                steps[n] = float(st["step"])
    params = [(f"model/{n}", p) for n, p in trained(model).items()]

    def tensors() -> dict[str, torch.Tensor]:
        out = {k: _full(p).float().contiguous() for k, p in params}
        out.update((k, _full(t).contiguous()) for k, t in moments)
        return out

    if sharded:  # gathering is a collective: every rank gathers now, on the training thread
        gathered = tensors()
        tensors = lambda: gathered  # noqa: E731
    trainer = {
        "opt_steps": steps,
        "opt_groups": [{k: v for k, v in g.items() if k != "params" and _jsonable(v)} for g in opt.param_groups],
        "python_rng": _encode_rng(rng.getstate()),
        "torch_rng": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
        "extra": extra,
    }
    return _Capture(version, version_hash, origin, tensors, trainer)


MAX_FAILED_SAVES = 3
"""Trainer states that may fail to save in a row before the trainer stops."""


class StateWriter:
    """Saves the state of committed versions from a thread of its own, one at a time.

    :meth:`save` returns once it has captured what the next step would change outside the weights
    (RNG, step counts); :meth:`before_update` must run before the next optimizer update (it waits
    until the writer has copied the weights and moments); :meth:`flush` waits for everything.
    A failed save is logged and counted; the run goes on while the bucket holds an older state, and a
    restart rolls back to it (the next version records it). What follows a save (``then``, the
    version's commit) runs then whether or not the save succeeded. But a version is not committed when
    its state failed and the run has no saved state at all (a restart could not resume it), and
    :data:`MAX_FAILED_SAVES` failures in a row stop the trainer (each version would take a restart
    further back): both are raised by the next :meth:`flush` (or :meth:`save`) on the training thread,
    as a failure of what follows a save is."""

    def __init__(self, run: Run, *, write: bool = True) -> None:
        self.run = run
        self.write = write
        """False on the ranks of a sharded trainer other than rank 0: they only join the gathers."""
        self.cost = SaveCost()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aurora-state")
        self._pending: tuple[_Capture, Future[None]] | None = None
        self._lock = threading.Lock()
        self._failure: BaseException | None = None
        self._failed_in_row = 0
        self._resumable: bool | None = None
        """Whether the bucket holds a state a restart can resume from (None: not looked yet)."""

    def save(
        self,
        version: int,
        version_hash: str,
        origin: str | None,
        model: torch.nn.Module,
        opt: torch.optim.Optimizer,
        rng: random.Random,
        extra: dict[str, Any] | None = None,
        *,
        sharded: bool = False,
        then: Callable[[], object] | None = None,
    ) -> None:
        """Start saving the state of ``version`` (whose hash is ``version_hash``); ``then`` runs on the
        writer thread once the state is saved or failed to be (on a rank that does not write: at once)."""
        self.flush()  # one state at a time: a writer that falls behind holds the training thread here
        t0 = time.perf_counter()
        capture = _capture(version, version_hash, origin, model, opt, rng, extra or {}, sharded=sharded)
        capture.then, capture.key = then, self.run.signing_key  # after a key rotation, the new key
        if self.write:
            self._pending = (capture, self._pool.submit(self._write, capture))
        elif then is not None:
            then()
        self.cost.training_thread_s += time.perf_counter() - t0

    def before_update(self) -> None:
        """Wait until the pending state's tensors are copied (the next update may then move them)."""
        if self._pending is None:
            return
        t0 = time.perf_counter()
        capture, done = self._pending
        while not capture.copied.wait(0.05) and not done.done():
            pass
        self.cost.training_thread_s += time.perf_counter() - t0

    def flush(self) -> None:
        """Wait for the pending save to be committed (or to have failed) and what follows it; raise
        what that raised."""
        if self._pending is not None:
            t0 = time.perf_counter()
            self._pending[1].result()
            self._pending = None
            self.cost.training_thread_s += time.perf_counter() - t0
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    def close(self) -> None:
        """Finish the pending save and what follows it (a deferred commit is written), then stop the
        writer. A failure is logged, not raised: close runs while another error unwinds too."""
        try:
            self.flush()
        except Exception as exc:
            log.error("the last version's commit after its state failed: %s", exc)
        finally:
            self._pool.shutdown(wait=True)

    def _write(self, capture: _Capture) -> None:
        held_back: StoreError | None = None
        stop: StoreError | None = None
        try:
            error = self._save(capture)
            if error is None:
                self._failed_in_row, self._resumable = 0, True
            else:
                self._failed_in_row += 1
                v = capture.version
                if not self._has_state():
                    held_back = StoreError(
                        f"the trainer state of version {v} could not be saved ({error}), and the run has no saved "
                        f"state a restart could resume from: version {v} is not committed. Make the bucket "
                        "writable again and restart the trainer"
                    )
                elif self._failed_in_row >= MAX_FAILED_SAVES:
                    stop = StoreError(
                        f"{self._failed_in_row} trainer states in a row could not be saved (the last, version {v}'s: "
                        f"{error}); stopping, since a restart rolls back to the newest saved state and every "
                        "version makes that further. Make the bucket writable again and restart the trainer"
                    )
        finally:
            if capture.then is not None and held_back is None:
                try:
                    capture.then()
                except BaseException as exc:  # raised on the training thread by flush()
                    self._failure = exc
                with self._lock:
                    self.cost.followed += 1
                    self.cost.commit_delay_s += time.perf_counter() - capture.started
            if self._failure is None:
                self._failure = held_back or stop

    def _has_state(self) -> bool:
        """Whether a restart would find a state: one this writer saved, or one in the bucket already."""
        if self._resumable is None:
            try:
                self._resumable = bool(self.run.state.versions())
            except StoreError:
                return False  # cannot tell: the version is held back rather than risked
        return self._resumable

    def _save(self, capture: _Capture) -> str | None:
        """Save ``capture``; None, or why it failed (logged and counted)."""
        t0 = time.perf_counter()
        v = capture.version
        name = StateName.of(v, capture.version_hash)
        try:
            try:
                data = _serialise(capture.tensors())
            finally:
                capture.copied.set()
            tensors = trainer_state.TensorFile.of(TENSORS, data)
            doc = trainer_state.new(v, capture.version_hash, capture.origin, tensors, capture.trainer, capture.key)
            self.run.state.put(name, TENSORS, data)
            self.run.state.commit(name, doc.to_bytes())
            with self._lock:
                self.cost.saves += 1
                self.cost.bytes += len(data) + len(doc.to_bytes())
                self.cost.last_version = max(self.cost.last_version, v)
        except Exception as exc:
            log.error("could not save the trainer state of version %d: %s", v, exc)
            with self._lock:
                self.cost.failed += 1
                self.cost.errors = [*self.cost.errors[-9:], f"{v}: {exc}"]
            return f"{type(exc).__name__}: {exc}"[:300]
        finally:
            with self._lock:
                self.cost.writer_s += time.perf_counter() - t0
        return None


def save_state(
    run: Run,
    version: int,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    rng: random.Random,
    extra: dict[str, Any] | None = None,
    *,
    write: bool = True,
) -> None:
    """Save the state of committed ``version`` now, on this thread (under FSDP2 every rank calls it;
    only the one with ``write`` set writes). Raises what the save raised."""
    writer = StateWriter(run, write=write)
    try:
        sharded = any(getattr(p, "device_mesh", None) is not None for p in model.parameters())
        m = run.manifest(version)
        lineage = m.lineage
        origin = lineage.origin if lineage is not None else None
        writer.save(version, m.version_hash, origin, model, opt, rng, extra, sharded=sharded)
        writer.flush()
    finally:
        writer.close()
    if writer.cost.failed:
        raise StoreError(f"trainer state of version {version}: {writer.cost.errors[-1]}")


def _serialise(tensors: dict[str, torch.Tensor]) -> memoryview:
    """The tensors as one safetensors file, built with one copy of their bytes (safetensors' own
    ``save`` makes two, which for a large model is the difference between fitting in host memory
    and not)."""
    entries = []
    for name, t in sorted(tensors.items()):
        if t.dtype != torch.float32:
            raise StoreError(f"trainer state: {name} is {t.dtype}, expected float32")
        entries.append((name, "F32", tuple(t.shape), t.contiguous().numpy()))
    return memoryview(safetensors_file.build(entries))


def saved_versions(run: Run) -> list[int]:
    """Versions with a committed trainer state, ascending."""
    return run.state.versions()


def load_state(
    run: Run,
    version: int,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    rng: random.Random,
    *,
    trust_unsigned: bool = False,
) -> SavedState:
    """Restore the state saved for committed ``version`` into ``model``, ``opt`` and ``rng`` (in place),
    after checking it belongs to that version of this run (and its signature, in a signed run: there an
    unsigned state of the old format is refused unless ``trust_unsigned``, the operator's word that the run
    was written before states were signed). Raises CorruptError, ChainError, UnauthenticatedError or
    MissingError; the model is untouched then."""
    manifest = run.manifest(version)
    names = [n for n in run.state.names() if n.version == version and n.belongs_to(manifest.version_hash)]
    if not names:
        tag = manifest.version_hash[:16]
        raise MissingError(f"{run.state.store.uri}: no trainer state of version {version} ({tag})")
    name = max(names, key=lambda n: n.tag is not None)  # the one named by the hash, before a legacy one
    where = run.state.url(name)
    doc = checked(run.state, run.reader, name, manifest, trust_unsigned=trust_unsigned)
    cap = 12 * sum(p.numel() for p in model.parameters()) + (1 << 20)  # masters + two moments, + header
    data = run.state.get(name, TENSORS, max_bytes=cap)
    if doc.tensors is not None:
        doc.tensors.check(data, where)
    try:
        tensors = st_load(data)
        body = doc.trainer
        steps = body["opt_steps"]
        python_rng = _decode_rng(body["python_rng"])
        torch_rng = torch.frombuffer(bytearray(base64.b64decode(body["torch_rng"])), dtype=torch.uint8)
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptError(f"{where}: unreadable trainer state: {exc}"[:400]) from None
    params = trained(model)
    expected = {f"model/{n}" for n in params}
    if not expected <= set(tensors):
        raise CorruptError(f"{where}: state lacks {sorted(expected - set(tensors))[:3]}")
    for n, p in params.items():
        src = tensors[f"model/{n}"]
        if src.shape != p.shape:
            raise CorruptError(f"{where}: {n} has shape {tuple(src.shape)}, the model {tuple(p.shape)}")
        if n in steps and not {f"opt/{n}/exp_avg", f"opt/{n}/exp_avg_sq"} <= set(tensors):
            raise CorruptError(f"{where}: state lacks the optimizer moments of {n}")
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(_like(tensors[f"model/{n}"], p))
    for n, p in params.items():
        if n in steps:
            opt.state[p] = {
                "step": torch.tensor(float(steps[n])),
                "exp_avg": _like(tensors[f"opt/{n}/exp_avg"].clone(), p),
                "exp_avg_sq": _like(tensors[f"opt/{n}/exp_avg_sq"].clone(), p),
            }
    rng.setstate(python_rng)
    torch.set_rng_state(torch_rng)
    extra = body.get("extra", {})
    return SavedState(version, dict(extra) if isinstance(extra, dict) else {})


@dataclass(frozen=True, slots=True)
class Resumed:
    """What a restarted trainer continues from."""

    state: SavedState
    refused: dict[int, str]
    """Newer states that could not be used, and why."""


def resume_state(
    run: Run,
    latest: int,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    rng: random.Random,
    *,
    trust_unsigned: bool = False,
) -> Resumed:
    """Load the newest state at or below committed version ``latest`` that loads and verifies;
    skipped ones are logged. StoreError if none does."""
    refused: dict[int, str] = {}
    for v in reversed([v for v in saved_versions(run) if v <= latest]):
        try:
            return Resumed(load_state(run, v, model, opt, rng, trust_unsigned=trust_unsigned), refused)
        except StoreError as exc:
            log.warning("the trainer state of version %d cannot be used: %s", v, exc)
            refused[v] = str(exc)
    why = f" ({len(refused)} refused: {next(iter(refused.values()))})" if refused else ""
    raise StoreError(f"{run.uri}: version {latest} is published but no usable trainer state was saved{why}")


def _jsonable(v: object) -> bool:
    try:
        json.dumps(v, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def _encode_rng(state: tuple[Any, ...]) -> list[Any]:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _decode_rng(doc: Any) -> tuple[Any, ...]:
    if not isinstance(doc, list) or len(doc) != 3 or not isinstance(doc[1], list):
        raise ValueError("bad python_rng")
    return (doc[0], tuple(doc[1]), doc[2])
