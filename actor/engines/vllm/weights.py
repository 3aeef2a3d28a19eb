"""Live weights held in vLLM's own parameters: fused, possibly tensor-parallel, written in place.

:class:`VllmWeights` serves the :class:`~actor.live.LiveWeights` protocol under HF names and
translates every position through :class:`~actor.engines.vllm.layout.VllmLayout`; nothing but the
changed elements ever moves. The tensors are touched only by the small worker ops below,
which a *runner* executes on every TP rank: :class:`LocalRunner` loops over rank dicts in
this process (tests; tp=1 with the model in hand), and on vLLM ``LLM.collective_rpc(
"aurora_op", ...)`` reaches :class:`AuroraWorkerExtension`, mixed into each worker through
``worker_extension_cls``. Payloads are lists, strings and numpy arrays only, so they cross
vLLM's msgpack channel without its pickle fallback.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from actor.engines.vllm.kernels import WorkerTensors, worker_tensors
from actor.engines.vllm.layout import VOCAB_PADDING, Geometry, VllmLayout, narrow
from actor.live import TensorWeights
from actor.stager import Base, Staged
from aurora_store import errors
from aurora_store.codec import words as host
from aurora_store.codec.base import Lookup, Overlay
from aurora_store.errors import LayoutError, StoreError
from aurora_store.format.manifest import Manifest, TensorSpec
from aurora_store.format.manifest_parser import parse_manifest
from aurora_store.format.weights import full_digest
from aurora_store.tensors import torch_dtype, word_tensor, word_view

_ERRORS: dict[str, type[StoreError]] = {
    c.__name__: c
    for c in (
        errors.CorruptError,
        errors.LimitError,
        errors.ChainError,
        errors.MissingError,
        errors.LayoutError,
        errors.UnsupportedError,
        errors.UnauthenticatedError,
    )
}
"""The store's errors a rank may answer with, by name (anything else is a :class:`StoreError`)."""

Runner = Callable[[str, tuple[Any, ...]], list[Any]]
"""``runner(op, args)``: run worker op ``op`` with ``args`` on every TP rank; one result per rank."""

Params = WorkerTensors
"""A rank's tensors by vLLM parameter name; writes tell it which (their derived kernels are rebuilt)."""


# ---------------------------------------------------------------- worker ops (run on each rank)


@contextlib.contextmanager
def _decode_cores() -> Any:
    """Threads started inside the block may run on every core the engine's process may use.

    vLLM's CPU build pins a rank's main thread (and its OpenMP threads, which inherit it) to the cores it
    binds that rank to: one core of two on this project's machine, the other left to the engine core.
    Decoding a version is not the forward pass: the stager's and the codec's thread pools, and the rank
    indexes' build threads, all started by the first op that needs them, take the wider mask, so a
    version decodes on every core (measured: the stage of a 10%-changed SmolLM2 delta ran single-core).
    The calling thread gets its own mask back at the end. On one rank only: several ranks each keep
    their own share of the cores."""
    try:
        mine = os.sched_getaffinity(0)
        wide = mine | os.sched_getaffinity(os.getppid())
    except (AttributeError, OSError):  # not Linux, or the parent is gone: as vLLM set it
        wide = mine = set()
    if wide == mine:
        yield
        return
    os.sched_setaffinity(0, wide)
    try:
        yield
    finally:
        os.sched_setaffinity(0, mine)


def _tensor(a: np.ndarray) -> torch.Tensor:
    """Signed-integer torch view of little-endian words (copied only when read-only)."""
    a = np.asarray(a)
    return word_tensor(a if a.flags.writeable else a.copy())


def op_describe(rank: int, params: Params, stash: dict[str, Any]) -> tuple[int, dict[str, list[Any]]]:
    """Every parameter's shape, dtype and contiguity."""
    info = {n: [list(p.shape), str(p.dtype).removeprefix("torch."), p.is_contiguous()] for n, p in params.items()}
    return rank, info


def op_gather(rank: int, params: Params, stash: dict[str, Any], plan: list[list[Any]]) -> tuple[int, list[np.ndarray]]:
    """Words at ``(param, flat positions)`` for this rank's entries of ``plan``."""
    out = []
    for name, idx in plan[rank]:
        flat = word_view(params[name]).view(-1)
        got = flat[_tensor(idx).to(flat.device)].cpu().numpy()
        out.append(got.view(f"<u{got.dtype.itemsize}"))
    return rank, out


