"""The vLLM rollout engine: generation with ``vllm.LLM``, live weights written in place on its workers.

The engine loads a local model directory (an ``aurora replay`` output) and exposes its
parameters as live weights under HF names. Where the installed vLLM offers its weight-transfer
API, every write goes through it, to the ``aurora`` backend (:mod:`actor.engines.vllm.transfer`), so vLLM
knows each update and tracks the weight version; older vLLMs are written through
:class:`~actor.engines.vllm.weights.AuroraWorkerExtension` (``worker_extension_cls``), reached by
``LLM.collective_rpc("aurora_op", ...)``, which also serves reads in every mode. Layouts mapped
here (:class:`~actor.engines.vllm.layout.VllmLayout`: dense Qwen/Llama-style models, any TP) are written
as the changed BF16 words, straight into the fused, TP-sharded parameters
(:class:`~actor.engines.vllm.weights.VllmWeights`); layouts not mapped here (MoE) are handed to vLLM's
own loaders as checkpoint patches (:class:`~actor.engines.vllm.patch_weights.VllmPatchWeights`), which
needs the weight-transfer API. Which of the two is decided from what vLLM made of the model once it
has loaded it (its parameters' names, shapes and dtypes), not from the checkpoint alone. Arrays
cross as bytes (:func:`~actor.engines.vllm.weights.pack`), needing neither vLLM's array encoding nor its
pickle fallback. Where vLLM derived what it computes from the loaded weights (its CPU build repacks
every linear layer and the MoE experts), the workers rebuild that after every write
(:mod:`actor.engines.vllm.kernels`).

KV blocks computed under the old weights would be reused by prefix caching, so it is off by
default and, when enabled, reset after every write, the reset's refusal being an error. CUDA
graphs capture parameter addresses, not values, so in-place writes are safe with them too;
``enforce_eager`` defaults to True for start-up time and simpler debugging. vllm is imported only
inside :class:`VllmEngine`, so this module imports without it.

Verified on vLLM 0.32's CPU build (``tests/test_vllm_engine.py``, run by ``make test``): the backend
registering in the workers through the ``vllm.general_plugins`` entry point; both modes bit-exact
through generation against a vanilla engine started from the same version (tokens and
log-probabilities); the prefix cache never serving KV blocks of an older version; tensor
parallelism over 2 CPU ranks; a Qwen3-MoE through checkpoint patches; ``logprobs_mode=
"processed_logprobs"`` giving log-probabilities after temperature, as
:class:`~actor.engines.base.Completion` requires. Unverified without a GPU: CUDA kernels, NCCL between
ranks, CUDA graphs, and vLLM 0.33 (no CPU build of it is published). ``LLM`` is not thread-safe,
so generation and every weight op hold one lock: staging's reads of parent words wait for the
running batch, while fetching and verifying segments still overlap it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from actor.engines.base import Completion
from actor.engines.vllm import transfer as vllm_transfer
from actor.engines.vllm.layout import Geometry, VllmLayout
from actor.engines.vllm.patch_weights import VllmPatchWeights
from actor.engines.vllm.weights import VllmWeights, pack, unpack
from aurora_store.errors import LayoutError, StoreError, UnsupportedError
from aurora_store.format.manifest import TensorSpec

if TYPE_CHECKING:
    from vllm import LLM

EXTENSION = "actor.engines.vllm.weights.AuroraWorkerExtension"
TRANSFER_CHOICES = ("auto", "native", "extension", "patches")
_SEED_MASK = (1 << 63) - 1
_RESET_TRIES = 50
_RESET_WAIT_S = 0.02
log = logging.getLogger(__name__)


def model_specs(model_dir: str) -> tuple[TensorSpec, ...]:
    """The tensors of a HF directory's safetensors files, from their headers only."""
    from safetensors import safe_open

    specs = []
    for path in _safetensors(model_dir):
        with safe_open(path, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                part = f.get_slice(name)
                specs.append(TensorSpec(name, part.get_dtype(), tuple(int(d) for d in part.get_shape())))
    return tuple(sorted(specs, key=lambda s: s.name))


def _safetensors(model_dir: str) -> list[str]:
    paths = sorted(os.path.join(model_dir, n) for n in os.listdir(model_dir) if n.endswith(".safetensors"))
    if not paths:
        raise StoreError(f"{model_dir}: no safetensors files")
    return paths


def choose_transfer(choice: str, config: dict[str, Any], specs: tuple[TensorSpec, ...], tp: int) -> tuple[bool, str]:
    """Whether writes go through vLLM's weight-transfer API, and in which mode: ``mapped`` (this
    project's in-place layout) or ``patches`` (vLLM's loaders: for layouts not mapped here, or
    when ``choice`` asks for them)."""
    if choice not in TRANSFER_CHOICES:
        raise StoreError(f"weight transfer {choice!r}: expected one of {TRANSFER_CHOICES}")
    reason = vllm_transfer.unavailable() if choice != "extension" else "the worker extension was asked for"
    if reason is None and not vllm_transfer.has_patches():
        patches_reason: str | None = "this vLLM has no checkpoint weight patches (model_loader.checkpoint_weight_patch)"
    else:
        patches_reason = reason
    if choice in ("native", "patches") and reason is not None:
        raise UnsupportedError(f"vLLM's weight-transfer API cannot be used: {reason}")
    if choice == "patches":
        if patches_reason is not None:
            raise UnsupportedError(f"vLLM's checkpoint weight patches cannot be used: {patches_reason}")
        return True, "patches"
    try:
        VllmLayout(specs, Geometry.from_config(config), tp)
    except LayoutError as exc:
        if patches_reason is not None:
            raise LayoutError(
                f"{exc}; a layout not mapped here needs vLLM's own loaders through its weight-transfer API, "
                f"which cannot be used: {patches_reason}"
            ) from None
        return True, "patches"
    return reason is None, "mapped"


def cpu_settings(tp: int, llm_kwargs: dict[str, Any]) -> None:
    """What vLLM's CPU build needs to run this engine (nothing elsewhere), each unless the caller set it:

    - each of ``tp`` ranks gets its own share of this process's cores (``VLLM_CPU_OMP_THREADS_BIND``):
      by default vLLM binds a rank per NUMA node and refuses more ranks than nodes ("Not enough
      allowed NUMA nodes to bind threads of 2 local CPUWorkers"), every TP engine on one node;
    - no chunked prefill: a seeded request whose prefill is split has its sampled token discarded,
      and vLLM 0.32 then rewinds the request's generator with ``set_offset``, which a CPU generator
      does not have ("CPU Generator does not use offset"): the engine core dies. Every request here
      is seeded, and a batch of prompts longer than one step's token budget is split.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    llm_kwargs.setdefault("enable_chunked_prefill", False)
    if tp < 2 or "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < tp:
        raise UnsupportedError(f"{tp} tensor-parallel ranks on vLLM's CPU build need {tp} cores; this has {len(cores)}")
    share = len(cores) // tp
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(
        ",".join(str(c) for c in cores[r * share : (r + 1) * share]) for r in range(tp)
    )


class _NoTokenizerWarmup(logging.Filter):
    """vLLM 0.32 warms its chat-template renderer up at start and logs the failure with a traceback when
    the tokenizer is skipped (as here: prompts arrive as token ids). Nothing is wrong; say nothing."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Chat template warmup failed")


