"""What a run's actors must do as its trainer does: ``aurora_run.json``, attached to the run.

The trainer writes it once, with version 0: the tokenizer (kind, chat template, system prompt),
how completions are sampled (group size, lengths, temperature, top-p), the reward and its time
limit. Actors read it from their region's bucket instead of taking flags that could disagree
with the trainer's (an actor sampling another group size than the trainer's produces results
the trainer can only drop). Attachments are immutable, so a trainer restarted with other
settings is told what differs. Read as hostile input: every field is checked.

Schema: ``aurora-run/2`` names the published artefact (what each version holds: full weights,
and the dtype of its float tensors), and lets the document grow without breaking readers: a field
this reader does not know is ignored, unless the document lists it under ``required`` (a
reader that cannot honour it must refuse the run rather than sample from the wrong model).
``aurora-run/1`` documents (no artefact: BF16 weights) stay readable.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from aurora_store.format import hostile_json
from aurora_store.rl import sampling as sampling_bounds
from aurora_store.rl.errors import RLError
from aurora_store.rl.sampling import SamplingConfig
from aurora_store.rl.tokenizers import CHAR_KIND, HF_KIND

NAME = "aurora_run.json"
FORMAT = "aurora-run/2"
FIRST = "aurora-run/1"
"""The first schema: a closed set of fields and no artefact (every run then published BF16 weights)."""
MAX_BYTES = 1 << 20
ARTEFACT_KINDS = ("weights",)
"""What a version may hold: ``weights`` (every parameter). LoRA adapters would be another kind."""
DTYPES = ("bfloat16",)
"""Dtypes float tensors may be published in. Only BF16 is implemented; FP8 would add its name and scales."""
_V1_FIELDS = frozenset(
    {"format", "tokenizer", "chat_template", "system_prompt", "sampling", "reward", "reward_timeout_s", "eos_ids"}
)
_FIELDS = _V1_FIELDS | {"artefact", "required"}


class RunSpecError(RLError):
    """``aurora_run.json`` is malformed, or differs from what a restarted trainer would write."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Artefact:
    """What every version of the run holds; engines build their model from it."""

    kind: str = "weights"
    """``weights``: every parameter of the model (the only kind implemented)."""
    dtype: str = "bfloat16"
    """The dtype of every published float tensor, as torch names it."""

    def __post_init__(self) -> None:
        if self.kind not in ARTEFACT_KINDS:
            raise RunSpecError(f"artefact kind {self.kind!r:.60}: this release publishes and reads {ARTEFACT_KINDS}")
        if self.dtype not in DTYPES:
            raise RunSpecError(f"artefact dtype {self.dtype!r:.60}: this release publishes and reads {DTYPES}")


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
    artefact: Artefact = Artefact()
    """What each version holds (an ``aurora-run/1`` document implies BF16 weights)."""

    def to_bytes(self) -> bytes:
        doc = {
            "format": FORMAT,
            "artefact": {"kind": self.artefact.kind, "dtype": self.artefact.dtype},
            "required": [],
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
        if not isinstance(doc, dict) or doc.get("format") not in (FIRST, FORMAT):
            raise RunSpecError(f"{what}: not an {FORMAT} (or {FIRST}) document")
        artefact = Artefact()
        if doc["format"] == FIRST:
            if set(doc) != _V1_FIELDS:
                raise RunSpecError(f"{what}: not an {FIRST} document with fields {sorted(_V1_FIELDS)}")
        else:
            artefact = _open_schema(doc, what)
        s = doc["sampling"]
        if not isinstance(s, dict) or set(s) != {"group", "max_new_tokens", "temperature", "top_p"}:
            raise RunSpecError(f"{what}: sampling must hold group, max_new_tokens, temperature and top_p")
        sampling = SamplingConfig(  # the bounds the trainer's flags have: every spec it writes is read back
            group=_int(s["group"], "sampling.group", what, hi=sampling_bounds.MAX_GROUP),
            max_new_tokens=_int(
                s["max_new_tokens"], "sampling.max_new_tokens", what, hi=sampling_bounds.MAX_NEW_TOKENS
            ),
            temperature=_float(
                s["temperature"],
                "sampling.temperature",
                what,
                lo=sampling_bounds.MIN_TEMPERATURE,
                hi=sampling_bounds.MAX_TEMPERATURE,
            ),
            top_p=_float(s["top_p"], "sampling.top_p", what, lo=sampling_bounds.MIN_TOP_P, hi=1.0),
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
            artefact=artefact,
        )

    def differences(self, other: RunSpec) -> list[str]:
        """What differs from ``other``, field by field (for a restarted trainer's error)."""
        a, b = json.loads(self.to_bytes()), json.loads(other.to_bytes())
        out = [f"{k}: {a[k]!r} -> {b[k]!r}" for k in sorted(a) if a[k] != b[k] and k not in ("sampling", "required")]
        out += [
            f"sampling.{k}: {v!r} -> {b['sampling'][k]!r}" for k, v in a["sampling"].items() if v != b["sampling"][k]
        ]
        return out


def _open_schema(doc: dict[str, Any], what: str) -> Artefact:
    """An ``aurora-run/2`` document's artefact, after its ``required`` list: every field this reader
    does not know is ignored unless the document requires it."""
    required = doc.get("required")
    if not isinstance(required, list) or len(required) > 64 or not all(isinstance(r, str) for r in required):
        raise RunSpecError(f"{what}: required must list the names of fields a reader must understand")
    unknown = sorted(set(required) - _FIELDS)
    if unknown:
        raise RunSpecError(
            f"{what}: the run requires {unknown[0]!r:.60}, which this release does not understand; upgrade the actor"
        )
    missing = sorted(_FIELDS - set(doc))
    if missing:
        raise RunSpecError(f"{what}: an {FORMAT} document must have field {missing[0]!r}")
    a = doc["artefact"]
    if not isinstance(a, dict) or not isinstance(a.get("kind"), str) or not isinstance(a.get("dtype"), str):
        raise RunSpecError(f"{what}: artefact must name its kind and dtype")
    try:
        return Artefact(kind=a["kind"], dtype=a["dtype"])
    except RunSpecError as exc:
        raise RunSpecError(f"{what}: {exc}") from None


def _int(v: Any, name: str, what: str, *, lo: int = 1, hi: int) -> int:
    if type(v) is not int or not lo <= v <= hi:
        raise RunSpecError(f"{what}: {name} must be an integer in [{lo}, {hi}], got {v!r}"[:200])
    return v


def _float(v: Any, name: str, what: str, *, lo: float, hi: float) -> float:
    # an integer too large for a float is out of range too (math.isfinite would raise OverflowError)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi or not math.isfinite(v):
        raise RunSpecError(f"{what}: {name} must be a number in [{lo}, {hi}], got {v!r}"[:200])
    return float(v)