def op_stage(rank: int, params: Params, stash: dict[str, Any], token: str, plan: list[list[Any]]) -> tuple[int, None]:
    """Copy this rank's ``(param, positions, words)`` to the parameters' device, under ``token``."""
    staged = []
    for name, idx, words in plan[rank]:
        flat = word_view(params[name]).view(-1)
        staged.append((name, flat, _tensor(idx).to(flat.device), _tensor(words).to(flat.device)))
    stash[token] = staged
    return rank, None


def op_commit(rank: int, params: Params, stash: dict[str, Any], token: str) -> tuple[int, None]:
    """Scatter what :func:`op_stage` put under ``token``, then rebuild what the engine derived from it."""
    staged = stash.pop(token, None)
    if staged is None:
        raise StoreError(f"rank {rank} holds no staged write {token}")
    t0 = time.perf_counter()
    with torch.no_grad():
        for _, flat, idx, val in staged:
            flat.index_copy_(0, idx, val)  # positions are unique
    if any(flat.is_cuda for _, flat, _, _ in staged):
        torch.cuda.synchronize()
    t1 = time.perf_counter()
    params.written(name for name, *_ in staged)
    params.last_commit = {"scatter_s": t1 - t0, "rebuild_s": time.perf_counter() - t1}
    return rank, None


def op_last_commit(rank: int, params: Params, stash: dict[str, Any]) -> tuple[int, dict[str, float]]:
    """Seconds the last commit on this rank spent scattering the changed words and rebuilding what
    vLLM derives from them (its CPU build's packed kernels; nothing on CUDA)."""
    return rank, dict(params.last_commit)


def op_drop(rank: int, params: Params, stash: dict[str, Any], token: str) -> tuple[int, None]:
    stash.pop(token, None)
    return rank, None


def op_write(rank: int, params: Params, stash: dict[str, Any], batch: list[list[Any]]) -> tuple[int, None]:
    """Copy slabs ``[target rank or -1, param, dim, start, length, words or None (zeros), shape]``, then
    rebuild what the engine derived from the tensors written."""
    names = []
    with torch.no_grad():
        for target, name, dim, start, length, words, shape in batch:
            if target not in (-1, rank):
                continue
            dst = word_view(params[name])
            if dst.dim():
                dst = dst.narrow(dim, start, length)
            if words is None:
                dst.zero_()
            else:
                dst.copy_(_tensor(words).reshape(shape))
            names.append(name)
    params.written(names)
    return rank, None


def op_dump(rank: int, params: Params, stash: dict[str, Any], plan: list[list[str]]) -> tuple[int, dict[str, Any]]:
    """Words of this rank's listed parameters (an O(model) copy: audits only)."""
    out = {}
    for name in plan[rank]:
        got = word_view(params[name]).reshape(-1).cpu().numpy()
        out[name] = got.view(f"<u{got.dtype.itemsize}")
    return rank, out


# ------------------------------------------------ versions decoded where the weights live (tp = 1)


def op_bind(
    rank: int, params: Params, stash: dict[str, Any], specs: list[list[Any]], geometry: list[Any], vocab_padding: int
) -> tuple[int, None]:
    """Hold this rank's tensors under HF names, as views of its parameters (the layout of ``specs``),
    to stage versions against: after every load, whose writes it follows (its rank indexes are
    rebuilt from the new words in the background)."""
    specs_ = tuple(TensorSpec(str(n), str(d), tuple(int(x) for x in shape)) for n, d, shape in specs)
    layout = VllmLayout(specs_, Geometry(*geometry), 1, vocab_padding=vocab_padding)
    views = {}
    for s in layout.specs:
        rule = layout.rule(s.name)
        p = params[rule.param]
        if p.dtype != torch_dtype(s) or not p.is_contiguous():
            raise LayoutError(
                f"rank {rank}: {rule.param} is {p.dtype}, contiguous {p.is_contiguous()}; {s.name} is {s.dtype}"
            )
        views[s.name] = p.narrow(0, rule.offset, s.shape[0]) if rule.dim == 0 else p
        if tuple(views[s.name].shape) != s.shape:
            raise LayoutError(f"rank {rank}: {s.name} {list(s.shape)} does not fit {rule.param} {list(p.shape)}")
    if params.hf is not None:
        params.hf.stager.clear()
    params.hf = TensorWeights(views, device=next(iter(views.values())).device if views else "cpu")
    with _decode_cores():
        params.hf.warm()
    params.hf_params = {s.name: layout.rule(s.name).param for s in layout.specs}
    return rank, None