def quiet_tokenizer_warmup() -> None:
    logger = logging.getLogger("vllm.renderers.base")
    if not any(isinstance(f, _NoTokenizerWarmup) for f in logger.filters):
        logger.addFilter(_NoTokenizerWarmup())


def prompt_seeds(seed: int, prompts: int, samples: int) -> list[int]:
    """One seed per prompt, spaced by ``samples`` so that vLLM's child seeds (seed + i) never collide."""
    return [(seed * 1_000_003 + p * samples) & _SEED_MASK for p in range(prompts)]


def completions(outputs: Sequence[Any], samples: int) -> list[list[Completion]]:
    """vLLM ``RequestOutput`` objects -> completions in prompt order, samples ordered by index."""
    out = []
    for req in outputs:
        done = sorted(req.outputs, key=lambda c: c.index)
        if len(done) != samples:
            raise StoreError(f"vLLM returned {len(done)} samples for a prompt, expected {samples}")
        row = []
        for c in done:
            ids = tuple(int(t) for t in c.token_ids)
            if c.logprobs is None or len(c.logprobs) != len(ids):
                raise StoreError("vLLM returned no log-probability for some sampled token")
            lps = tuple(float(pos[t].logprob) for pos, t in zip(c.logprobs, ids, strict=True))
            if c.finish_reason not in ("stop", "length"):
                raise StoreError(f"vLLM finished a sample with {c.finish_reason!r}, expected 'stop' or 'length'")
            row.append(Completion(ids, lps, c.finish_reason))
        out.append(row)
    return out


