"""The ``aurora`` backend of vLLM's weight-transfer API: versions applied by vLLM's own RL entry points.

vLLM (0.33.0, read from its source: ``vllm/distributed/weight_transfer/``) lets a backend registered by name
(``WeightTransferEngineFactory``) receive weight updates on every worker: ``LLM(...,
weight_transfer_config={"backend": "aurora"})``, then per version ``start_weight_update()``,
``update_weights({"update_info": ...})``, ``finish_weight_update()``. The actor process still
fetches, verifies and decodes each version from its region's bucket (one download per actor, not
per GPU); what reaches the workers is only the changed words, in one of two modes:

- ``mapped``: positions already translated into vLLM's fused, tensor-parallel parameters by
  :class:`~actor.engines.vllm.layout.VllmLayout`; the worker scatters them in place (the worker ops of
  :mod:`actor.engines.vllm.weights`): O(changed) per rank, bit-exact for every bit pattern.
- ``patches``: for layouts this project does not map (MoE experts, anything
  :class:`~actor.engines.vllm.layout.VllmLayout` refuses), patches in checkpoint (HF) coordinates that
  vLLM's ``load_checkpoint_weight_patches`` hands to the model's own ``load_weights``, so vLLM's
  loaders place them: whole tensors for a load, sparse ones for a delta. A sparse patch costs
  O(whole tensor) per rank (a NaN-filled staging copy), NaN values cannot be sent (NaN means
  "unchanged" there: refused before anything is staged), and a loader failure cannot be rolled
  back (the actor then stops: restart it).

Registration: vLLM creates the engine inside each worker process, so :func:`register` runs in
every process that imports this package's vLLM plugin (``vllm.general_plugins`` entry point
``aurora``) or the worker extension module. Nothing here imports vllm at import time.

Verified on vLLM 0.32's CPU build (``tests/test_vllm_engine.py``): the plugin registering the
backend in every worker before vLLM creates it, ``update_info`` crossing vLLM's msgpack channel
as packed here, both modes bit-exact through generation, and ``load_checkpoint_weight_patches``
on a Qwen3-MoE's loaders. Unverified without a GPU: the same on CUDA (MoE backends that rearrange
experts after loading included).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from actor.engines.vllm.kernels import WorkerTensors, worker_tensors
from actor.engines.vllm.weights import OPS, Runner, unpack
from aurora_store.errors import LayoutError, StoreError, UnsupportedError
from aurora_store.format.manifest import TensorSpec
from aurora_store.tensors import torch_dtype, word_tensor

log = logging.getLogger(__name__)

BACKEND = "aurora"
MODES = ("mapped", "patches")
WRITE_OPS = ("stage", "commit", "drop", "write", "vcommit")
"""Worker ops of :mod:`actor.engines.vllm.weights` that write; reads still go through the worker extension."""
PATCH_OPS = ("patch_stage", "patch_commit", "patch_drop")


@dataclass
class AuroraInitInfo:
    mode: str = "mapped"


@dataclass
class AuroraUpdateInfo:
    op: str
    args: list[Any] = field(default_factory=list)
    """The op's arguments, packed by :func:`actor.engines.vllm.weights.pack` (lists, strings, bytes)."""


def split_runner(tp: int, push: Callable[..., None], read: Runner) -> Runner:
    """A :data:`~actor.engines.vllm.weights.Runner` whose writes go to ``push(op, *args)`` (one weight
    update through vLLM's API, answered by no rank) and whose other ops go to ``read``."""

    def run(op: str, args: tuple[Any, ...]) -> list[Any]:
        if op in WRITE_OPS:
            push(op, *args)
            return [(rank, None) for rank in range(tp)]
        return read(op, args)

    return run


def word_values(spec: TensorSpec, words: np.ndarray) -> torch.Tensor:
    """Little-endian words of a floating tensor as a flat torch tensor of its dtype (the same bits)."""
    dt = torch_dtype(spec)
    if not dt.is_floating_point:
        raise LayoutError(
            f"{spec.name!r} is {spec.dtype}: vLLM's sparse checkpoint patches carry floating tensors only"
        )
    w = np.require(words, requirements=["C", "W"])  # torch wants a writable array (a copy only when it is not)
    return word_tensor(w).view(dt).reshape(-1)


