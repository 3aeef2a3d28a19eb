"""What the trainer and every actor must agree on when completions are sampled.

The trainer takes these as flags and records them in the run (``aurora_run.json``,
:mod:`aurora_store.rl.runspec`); actors read them from there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from aurora_store.config.options import Range

MAX_GROUP = 4096
MAX_NEW_TOKENS = 1 << 20
MIN_TEMPERATURE = 1e-6
MAX_TEMPERATURE = 100.0
MIN_TOP_P = 1e-6
"""The bounds of the options below, which a run spec holds too (:mod:`aurora_store.rl.runspec`)."""


@dataclass(kw_only=True, slots=True)
class SamplingConfig:
    """How completions are sampled: the trainer admits and trains on exactly what actors sample."""

    group: Annotated[int, Range(ge=1, le=MAX_GROUP)] = 8
    """Completions sampled per prompt (the GRPO group)."""
    max_new_tokens: Annotated[int, Range(ge=1, le=MAX_NEW_TOKENS)] = 1024
    """Longest completion, in tokens."""
    temperature: Annotated[float, Range(ge=MIN_TEMPERATURE, le=MAX_TEMPERATURE)] = 1.0
    """Sampling temperature; the trainer takes log-probabilities at the same one."""
    top_p: Annotated[float, Range(ge=MIN_TOP_P, le=1.0)] = 1.0
    """Nucleus sampling: sample from the smallest set of tokens whose probability reaches top_p (1: all).
    The trainer's importance ratios use the temperature-scaled, untruncated distribution."""