def _hf(rank: int, params: Params) -> TensorWeights:
    if params.hf is None:
        raise StoreError(f"rank {rank} holds no version to stage against: load one first")
    return params.hf


def op_vstage(
    rank: int, params: Params, stash: dict[str, Any], token: str, base: Any, manifest: bytes, data: list[bytes]
) -> tuple[int, Any]:
    """Decode a delta's segments against this rank's weights and keep it staged under ``token``
    (:class:`~actor.stager.Stager`): the version, its hash and digest, elements changed and bytes held;
    or ``{"error": [kind, message]}``, nothing staged."""
    t0 = time.perf_counter()
    try:
        m = parse_manifest(bytes(manifest), what="the staged manifest")
        on = base if isinstance(base, str) else Base(int(base[0]), str(base[1]), str(base[2]))
        with _decode_cores():
            answer = list(_hf(rank, params).stager.stage(token, on, m, data))
        params.stage_s[token] = time.perf_counter() - t0
        return rank, answer
    except Exception as exc:  # returned, not raised: every rank answers, and the actor drops the rest
        return rank, {"error": [type(exc).__name__, f"rank {rank}: {exc}"]}


def op_vcommit(rank: int, params: Params, stash: dict[str, Any], token: str) -> tuple[int, None]:
    """Write what ``token`` staged into the parameters, then rebuild what the engine derived from them."""
    hf = _hf(rank, params)
    t0 = time.perf_counter()
    names = hf.stager.commit(token)
    if any(t.is_cuda for t in hf.tensors.values()):
        torch.cuda.synchronize()
    t1 = time.perf_counter()
    params.written({params.hf_params[n] for n in names})
    stage_s = params.stage_s.get(token, 0.0)
    params.stage_s.clear()  # the commit drops every other staging
    params.last_commit = {"scatter_s": t1 - t0, "rebuild_s": time.perf_counter() - t1, "stage_s": stage_s}
    return rank, None


def op_vdrop(rank: int, params: Params, stash: dict[str, Any], token: str) -> tuple[int, None]:
    params.stage_s.pop(token, None)
    if params.hf is not None:
        params.hf.stager.drop(token)
    return rank, None


def op_readback(rank: int, params: Params, stash: dict[str, Any]) -> tuple[int, str | None]:
    """The digest after the last commit, from the words its positions hold now (O(changed))."""
    return rank, _hf(rank, params).stager.readback()


def op_digest(rank: int, params: Params, stash: dict[str, Any]) -> tuple[int, str]:
    """The weights digest of this rank's tensors, computed here: O(model) work, one string back."""
    return rank, _hf(rank, params).digest()


def op_rebuild(rank: int, params: Params, stash: dict[str, Any]) -> tuple[int, float]:
    """Seconds to re-run vLLM's post-load processing of every layer on the weights it holds (what a
    write costs at least on its CPU build: the repack floor)."""
    t0 = time.perf_counter()
    params.written(list(params))
    return rank, time.perf_counter() - t0


OPS: dict[str, Callable[..., tuple[int, Any]]] = {
    "rebuild": op_rebuild,
    "bind": op_bind,
    "vstage": op_vstage,
    "vcommit": op_vcommit,
    "vdrop": op_vdrop,
    "digest": op_digest,
    "readback": op_readback,
    "describe": op_describe,
    "gather": op_gather,
    "stage": op_stage,
    "commit": op_commit,
    "drop": op_drop,
    "last_commit": op_last_commit,
    "write": op_write,
    "dump": op_dump,
}


class LocalRunner:
    """Runs worker ops in this process over one parameter dict per rank."""

    def __init__(self, ranks: Sequence[Mapping[str, torch.Tensor]]) -> None:
        self.ranks = [WorkerTensors(r) for r in ranks]
        self.stash: list[dict[str, Any]] = [{} for _ in ranks]

    def __call__(self, op: str, args: tuple[Any, ...]) -> list[Any]:
        return [OPS[op](r, params, self.stash[r], *args) for r, params in enumerate(self.ranks)]