def patch_values(spec: TensorSpec, words: np.ndarray) -> torch.Tensor:
    """:func:`word_values`, refusing NaN: vLLM's sparse patches use NaN to mean "leave this
    element", so a NaN cannot be sent."""
    values = word_values(spec, words)
    if bool(torch.isnan(values).any()):
        raise LayoutError(
            f"{spec.name!r}: the version sets a NaN, which vLLM's checkpoint patches cannot carry; this model's "
            "layout is not mapped in place, so the actor cannot follow it (use the torch engine)"
        )
    return values


class TransferCore:
    """What the engine does on one worker, without vLLM: ``receive(op, args)`` on ``model``.

    ``rank()`` gives the worker's tensor-parallel rank; ``apply_patches(model, patches)`` is
    vLLM's ``load_checkpoint_weight_patches`` on a GPU (patches are ``(name, shape, dtype,
    values, indices)`` tuples in checkpoint coordinates)."""

    def __init__(
        self,
        model: torch.nn.Module,
        rank: Callable[[], int],
        apply_patches: Callable[[torch.nn.Module, list[tuple[Any, ...]]], None] | None = None,
    ) -> None:
        self.model, self.rank, self.apply_patches = model, rank, apply_patches
        self.mode = "mapped"
        self.stash: dict[str, Any] = {}

    def init(self, mode: str) -> None:
        if mode not in MODES:
            raise StoreError(f"aurora weight transfer: mode {mode!r}, expected one of {MODES}")
        if mode == "patches" and self.apply_patches is None:
            raise UnsupportedError("aurora weight transfer: this vLLM has no checkpoint weight patches")
        self.mode = mode

    def params(self) -> WorkerTensors:
        return worker_tensors(self.model)

    def receive(self, op: str, args: list[Any]) -> None:
        args = unpack(list(args))
        if op in WRITE_OPS:
            OPS[op](self.rank(), self.params(), self.stash, *args)
        elif op == "patch_stage":  # may come in parts: each adds to what the token holds
            token, entries = args
            device = next(iter(self.params().values())).device
            self.stash.setdefault(token, []).extend(
                (name, tuple(int(d) for d in shape), torch_dtype(TensorSpec(name, dt, tuple(shape))), values, index)
                for name, dt, shape, values, index in (_patch(e, device) for e in entries)
            )
        elif op == "patch_commit":
            (token,) = args
            patches = self.stash.pop(token, None)
            if patches is None:
                raise StoreError(f"rank {self.rank()} holds no staged patches {token}")
            assert self.apply_patches is not None
            with self.params().checkpoint_format():
                self.apply_patches(self.model, patches)
        elif op == "patch_drop":
            self.stash.pop(args[0], None)
        else:
            raise StoreError(f"aurora weight transfer: unknown op {op!r}")

    def reset(self) -> None:
        """The model object was replaced (a reload): what was staged for the old one is dropped."""
        self.stash.clear()


def _patch(entry: list[Any], device: torch.device) -> tuple[str, str, list[int], torch.Tensor, torch.Tensor | None]:
    """One patch: sparse (positions and their words, NaN refused) or, with no positions, the whole
    tensor (a dense patch, which may hold any bits)."""
    name, dt, shape, index, words = entry
    spec = TensorSpec(name, dt, tuple(int(d) for d in shape))
    if index is None:
        whole = np.asarray(words)
        if whole.size != spec.numel:
            raise LayoutError(f"{name!r}: a whole-tensor patch of {whole.size} words, expected {spec.numel}")
        return name, dt, list(spec.shape), word_values(spec, whole).to(device), None
    values = patch_values(spec, np.asarray(words)).to(device)
    positions = torch.from_numpy(np.require(index, dtype=np.int64, requirements=["C", "W"])).to(device)
    if positions.numel() != values.numel():
        raise LayoutError(f"{name!r}: {positions.numel()} positions for {values.numel()} values")
    return name, dt, list(spec.shape), values, positions


