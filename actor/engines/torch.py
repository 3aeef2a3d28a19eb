"""A rollout engine on a transformers causal LM (CPU or GPU): the default engine here.

Prompts are bucketed by length, so a bucket needs no padding and positions are exactly
those the trainer uses; each bucket decodes with the KV cache. Log-probabilities are of the
sampled token under the sampling distribution: softmax(logits / temperature), restricted to the
top-p nucleus and renormalised when top_p < 1. Temperature 0 decodes greedily (for evaluation:
``generate`` of transformers with ``do_sample=False`` gives the same tokens). A completion ends at
any of the run's EOS ids.
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from collections.abc import Callable, Sequence

import torch

from actor.engines.base import Completion
from actor.live import TensorWeights
from aurora_store.rl.tokenizers import EOS


class TorchEngine:
    """Generates with a HF causal LM whose parameters are the live weights (updated in place)."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        device: str | torch.device = "cpu",
        eos_ids: Sequence[int] = (EOS,),
        live: Callable[[torch.nn.Module, torch.device], TensorWeights] | None = None,
    ) -> None:
        """``live``: the weights a version is written into, made from the model on its device
        (default: every parameter by its own name; a LoRA run's, the adapter's parameters only; a
        quantized run's, the published words and scales the model's projections are dequantized from)."""
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.eos = torch.tensor(sorted(set(eos_ids)), dtype=torch.long)
        self.live = (
            TensorWeights(dict(self.model.named_parameters()), device=self.device)
            if live is None
            else live(self.model, self.device)
        )
        # transformers 5 renamed the KV-cache argument from past_key_values to cache
        base = getattr(model, "get_base_model", None)  # under a PEFT adapter, the model it wraps
        inner = base() if callable(base) else model
        self._cache_kw = "cache" if "cache" in inspect.signature(inner.forward).parameters else "past_key_values"

    def applied(self, version: int, version_hash: str) -> None:
        """The torch engine keeps no record of weight versions: the updater's is the one."""

    @torch.no_grad()
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
        if temperature < 0 or not 0 < top_p <= 1:
            raise ValueError(f"sampling needs temperature >= 0 and top_p in (0, 1], got {temperature}, {top_p}")
        gen = torch.Generator(device="cpu").manual_seed(seed)
        buckets: dict[int, list[int]] = defaultdict(list)
        for i, p in enumerate(prompts):
            buckets[len(p)].append(i)
        out: list[list[Completion]] = [[] for _ in prompts]
        for _, members in sorted(buckets.items()):
            ids = torch.tensor([list(prompts[i]) for i in members for _ in range(samples)], device=self.device)
            for row, comp in enumerate(self._decode(ids, max_new_tokens, temperature, top_p, gen)):
                out[members[row // samples]].append(comp)
        return out

    def _decode(
        self, ids: torch.Tensor, max_new: int, temperature: float, top_p: float, gen: torch.Generator
    ) -> list[Completion]:
        n = ids.shape[0]
        tokens = torch.zeros(n, max_new, dtype=torch.long)
        logps = torch.zeros(n, max_new)
        done = torch.zeros(n, dtype=torch.bool)
        length = torch.full((n,), max_new)
        past = None
        step_in = ids
        for j in range(max_new):
            res = self.model(input_ids=step_in, use_cache=True, **{self._cache_kw: past})
            past = res[self._cache_kw]
            logits = res.logits[:, -1].float().cpu()
            if temperature == 0:  # greedy, for evaluation (actors sample: the run's temperature is > 0)
                logprobs = torch.log_softmax(logits, dim=-1)
                nxt = logits.argmax(dim=-1)
            else:
                logprobs = torch.log_softmax(logits / temperature, dim=-1)
                if top_p < 1:
                    logprobs = _nucleus(logprobs, top_p)
                nxt = torch.multinomial(logprobs.exp(), 1, generator=gen).squeeze(1)
            tokens[:, j] = nxt
            logps[:, j] = logprobs.gather(1, nxt[:, None]).squeeze(1)
            ended = torch.isin(nxt, self.eos) & ~done
            length[ended] = j + 1
            done |= ended
            if bool(done.all()):
                break
            step_in = nxt[:, None].to(self.device)
        out = []
        for i in range(n):
            k = int(length[i])
            toks, lps = tuple(tokens[i, :k].tolist()), tuple(logps[i, :k].tolist())
            out.append(Completion(toks, lps, "stop") if bool(done[i]) else Completion(toks, lps, "length"))
        return out


def _nucleus(logprobs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Log-probabilities restricted to the smallest set of tokens whose mass reaches ``top_p``, renormalised."""
    probs, order = logprobs.exp().sort(dim=-1, descending=True)
    keep = probs.cumsum(dim=-1) - probs < top_p  # a token is kept while the mass before it is below top_p
    masked = torch.full_like(logprobs, float("-inf")).scatter(-1, order, torch.where(keep, probs.log(), float("-inf")))
    return torch.log_softmax(masked, dim=-1)
