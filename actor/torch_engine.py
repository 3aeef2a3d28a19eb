"""A rollout engine on a transformers causal LM (CPU or GPU): the default engine here.

Prompts are bucketed by length, so a bucket needs no padding and positions are exactly
those the trainer uses; each bucket decodes with the KV cache. Log-probabilities are of the
sampled token under softmax(logits / temperature), which is the sampling distribution.
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from collections.abc import Sequence

import torch

from actor.engine import Completion
from actor.live import TensorWeights
from aurora_store.rl.tokenizers import EOS


class TorchEngine:
    """Generates with a HF causal LM whose parameters are the live weights (updated in place)."""

    def __init__(self, model: torch.nn.Module, *, device: str | torch.device = "cpu") -> None:
        self.model = model.eval()
        self.device = torch.device(device)
        self.live = TensorWeights(dict(model.named_parameters()), device=self.device)
        # transformers 5 renamed the KV-cache argument from past_key_values to cache
        self._cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        samples: int,
        max_new_tokens: int,
        temperature: float,
        seed: int,
    ) -> list[list[Completion]]:
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 for sampling, got {temperature}")
        gen = torch.Generator(device="cpu").manual_seed(seed)
        buckets: dict[int, list[int]] = defaultdict(list)
        for i, p in enumerate(prompts):
            buckets[len(p)].append(i)
        out: list[list[Completion]] = [[] for _ in prompts]
        for _, members in sorted(buckets.items()):
            ids = torch.tensor([list(prompts[i]) for i in members for _ in range(samples)], device=self.device)
            for row, comp in enumerate(self._decode(ids, max_new_tokens, temperature, gen)):
                out[members[row // samples]].append(comp)
        return out

    def _decode(self, ids: torch.Tensor, max_new: int, temperature: float, gen: torch.Generator) -> list[Completion]:
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
            logprobs = torch.log_softmax(res.logits[:, -1].float() / temperature, dim=-1).cpu()
            nxt = torch.multinomial(logprobs.exp(), 1, generator=gen).squeeze(1)
            tokens[:, j] = nxt
            logps[:, j] = logprobs.gather(1, nxt[:, None]).squeeze(1)
            ended = (nxt == EOS) & ~done
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
