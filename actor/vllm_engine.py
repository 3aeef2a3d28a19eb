"""The vLLM rollout engine: generation with ``vllm.LLM``, live weights written in place on its workers.

The engine loads a local model directory (an ``aurora replay`` output) and exposes its
parameters as :class:`~actor.vllm_weights.VllmWeights`: each apply scatters the changed BF16
words straight into the fused, TP-sharded parameters on every worker, through
``LLM.collective_rpc("aurora_op", ...)`` and :class:`~actor.vllm_weights.AuroraWorkerExtension`
(``worker_extension_cls``), arrays packed as bytes so they need neither vLLM's array
encoding nor its pickle fallback. vLLM needs no reload for in-place parameter writes; KV blocks
computed under the old weights would be reused by prefix caching, so it is off by default
and, when enabled, reset after every write (``LLM.reset_prefix_cache()``). CUDA graphs capture
parameter addresses, not values, so in-place writes are safe with them too; ``enforce_eager``
defaults to True for start-up time and simpler debugging. vllm is imported only inside
:class:`VllmEngine`, so this module imports without it.

Unverified here (written against vLLM's documented API, with no GPU or vllm on the build
machine): ``worker_extension_cls`` and collective_rpc by method name reaching the worker
(``get_model()``, TP rank from ``vllm.distributed``) with the packed payloads intact;
``logprobs_mode="processed_logprobs"`` (an engine arg of vLLM releases after 0.10.0) giving
log-probabilities after temperature, as :class:`~actor.engine.Completion` requires; the seed of child ``i`` of
an ``n``-sample request being ``seed + i`` (vLLM's ParentRequest), which the per-prompt seeds
are spaced for; the stop token staying in ``token_ids``. ``LLM`` is not thread-safe, so
generation and every weight op hold one lock: staging's reads of parent words wait for the
running batch, while fetching and verifying segments still overlap it.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from actor.engine import Completion
from actor.vllm_layout import Geometry
from actor.vllm_weights import VllmWeights, pack, unpack
from aurora_store.errors import StoreError

if TYPE_CHECKING:
    from vllm import LLM

EXTENSION = "actor.vllm_weights.AuroraWorkerExtension"
_SEED_MASK = (1 << 63) - 1


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
    """An :class:`~actor.engine.Engine` on ``vllm.LLM`` for the model directory ``model_dir``."""

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
        self._lock = threading.RLock()

        from vllm import LLM

        if logprobs_mode is not None:
            llm_kwargs["logprobs_mode"] = logprobs_mode
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
        self.live = VllmWeights(
            Geometry.from_config(config),
            runner=self._run,
            tp_size=tensor_parallel_size,
            after_write=self._after_write,
        )

    def _run(self, op: str, args: tuple[Any, ...]) -> list[Any]:
        with self._lock:
            return list(unpack(self.llm.collective_rpc("aurora_op", args=(op, *pack(args)))))

    def _after_write(self) -> None:
        if self.prefix_caching:
            with self._lock:
                self.llm.reset_prefix_cache()

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
        from vllm import SamplingParams

        params = [
            SamplingParams(
                n=samples,
                temperature=temperature,
                top_p=top_p,
                max_tokens=max_new_tokens,
                logprobs=0,  # the sampled token's log-probability only
                seed=s,
                stop_token_ids=self.stop_token_ids,
                detokenize=False,
            )
            for s in prompt_seeds(seed, len(prompts), samples)
        ]
        inputs: list[Any] = [{"prompt_token_ids": [int(t) for t in p]} for p in prompts]
        with self._lock:
            outputs = self.llm.generate(inputs, params, use_tqdm=False)
        return completions(outputs, samples)
