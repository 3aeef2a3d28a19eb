"""What the trainer and every actor must agree on when completions are sampled."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True, slots=True)
class SamplingConfig:
    """How completions are sampled: the trainer admits and trains on exactly what actors sample."""

    group: int = 8
    """Completions sampled per prompt (the GRPO group)."""
    max_new_tokens: int = 4
    """Longest completion, in tokens."""
    temperature: float = 1.0
    """Sampling temperature; the trainer takes log-probabilities at the same one."""
