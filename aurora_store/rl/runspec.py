"""What a run's actors must do as its trainer does: ``aurora_run.json``, attached to the run.

The trainer writes it once, with version 0: the tokenizer (kind, chat template, system prompt),
how completions are sampled (group size, lengths, temperature, top-p), the reward and its time
limit. Actors read it from their region's bucket instead of taking flags that could disagree
with the trainer's (an actor sampling another group size than the trainer's produces results
the trainer can only drop). Attachments are immutable, so a trainer restarted with other
settings is told what differs. Read as hostile input: every field is checked.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from aurora_store.format import hostile_json
from aurora_store.rl.errors import RLError
from aurora_store.rl.sampling import SamplingConfig
from aurora_store.rl.tokenizers import CHAR_KIND, HF_KIND

NAME = "aurora_run.json"
FORMAT = "aurora-run/1"
MAX_BYTES = 1 << 20


class RunSpecError(RLError):
    """``aurora_run.json`` is malformed, or differs from what a restarted trainer would write."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSpec:
    tokenizer: str
    """``aurora-char`` or ``hf``."""
    chat_template: bool
    system_prompt: str | None
    sampling: SamplingConfig
    reward: str
    """A reward spec (:func:`aurora_store.rl.rewards.load_reward`)."""
    reward_timeout_s: float
    eos_ids: tuple[int, ...]
    """Ids that end a completion (the tokenizer's, and the generation config's)."""

    def to_bytes(self) -> bytes:
        doc = {
            "format": FORMAT,
            "tokenizer": self.tokenizer,
            "chat_template": self.chat_template,
            "system_prompt": self.system_prompt,
            "sampling": {
                "group": self.sampling.group,
                "max_new_tokens": self.sampling.max_new_tokens,
                "temperature": self.sampling.temperature,
                "top_p": self.sampling.top_p,
            },
            "reward": self.reward,
            "reward_timeout_s": self.reward_timeout_s,
            "eos_ids": list(self.eos_ids),
        }
        return json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n"

    @classmethod
    def from_bytes(cls, data: bytes, what: str = NAME) -> RunSpec:
        if len(data) > MAX_BYTES:
            raise RunSpecError(f"{what}: {len(data)} bytes, over {MAX_BYTES}")
        try:
            doc = hostile_json.loads(data)
        except ValueError as exc:
            raise RunSpecError(f"{what}: not JSON ({exc})"[:300]) from None
        fields = {"format", "tokenizer", "chat_template", "system_prompt", "sampling", "reward"}
        fields |= {"reward_timeout_s", "eos_ids"}
        if not isinstance(doc, dict) or set(doc) != fields or doc["format"] != FORMAT:
            raise RunSpecError(f"{what}: not an {FORMAT} document with fields {sorted(fields)}")
        s = doc["sampling"]
        if not isinstance(s, dict) or set(s) != {"group", "max_new_tokens", "temperature", "top_p"}:
            raise RunSpecError(f"{what}: sampling must hold group, max_new_tokens, temperature and top_p")
        sampling = SamplingConfig(
            group=_int(s["group"], "sampling.group", what, hi=4096),
            max_new_tokens=_int(s["max_new_tokens"], "sampling.max_new_tokens", what, hi=1 << 20),
            temperature=_float(s["temperature"], "sampling.temperature", what, lo=1e-6, hi=100.0),
            top_p=_float(s["top_p"], "sampling.top_p", what, lo=1e-6, hi=1.0),
        )
        if doc["tokenizer"] not in (CHAR_KIND, HF_KIND):
            raise RunSpecError(f"{what}: tokenizer {doc['tokenizer']!r}, expected {CHAR_KIND!r} or {HF_KIND!r}")
        if not isinstance(doc["chat_template"], bool):
            raise RunSpecError(f"{what}: chat_template must be true or false")
        if doc["system_prompt"] is not None and not isinstance(doc["system_prompt"], str):
            raise RunSpecError(f"{what}: system_prompt must be a string or null")
        if not isinstance(doc["reward"], str) or not doc["reward"] or len(doc["reward"]) > 4096:
            raise RunSpecError(f"{what}: reward must name a reward function")
        eos = doc["eos_ids"]
        if not isinstance(eos, list) or not eos or len(eos) > 64:
            raise RunSpecError(f"{what}: eos_ids must list 1 to 64 token ids")
        return cls(
            tokenizer=doc["tokenizer"],
            chat_template=doc["chat_template"],
            system_prompt=doc["system_prompt"],
            sampling=sampling,
            reward=doc["reward"],
            reward_timeout_s=_float(doc["reward_timeout_s"], "reward_timeout_s", what, lo=1e-3, hi=3600.0),
            eos_ids=tuple(_int(i, "eos_ids", what, lo=0, hi=(1 << 31) - 1) for i in eos),
        )

    def differences(self, other: RunSpec) -> list[str]:
        """What differs from ``other``, field by field (for a restarted trainer's error)."""
        a, b = json.loads(self.to_bytes()), json.loads(other.to_bytes())
        out = [f"{k}: {a[k]!r} -> {b[k]!r}" for k in sorted(a) if a[k] != b[k] and k != "sampling"]
        out += [
            f"sampling.{k}: {v!r} -> {b['sampling'][k]!r}" for k, v in a["sampling"].items() if v != b["sampling"][k]
        ]
        return out


def _int(v: Any, name: str, what: str, *, lo: int = 1, hi: int) -> int:
    if type(v) is not int or not lo <= v <= hi:
        raise RunSpecError(f"{what}: {name} must be an integer in [{lo}, {hi}], got {v!r}"[:200])
    return v


def _float(v: Any, name: str, what: str, *, lo: float, hi: float) -> float:
    # an integer too large for a float is out of range too (math.isfinite would raise OverflowError)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi or not math.isfinite(v):
        raise RunSpecError(f"{what}: {name} must be a number in [{lo}, {hi}], got {v!r}"[:200])
    return float(v)
