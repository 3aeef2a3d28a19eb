"""The rollout engine interface: generate a batch; expose live weights for safe-point apply.

An engine generates completions with the weights it holds and exposes those weights as
:class:`~actor.live.LiveWeights` under HF names. The worker loop applies a staged version
through the updater between batches, never during one, so a batch always runs on one
whole version.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from actor.live import LiveWeights


@dataclass(frozen=True, slots=True)
class Completion:
    """One sampled continuation: its token ids, their log-probabilities under the sampling
    policy (the engine's weights, temperature applied), and why it ended."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: Literal["stop", "length"]


class Engine(Protocol):
    @property
    def live(self) -> LiveWeights:
        """The engine's weights, written in place by the updater at safe points."""
        ...

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
        """``samples`` completions for each prompt (its ids as the model sees it), in prompt order;
        log-probabilities after temperature and top-p, as the tokens were sampled."""
        ...

    def applied(self, version: int, version_hash: str) -> None:
        """The live weights now hold ``version`` (an engine that tracks weight versions records it)."""
        ...
