"""What a vLLM worker computes from, and how a write reaches it.

After loading, vLLM runs every layer's post-load processing (``quant_method.
process_weights_after_loading``). On CUDA, for the unquantized BF16 layers the actor maps, that
leaves the parameters as they were loaded: the engine computes from them, and a write in place
is the whole update. vLLM's CPU build does not (0.32, read in its source and seen on this
machine's engine):

- linear layers (``UnquantizedLinearMethod``, ``dispatch_cpu_unquantized_gemm``): the weight goes
  to a GEMM kernel that keeps a packed copy of its own (sgl-kernel's VNNI packing for weights up
  to 1 MiB on AMX CPUs, else a oneDNN handle), ``layer.cpu_linear`` calls it, and ``weight``
  becomes an empty tensor; an sgl-packed layer's bias is converted to FP32;
- vocabulary layers keep their weight (the embedding lookup reads it) but the logits GEMM reads a
  packed copy, made the same way;
- MoE experts (``CPUUnquantizedExperts``): ``w13_weight`` and ``w2_weight`` are replaced by
  VNNI-prepacked tensors, their intermediate size zero-padded first where the kernel needs it;
- INT8 W8A8 layers (``CPUInt8ScaledMMLinearKernel``): the weight is transposed and handed to a oneDNN
  handle (or VNNI-packed), the ``weight`` attribute set to None, and ``azp_adj`` derived from the
  weight and its scales; those derived parameters are not the checkpoint's and are not exposed.

Written in place, none of those would change what the engine computes. :class:`WorkerTensors`
is one worker's model as the aurora worker ops see it: vLLM parameter name -> the
checkpoint-format tensor to read and write. On CUDA that is the live parameter. On the CPU build,
every layer with a ``quant_method`` gets checkpoint-format tensors of its own, materialized from
the metadata vLLM recorded before loading (``model_loader/reload``: shape, dtype, parameter class
and weight loader; tied parameters share one), which the actor's first full load fills. After
every write, :meth:`WorkerTensors.written` puts the touched layers' checkpoint-format tensors back
and re-runs vLLM's own post-load processing on them, so the engine computes from exactly the
written bits, as an engine freshly loaded with them would. On CPU that costs a repack of the
touched layers per version (all of them at ~1% density: O(model); ``aurora bench engine``
measures it) and a second copy of the weights in memory; on CUDA nothing is rebuilt and a write
stays O(changed).

Not verified here: CUDA MoE backends that rearrange expert weights after loading (FlashInfer,
AITER), which the patches mode would then write past; on CUDA no layer is rebuilt. A processing
that changes a weight's shape, dtype or contiguity on CUDA (quantization, XPU's transposed
weights) fails the actor's layout check at bootstrap instead.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from aurora_store.errors import UnsupportedError

if TYPE_CHECKING:
    from actor.live import TensorWeights


@dataclass(slots=True, eq=False)
class Kernel:
    """A layer whose computation vLLM derives from its parameters after loading."""

    name: str
    module: torch.nn.Module
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    """Attribute -> the checkpoint-format tensor kept here (a parameter object of vLLM's class)."""
    bias: torch.Tensor | None = None
    """The bias in its checkpoint dtype, kept here (vLLM may convert the layer's own)."""

    def install(self) -> None:
        """Put the checkpoint-format tensors back on the layer (what vLLM's loaders write into)."""
        for attr, t in self.tensors.items():
            setattr(self.module, attr, t)
        if self.bias is not None:
            self.module.bias.data = self.bias

    def rebuild(self) -> None:
        """vLLM's own post-load processing again, on the checkpoint-format tensors."""
        with torch.no_grad():
            self.install()
            if hasattr(self.module, "_already_called_process_weights_after_loading"):
                delattr(self.module, "_already_called_process_weights_after_loading")  # as vLLM's reload does
            method: Any = self.module.quant_method
            if getattr(method, "moe_kernel", None) is not None:
                # vLLM (0.32) takes a second processing of an MoE layer for a weight update and then skips
                # the experts' own step, which on CPU prepacks them: the kernel would read unpacked weights.
                # Without the kernel, processing takes the fresh-load path, the prepack included.
                method.moe_kernel = None
            method.process_weights_after_loading(self.module)
            update_tp: Any = getattr(self.module, "update_param_tp_status", None)
            if update_tp is not None:
                update_tp()


class WorkerTensors(Mapping[str, torch.Tensor]):
    """vLLM parameter name -> checkpoint-format tensor; ``kernels`` maps a name to the layers
    rebuilt after it is written."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], kernels: Mapping[str, list[Kernel]] | None = None):
        self._tensors = dict(tensors)
        self._kernels = {k: list(v) for k, v in (kernels or {}).items()}
        self.last_commit: dict[str, float] = {}
        """Seconds the last staged write spent scattering and rebuilding, and its version spent being
        decoded here (the worker ops set it)."""
        self.stage_s: dict[str, float] = {}
        """token -> seconds ``vstage`` spent on it in this worker (parse, decode, check, prepare)."""
        self.hf: TensorWeights | None = None
        """This rank's tensors under HF names, views of the parameters above, with the versions
        staged against them (bound by the worker op ``bind`` after each load)."""
        self.hf_params: dict[str, str] = {}
        """HF name -> the parameter its view is of."""

    @classmethod
    def of(cls, model: torch.nn.Module, *, processed: bool | None = None) -> WorkerTensors:
        """A worker's model. ``processed``: whether vLLM's post-load processing derived what the
        layers compute from (default: on vLLM's CPU platform)."""
        tensors: dict[str, torch.Tensor] = dict(model.named_parameters())
        if not (_cpu_platform() if processed is None else processed):
            return cls(tensors)
        from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

        name_of = {id(t): name for name, t in tensors.items()}
        copies: dict[int, torch.Tensor] = {}  # a live parameter -> our copy (tied parameters share one)
        kernels: dict[str, list[Kernel]] = {}
        for mname, module in model.named_modules():
            if not isinstance(getattr(module, "quant_method", None), QuantizeMethodBase):
                continue
            kernel = Kernel(mname, module)
            own = dict(module.named_parameters(recurse=False))
            metadata = _checkpoint_metadata(mname, module)
            for attr in own.keys() - metadata.keys() - {"bias"}:  # derived by the processing (INT8's azp_adj)
                tensors.pop(f"{mname}.{attr}", None)
            for attr, meta in metadata.items():
                live = own.get(attr)
                if live is None:
                    if attr != "weight" or getattr(module, attr, None) is not None:
                        continue
                    # released by the processing (vLLM's CPU INT8 kernel keeps the packed weight in a
                    # oneDNN handle and sets the attribute to None): a copy of our own, by its name
                    name = f"{mname}.{attr}" if mname else attr
                    tensors[name] = kernel.tensors[attr] = _materialize(module, meta)
                    kernels.setdefault(name, []).append(kernel)
                    continue
                if id(live) not in name_of:
                    continue
                if id(live) not in copies:
                    copies[id(live)] = tensors[name_of[id(live)]] = _materialize(module, meta)
                kernel.tensors[attr] = copies[id(live)]
                kernels.setdefault(name_of[id(live)], []).append(kernel)
            bias = own.get("bias")
            if bias is not None and id(bias) in name_of and kernel.tensors:
                dtype = next(iter(kernel.tensors.values())).dtype  # loaded in the weights' dtype; FP32 holds it exactly
                kernel.bias = tensors[name_of[id(bias)]] = bias.detach().to(dtype).clone()
                kernels.setdefault(name_of[id(bias)], []).append(kernel)
        return cls(tensors, kernels)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def kernels(self) -> list[Kernel]:
        """Every layer rebuilt after a write, once each."""
        return list({id(k): k for ks in self._kernels.values() for k in ks}.values())

    def written(self, names: Iterable[str]) -> None:
        """Rebuild every kernel derived from the tensors ``names`` (each once)."""
        done: set[int] = set()
        for name in names:
            for kernel in self._kernels.get(name, ()):
                if id(kernel) not in done:
                    done.add(id(kernel))
                    kernel.rebuild()

    @contextlib.contextmanager
    def checkpoint_format(self) -> Iterator[None]:
        """The layers holding their checkpoint-format tensors while vLLM's own loaders write into
        them (checkpoint patches); every kernel is rebuilt afterwards, on failure too."""
        for kernel in self.kernels():
            kernel.install()
        try:
            yield
        finally:
            self.written(self._kernels)


def _cpu_platform() -> bool:
    try:
        from vllm.platforms import current_platform
    except ImportError:  # a model outside vLLM (the tests' stand-in workers): nothing was processed
        return False
    return bool(current_platform.is_cpu())


def _checkpoint_metadata(name: str, module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters ``module`` had before loading, as meta tensors (what vLLM recorded for reloads)."""
    try:
        from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info
    except ImportError as exc:
        raise UnsupportedError(
            f"vLLM processed {name}'s weights after loading and this vLLM keeps no reload metadata to restore "
            f"their checkpoint format ({exc}); the actor cannot write this engine's weights"
        ) from None
    return dict(get_layerwise_info(module).restore_metadata[0])


def _materialize(module: torch.nn.Module, meta: torch.Tensor) -> torch.Tensor:
    """An empty checkpoint-format parameter like ``meta``, its weight loader bound to ``module``."""
    from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info
    from vllm.model_executor.model_loader.reload.meta import materialize_meta_tensor
    from vllm.model_executor.model_loader.reload.sanitize import restore_layer_refs

    with get_layerwise_info(module).restore_device:
        tensor = materialize_meta_tensor(meta)
    return restore_layer_refs(tensor, module)


_BY_MODEL: weakref.WeakKeyDictionary[torch.nn.Module, WorkerTensors] = weakref.WeakKeyDictionary()


def worker_tensors(model: torch.nn.Module) -> WorkerTensors:
    """The one :class:`WorkerTensors` of ``model`` in this process: the worker extension (reads) and
    the weight-transfer engine (writes) must see the same checkpoint-format tensors."""
    got = _BY_MODEL.get(model)
    if got is None:
        got = _BY_MODEL[model] = WorkerTensors.of(model)
    return got