class VllmEngine:
    """An :class:`~actor.engines.base.Engine` on ``vllm.LLM`` for the model directory ``model_dir``."""

    def __init__(
        self,
        model_dir: str,
        *,
        tensor_parallel_size: int = 1,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.5,
        max_model_len: int | None = None,
        enable_prefix_caching: bool = False,
        enforce_eager: bool = True,
        logprobs_mode: str | None = "processed_logprobs",
        seed: int = 0,
        stop_token_ids: list[int] | None = None,
        weight_transfer: str = "auto",
        **llm_kwargs: Any,
    ) -> None:
        try:
            with open(os.path.join(model_dir, "config.json"), "rb") as f:
                config = json.load(f)
        except (OSError, ValueError) as exc:
            raise StoreError(f"{model_dir}: no readable config.json ({exc})") from None
        eos = config.get("eos_token_id")
        default = [int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None]
        self.stop_token_ids = list(stop_token_ids) if stop_token_ids is not None else default
        self.prefix_caching = enable_prefix_caching
        self.tp = tensor_parallel_size
        self._lock = threading.RLock()
        self.native, self.mode = choose_transfer(weight_transfer, config, model_specs(model_dir), tensor_parallel_size)

        from vllm import LLM

        cpu_settings(tensor_parallel_size, llm_kwargs)
        quiet_tokenizer_warmup()
        if logprobs_mode is not None:
            llm_kwargs["logprobs_mode"] = logprobs_mode
        if self.native:
            vllm_transfer.register()  # this process too: an in-process engine core creates the engine here
            llm_kwargs["weight_transfer_config"] = {"backend": vllm_transfer.BACKEND}
        self.llm: LLM = LLM(
            model=model_dir,
            skip_tokenizer_init=True,  # prompts and outputs are token ids; the run's tokenizer may not be HF's
            tensor_parallel_size=tensor_parallel_size,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            enable_prefix_caching=enable_prefix_caching,
            enforce_eager=enforce_eager,
            seed=seed,
            worker_extension_cls=EXTENSION,
            **llm_kwargs,
        )
        specs = model_specs(model_dir)
        self.live: VllmWeights | VllmPatchWeights
        if self.mode == "mapped":
            runner = vllm_transfer.split_runner(self.tp, self._push, self._rpc) if self.native else self._rpc
            self.live = VllmWeights(
                Geometry.from_config(config), runner=runner, tp_size=tensor_parallel_size, after_write=self._after_write
            )
            try:
                self.live.check(specs)  # what vLLM made of the model, now that it has loaded it
            except LayoutError as exc:
                if not (self.native and weight_transfer == "auto" and vllm_transfer.has_patches()):
                    self.close()  # the actor ends on this error: the engine's processes go with it
                    raise
                log.info("vLLM's parameters are not laid out as mapped here (%s): writing through its loaders", exc)
                self.mode = "patches"
        if self.native:
            self.llm.init_weight_transfer_engine({"init_info": {"mode": self.mode}})
        if self.mode == "patches":
            self.live = VllmPatchWeights(specs, self._push, after_write=self._after_write)
        log.info(
            "vLLM engine: %s, writes %s",
            self.mode,
            "through vLLM's weight-transfer API (backend aurora)" if self.native else "through the worker extension",
        )

    def close(self) -> None:
        """Shut the engine's processes down (they also end with this process)."""
        shutdown(self.llm, self._lock)

    def _rpc(self, op: str, args: tuple[Any, ...]) -> list[Any]:
        """A worker op on every rank, through the worker extension (every read; writes on older vLLM)."""
        with self._lock:
            return list(unpack(self.llm.collective_rpc("aurora_op", args=(op, *pack(args)))))

    def _push(self, op: str, *args: Any) -> None:
        """One weight update of the aurora backend on every worker: vLLM knows an update happened."""
        with self._lock:
            self.llm.start_weight_update()
            self.llm.update_weights({"update_info": {"op": op, "args": pack(list(args))}})
            self.llm.finish_weight_update()

    def _after_write(self) -> None:
        """Reset the prefix cache: no KV block computed under the old weights may be served.
        vLLM refuses (returns False) while any block is held; generation holds the lock, so none
        should be, and a refusal that persists is an error rather than stale rollouts."""
        if not self.prefix_caching:
            return
        with self._lock:
            for _ in range(_RESET_TRIES):
                if self.llm.reset_prefix_cache() is not False:
                    return
                time.sleep(_RESET_WAIT_S)
        raise StoreError(
            f"vLLM refused to reset its prefix cache {_RESET_TRIES} times after a weight update: "
            "rollouts would reuse KV blocks of the old weights"
        )

    def last_commit(self) -> list[dict[str, float]]:
        """Per rank, the seconds the last applied delta spent scattering its words and rebuilding what
        vLLM derived from them (on its CPU build, the packed GEMM kernels of every touched layer)."""
        return [t for _, t in sorted(self._rpc("last_commit", ()), key=lambda r: r[0])]

    def rebuild_all(self) -> list[float]:
        """Per rank, seconds to re-run vLLM's post-load processing of every layer on the weights it holds:
        on its CPU build, the repack of every packed GEMM weight (what any write costs at least there)."""
        return [float(t) for _, t in sorted(self._rpc("rebuild", ()), key=lambda r: r[0])]

    def applied(self, version: int, version_hash: str) -> None:
        """Tell vLLM which version its weights are at (its ``get_weight_version()``)."""
        setter = getattr(self.llm, "update_weight_version", None)
        if setter is not None:
            with self._lock:
                setter(f"{version}:{version_hash[:16]}")

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        samples: int,
        max_new_tokens: int,
        temperature: float,
        seed: int,
        top_p: float = 1.0,
    ) -> list[list[Completion]]:
        with self._lock:
            return generate(
                self.llm,
                prompts,
                samples=samples,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                seed=seed,
                top_p=top_p,
                stop_token_ids=self.stop_token_ids,
            )