_ND = "__aurora_ndarray__"


def pack(obj: Any) -> Any:
    """``obj`` with every numpy array as ``{_ND: [dtype, shape, bytes]}`` and tuples as lists:
    only types msgpack carries natively, so nothing depends on vLLM's own array encoding."""
    if isinstance(obj, np.ndarray):
        return {_ND: [obj.dtype.str, list(obj.shape), np.ascontiguousarray(obj).tobytes()]}
    if isinstance(obj, list | tuple):
        return [pack(x) for x in obj]
    if isinstance(obj, dict):
        return {k: pack(v) for k, v in obj.items()}
    return obj


def unpack(obj: Any) -> Any:
    """The inverse of :func:`pack`."""
    if isinstance(obj, dict):
        if set(obj) == {_ND}:
            dtype, shape, data = obj[_ND]
            return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape)
        return {k: unpack(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [unpack(x) for x in obj]
    return obj


class AuroraWorkerExtension:
    """Mixed into vLLM's workers (``worker_extension_cls="actor.engines.vllm.weights.AuroraWorkerExtension"``);
    reached by ``LLM.collective_rpc("aurora_op", args=(op, *pack(args)))``."""

    def aurora_op(self, op: str, *args: Any) -> Any:
        from vllm.distributed import get_tensor_model_parallel_rank

        getter = getattr(self, "get_model", None)
        model = getter() if getter is not None else self.model_runner.model  # type: ignore[attr-defined]
        cache = self.__dict__.setdefault("_aurora", {})
        if cache.get("model") is not model:
            cache.update(model=model, stash={})
        rank = get_tensor_model_parallel_rank()
        return pack(OPS[op](rank, worker_tensors(model), cache["stash"], *unpack(list(args))))


# ---------------------------------------------------------------- the LiveWeights side


@dataclass(frozen=True, slots=True)
class _Prepared:
    token: str | None


class VllmWeights:
    """:class:`~actor.live.LiveWeights` over vLLM-layout parameters on ``tp_size`` ranks.

    Give ``ranks`` (one dict of vLLM parameter name -> tensor per rank, e.g. a worker's
    ``model.named_parameters()``) or a ``runner`` and ``tp_size``. ``after_write`` runs after
    every load and commit (the vLLM engine resets its prefix cache there)."""

    def __init__(
        self,
        geometry: Geometry,
        *,
        ranks: Sequence[Params] | None = None,
        runner: Runner | None = None,
        tp_size: int | None = None,
        vocab_padding: int = VOCAB_PADDING,
        after_write: Callable[[], None] | None = None,
        batch_bytes: int = 256 << 20,
    ) -> None:
        if (ranks is None) == (runner is None):
            raise StoreError("VllmWeights needs exactly one of ranks= or runner=")
        if ranks is not None:
            runner, tp_size = LocalRunner(ranks), len(ranks)
        if tp_size is None or tp_size < 1:
            raise StoreError(f"VllmWeights needs tp_size >= 1, got {tp_size}")
        assert runner is not None
        self.geometry = geometry
        self.runner = runner
        self.tp_size = tp_size
        self.vocab_padding = vocab_padding
        self.after_write = after_write
        self.batch_bytes = batch_bytes
        self.layout: VllmLayout | None = None
        self.bytes_in = 0
        """Bytes of manifests and segments handed to the workers to stage versions, since start."""

    def _run(self, op: str, *args: Any) -> list[Any]:
        """Results of ``op`` in rank order, checked to come from each rank exactly once."""
        results = sorted(self.runner(op, args), key=lambda r: int(r[0]))
        if [int(r[0]) for r in results] != list(range(self.tp_size)):
            got = [int(r[0]) for r in results]
            raise LayoutError(f"worker op {op!r} answered from ranks {got}, expected 0..{self.tp_size - 1}")
        return [r[1] for r in results]

    def _need(self) -> VllmLayout:
        if self.layout is None:
            raise StoreError("vLLM live weights hold no version yet: load() one first")
        return self.layout

    def check(self, specs: tuple[TensorSpec, ...]) -> None:
        """Raise :class:`LayoutError` unless every rank's parameters are exactly where the layout of
        ``specs`` puts them (names, shapes, dtypes, contiguous): a layout the engine does not hold
        is refused before anything is written."""
        self._check_live(VllmLayout(specs, self.geometry, self.tp_size, vocab_padding=self.vocab_padding))

    def _check_live(self, layout: VllmLayout) -> None:
        want = {}
        for name, (shape, dt) in layout.params.items():
            torch_dt = torch_dtype(TensorSpec(name, dt, shape))
            want[name] = [list(shape), str(torch_dt).removeprefix("torch."), True]
        for rank, have in enumerate(self._run("describe")):
            if have != want:
                missing = sorted(set(want) - set(have))[:3]
                extra = sorted(set(have) - set(want))[:3]
                wrong = [f"{n}: {have[n]} != {want[n]}" for n in sorted(set(have) & set(want)) if have[n] != want[n]]
                raise LayoutError(
                    f"vLLM rank {rank}'s parameters do not match the version's layout: missing {missing}, "
                    f"extra {extra}, mismatched {wrong[:3]} ([shape, dtype, contiguous])"
                )

    def _written(self) -> None:
        if self.after_write is not None:
            self.after_write()

    # ------------------------------------------------------------ LiveWeights

    def load(self, specs: tuple[TensorSpec, ...], words: Mapping[str, np.ndarray]) -> None:
        layout = VllmLayout(specs, self.geometry, self.tp_size, vocab_padding=self.vocab_padding)
        for s in layout.specs:
            w = words.get(s.name)
            if w is None or w.size != s.numel or w.dtype.itemsize != s.width:
                raise LayoutError(f"{s.name!r}: expected {s.numel} words of {s.width} bytes")
        self._check_live(layout)
        batch: list[list[Any]] = [[r.rank, r.param, 0, r.param_start, r.length, None, []] for r in layout.padding()]
        size = 0
        for s in layout.specs:
            arr = np.asarray(words[s.name]).reshape(s.shape)
            replicated = layout.rule(s.name).dim is None
            for reg in layout.regions(s.name, write=not replicated):  # replicated: one slab for all ranks
                slab = np.ascontiguousarray(narrow(arr, reg.dim, reg.hf_start, reg.length))
                target = -1 if replicated else reg.rank
                batch.append([target, reg.param, reg.dim, reg.param_start, reg.length, slab, list(slab.shape)])
                size += slab.nbytes
                if size >= self.batch_bytes:
                    self._run("write", batch)
                    batch, size = [], 0
        if batch:
            self._run("write", batch)
        self.layout = layout
        if self.stages_in_place:
            spec_list = [[sp.name, sp.dtype, list(sp.shape)] for sp in layout.specs]
            g = self.geometry
            self._run("bind", spec_list, [g.num_heads, g.num_kv_heads, g.head_dim, g.tied], self.vocab_padding)
        self._written()

    def at(self, name: str, index: np.ndarray) -> np.ndarray:
        layout = self._need()
        width = layout.rule(name).spec.width
        pieces = layout.pieces(name, index, write=False)
        out = np.empty(np.asarray(index).shape, dtype=f"<u{width}")
        if not pieces:
            return out
        plan: list[list[Any]] = [[] for _ in range(self.tp_size)]
        for p in pieces:
            plan[p.rank].append([p.param, p.local])
        got = self._run("gather", plan)
        seen = [0] * self.tp_size
        for p in pieces:
            out[p.select] = got[p.rank][seen[p.rank]]
            seen[p.rank] += 1
        return out

    def locate(self, name: str, lo: int, hi: int, lookup: Lookup, over: Overlay | None = None) -> Overlay:
        """The host pass, over a gather of every position of the range through the workers (O(range)
        over the RPC: the device-side class walk that would avoid it is not built)."""
        return host.locate(self.at(name, np.arange(lo, hi, dtype=np.int64)), lookup, over)

    def prepare(
        self,
        changes: Mapping[str, tuple[np.ndarray, np.ndarray]],
        replaced: Mapping[str, np.ndarray] | None = None,
        over: Mapping[str, np.ndarray] | None = None,
    ) -> object:
        layout = self._need()
        plan: list[list[Any]] = [[] for _ in range(self.tp_size)]
        for name, (idx, words) in changes.items():
            width = layout.rule(name).spec.width
            if np.shape(words) != np.shape(idx) or np.asarray(words).dtype.itemsize != width:
                raise LayoutError(f"{name!r}: expected one {width}-byte word per position")
            for p in layout.pieces(name, idx, write=True):
                plan[p.rank].append([p.param, p.local, words if p.select.size == words.size else words[p.select]])
        if not any(plan):
            return _Prepared(None)
        token = uuid.uuid4().hex
        try:
            self._run("stage", token, plan)
        except BaseException:
            with contextlib.suppress(Exception):
                self._run("drop", token)
            raise
        return _Prepared(token)

    def commit(self, prepared: object) -> None:
        assert isinstance(prepared, _Prepared)
        if prepared.token is not None:
            self._run("commit", prepared.token)
            self._written()

    def discard(self, prepared: object) -> None:
        """Free what :meth:`prepare` staged on the workers without writing it."""
        assert isinstance(prepared, _Prepared)
        if prepared.token is not None:
            self._run("drop", prepared.token)

    # ------------------------------------------------------------ decoded where the weights live

    @property
    def stages_in_place(self) -> bool:
        """On one rank, versions are decoded inside the worker against its own parameters. Over
        several ranks each rank would need the class counts of the others' slices of a tensor
        (docs/ARCHITECTURE.md, "Decoding under tensor parallelism"): not built, so the actor decodes on
        the host against words it gathers from the ranks (:meth:`locate`: O(model) over the RPC)."""
        return self.tp_size == 1

    def stage_version(self, base: Staged | Base, m: Manifest, data: Sequence[memoryview]) -> Staged:
        """The delta's manifest and segment bytes go to every rank, which decodes, checks and keeps it
        (worker op ``vstage``); a failure on any rank drops what every rank staged."""
        self._need()
        if not self.stages_in_place:
            raise errors.UnsupportedError(f"versions are not decoded inside {self.tp_size} tensor-parallel ranks")
        token = uuid.uuid4().hex
        on: Any = base.token if isinstance(base, Staged) else [base.version, base.version_hash, base.digest]
        manifest, segments = m.to_bytes(), [bytes(d) for d in data]
        self.bytes_in += len(manifest) + sum(len(d) for d in segments)
        answers = self._run("vstage", token, on, manifest, segments)
        failed = [a["error"] for a in answers if isinstance(a, dict)]
        if failed or len({tuple(a) for a in answers}) != 1:
            with contextlib.suppress(Exception):
                self._run("vdrop", token)
            if not failed:
                raise StoreError(f"version {m.version}: the ranks staged different versions: {answers}")
            kind, message = failed[0]
            raise _ERRORS.get(str(kind), StoreError)(f"version {m.version}: {message}")
        return Staged.answered(token, base, answers[0])

    def commit_staged(self, staged: Staged) -> None:
        self._run("vcommit", staged.token)
        self._written()

    def drop_staged(self, staged: Staged) -> None:
        self._run("vdrop", staged.token)

    def digest(self) -> str:
        """The weights digest of what the engine holds, computed inside it (O(model) work there,
        nothing but the digest crossing); the gathered snapshot where versions are not decoded there."""
        if not self.stages_in_place:
            specs, words = self.snapshot()
            return full_digest(specs, words).hex()
        self._need()
        return str(self._run("digest")[0])

    def readback(self) -> str | None:
        if not self.stages_in_place:
            return None
        self._need()
        got = self._run("readback")[0]
        return None if got is None else str(got)

    def snapshot(self) -> tuple[tuple[TensorSpec, ...], dict[str, np.ndarray]]:
        layout = self._need()
        plan: list[list[str]] = [[] for _ in range(self.tp_size)]
        for s in layout.specs:
            for reg in layout.regions(s.name, write=False):
                if reg.param not in plan[reg.rank]:
                    plan[reg.rank].append(reg.param)
        dumps = self._run("dump", plan)
        words = {}
        for s in layout.specs:
            out = np.empty(s.shape, dtype=f"<u{s.width}")
            for reg in layout.regions(s.name, write=False):
                src = dumps[reg.rank][reg.param].reshape(layout.params[reg.param][0])
                narrow(out, reg.dim, reg.hf_start, reg.length)[...] = narrow(src, reg.dim, reg.param_start, reg.length)
            words[s.name] = out.reshape(-1)
        return layout.specs, words