def _vllm_patches(model: torch.nn.Module, patches: list[tuple[Any, ...]]) -> None:
    from vllm.model_executor.model_loader.checkpoint_weight_patch import (
        CheckpointWeightPatch,
        load_checkpoint_weight_patches,
    )

    load_checkpoint_weight_patches(model, [CheckpointWeightPatch(n, s, d, v, i) for n, s, d, v, i in patches])


def has_patches() -> bool:
    """Whether this vLLM has checkpoint weight patches (the ``patches`` mode)."""
    try:
        import vllm.model_executor.model_loader.checkpoint_weight_patch  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def engine_class() -> type:
    """The ``WeightTransferEngine`` subclass, built on first use (it subclasses vLLM's base)."""
    from vllm.distributed import get_tensor_model_parallel_rank
    from vllm.distributed.weight_transfer.base import WeightTransferEngine

    class AuroraWeightTransferEngine(WeightTransferEngine):  # type: ignore[misc,type-arg,unused-ignore]
        """Receives the changed words of each version (see the module's docstring)."""

        init_info_cls = AuroraInitInfo
        update_info_cls = AuroraUpdateInfo

        def __init__(self, config: Any, vllm_config: Any, device: Any, model: Any) -> None:
            super().__init__(config, vllm_config, device, model)
            self.core = TransferCore(model, get_tensor_model_parallel_rank, _vllm_patches if has_patches() else None)

        def init_transfer_engine(self, init_info: AuroraInitInfo) -> None:
            self.core.init(init_info.mode)

        def start_weight_update(self) -> None:
            if self.core.model is not self.model:  # vLLM swapped the target (a reload, a draft model)
                self.core.model = self.model
                self.core.reset()

        def receive_weights(self, update_info: AuroraUpdateInfo) -> None:
            self.core.receive(update_info.op, update_info.args)

        def finish_weight_update(self) -> None:
            """Writes land in place in receive_weights: nothing to finalise."""

        def shutdown(self) -> None:
            self.core.stash.clear()

        @staticmethod
        def trainer_send_weights(iterator: Any, trainer_args: Any) -> None:
            raise UnsupportedError(
                "the aurora backend has no trainer side: the trainer publishes versions to its bucket "
                "and each actor applies them (aurora train / aurora actor)"
            )

    missing = sorted(getattr(AuroraWeightTransferEngine, "__abstractmethods__", ()))
    if missing:
        raise UnsupportedError(f"this vLLM's WeightTransferEngine also requires {missing}: not implemented here")
    return AuroraWeightTransferEngine


def __getattr__(name: str) -> Any:
    """``AuroraWeightTransferEngine`` as a module attribute, for the factory's lazy import."""
    if name == "AuroraWeightTransferEngine":
        return engine_class()
    raise AttributeError(name)


def unavailable() -> str | None:
    """Why this vLLM cannot use the ``aurora`` backend, or None when it can."""
    try:
        from vllm import LLM
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory  # noqa: F401
    except ImportError as exc:
        return f"vLLM has no weight-transfer API ({exc})"
    for method in ("init_weight_transfer_engine", "start_weight_update", "update_weights", "finish_weight_update"):
        if not hasattr(LLM, method):
            return f"vLLM's LLM has no {method}()"
    try:
        engine_class()
    except (ImportError, UnsupportedError) as exc:
        return str(exc)
    return None


def register() -> None:
    """Register the backend with vLLM's factory (idempotent); a vLLM without the API is left alone.
    This is the ``vllm.general_plugins`` entry point, run in every vLLM process."""
    try:
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    except ImportError:
        return
    with contextlib.suppress(ValueError):  # already registered in this process
        WeightTransferEngineFactory.register_engine(BACKEND, __name__, "AuroraWeightTransferEngine")