def shutdown(llm: LLM, lock: threading.RLock) -> None:
    """Shut ``llm``'s engine processes down (under ``lock``: ``LLM`` is not thread-safe)."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None:
        with lock:
            core.shutdown()


def generate(
    llm: LLM,
    prompts: Sequence[Sequence[int]],
    *,
    samples: int,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    top_p: float,
    stop_token_ids: list[int],
    lora_request: Any = None,
) -> list[list[Completion]]:
    """One batch on ``llm`` (the caller holds its lock: ``LLM`` is not thread-safe), under the LoRA
    adapter ``lora_request`` names where one is given: each prompt seeded apart, the sampled tokens'
    log-probabilities as the engine computed them."""
    from vllm import SamplingParams

    params = [
        SamplingParams(
            n=samples,
            temperature=temperature,
            top_p=top_p,
            max_tokens=max_new_tokens,
            logprobs=0,  # the sampled token's log-probability only
            seed=s,
            stop_token_ids=stop_token_ids,
            detokenize=False,
        )
        for s in prompt_seeds(seed, len(prompts), samples)
    ]
    inputs: list[Any] = [{"prompt_token_ids": [int(t) for t in p]} for p in prompts]
    outputs = llm.generate(inputs, params, use_tqdm=False, lora_request=lora_request)
    return completions(outputs, samples)
