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
``aurora-run/3`` is ``aurora-run/2`` whose artefact may be a LoRA adapter (:class:`LoraSpec`: its
rank, alpha and target modules, and the frozen base it adapts, named by content); a run of full
weights is still written as ``aurora-run/2``, so actors of the release before read it.
``aurora-run/4`` is ``aurora-run/2`` whose artefact may be quantized weights (kind ``quantized``:
the decoder's linear projections as a scheme of :mod:`aurora_store.quant.schemes` publishes them,
words and scales, everything else in the artefact's dtype); a release before it refuses such a run
rather than serve its words as if they were BF16. ``aurora-run/1`` documents (no artefact: BF16
weights) stay readable.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from aurora_store.format import hostile_json
from aurora_store.format.keys import lora_base_file
from aurora_store.quant import schemes as quant_schemes
from aurora_store.rl import sampling as sampling_bounds
from aurora_store.rl.errors import RLError
from aurora_store.rl.sampling import SamplingConfig
from aurora_store.rl.tokenizers import CHAR_KIND, HF_KIND

NAME = "aurora_run.json"
FORMAT = "aurora-run/2"
FIRST = "aurora-run/1"
"""The first schema: a closed set of fields and no artefact (every run then published BF16 weights)."""
LORA_FORMAT = "aurora-run/3"
"""``aurora-run/2`` with a LoRA artefact: written only for a LoRA run."""
QUANTIZED_FORMAT = "aurora-run/4"
"""``aurora-run/2`` with a quantized artefact: written only for a run of quantized weights."""
MAX_BYTES = 1 << 20
ARTEFACT_KINDS = ("weights", "lora", "quantized")
"""What a version may hold: ``weights`` (every parameter), ``lora`` (a LoRA adapter's matrices
over a frozen base the run carries, :class:`LoraSpec`) or ``quantized`` (every parameter, the
decoder's linear projections quantized by :attr:`Artefact.scheme`)."""
SCHEMES = tuple(quant_schemes.SCHEMES)
"""The quantization schemes a quantized artefact may name."""
MAX_LORA_RANK = 4096
MAX_TARGETS = 64
TARGET = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]{0,127}$")
"""A target module's name, as PEFT's ``target_modules`` takes it (``q_proj``, ``mlp.down_proj``)."""
MAX_BASE_FILES = 10_000
DIGEST = re.compile(r"^[0-9a-f]{32}$")
DTYPES = ("bfloat16",)
"""Dtypes float tensors may be published in. Only BF16 is implemented; FP8 would add its name and scales."""
_V1_FIELDS = frozenset(
    {"format", "tokenizer", "chat_template", "system_prompt", "sampling", "reward", "reward_timeout_s", "eos_ids"}
)
_FIELDS = _V1_FIELDS | {"artefact", "required"}


class RunSpecError(RLError):
    """``aurora_run.json`` is malformed, or differs from what a restarted trainer would write."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LoraSpec:
    """A LoRA adapter (PEFT's ``LoraConfig``: ``r``, ``lora_alpha``, ``target_modules``) over a frozen base.

    Every version holds the adapter's matrices only, named as PEFT saves them
    (``base_model.model.<module>.lora_A.weight``). The base is carried by the run once, as the
    attachments ``base_files`` (safetensors, the base model's own tensor names, in the run's dtype),
    and named by content: ``base_digest`` is the weight digest of those tensors (the digest every
    manifest records of its weights), so an engine holding another base is refused."""

    rank: int
    alpha: float
    targets: tuple[str, ...]
    base_digest: str
    base_files: tuple[str, ...]

    def __post_init__(self) -> None:
        if type(self.rank) is not int or not 1 <= self.rank <= MAX_LORA_RANK:
            raise RunSpecError(f"lora rank must be an integer in [1, {MAX_LORA_RANK}], got {self.rank!r:.40}")
        a = self.alpha
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not math.isfinite(a) or not 0 < a <= 1e6:
            raise RunSpecError(f"lora alpha must be a number in (0, 1e6], got {a!r:.40}")
        t = self.targets
        if not isinstance(t, tuple) or not 1 <= len(t) <= MAX_TARGETS or len(set(t)) != len(t):
            raise RunSpecError(f"lora targets must name 1 to {MAX_TARGETS} distinct modules")
        bad = next((x for x in t if not isinstance(x, str) or not TARGET.match(x)), None)
        if bad is not None:
            raise RunSpecError(f"lora target {bad!r:.60} is not a module name")
        if not isinstance(self.base_digest, str) or not DIGEST.match(self.base_digest):
            raise RunSpecError(f"lora base_digest must be 32 lowercase hex digits, got {self.base_digest!r:.60}")
        f = self.base_files
        if not isinstance(f, tuple) or not 1 <= len(f) <= MAX_BASE_FILES:
            raise RunSpecError(f"lora base_files must list 1 to {MAX_BASE_FILES} attachments")
        expected = tuple(lora_base_file(i, len(f)) for i in range(len(f)))
        if f != expected:
            raise RunSpecError(f"lora base_files must be {expected[0]!r} ... {expected[-1]!r}, in order")

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "alpha": self.alpha,
            "targets": list(self.targets),
            "base_digest": self.base_digest,
            "base_files": list(self.base_files),
        }

    @classmethod
    def from_dict(cls, d: Any, what: str) -> LoraSpec:
        keys = {"rank", "alpha", "targets", "base_digest", "base_files"}
        if not isinstance(d, dict) or set(d) != keys:
            raise RunSpecError(f"{what}: artefact.lora must hold exactly {sorted(keys)}")
        targets, files = d["targets"], d["base_files"]
        if not isinstance(targets, list) or not isinstance(files, list) or len(files) > MAX_BASE_FILES:
            raise RunSpecError(f"{what}: artefact.lora targets and base_files must be arrays")
        try:
            return cls(
                rank=d["rank"],
                alpha=d["alpha"],
                targets=tuple(targets),
                base_digest=d["base_digest"],
                base_files=tuple(files),
            )
        except RunSpecError as exc:
            raise RunSpecError(f"{what}: {exc}") from None


@dataclass(frozen=True, kw_only=True, slots=True)
class Artefact:
    """What every version of the run holds; engines build their model from it."""

    kind: str = "weights"
    """``weights``: every parameter of the model; ``lora``: a LoRA adapter's matrices (:attr:`lora`)."""
    dtype: str = "bfloat16"
    """The dtype of every published float tensor, as torch names it."""
    lora: LoraSpec | None = None
    """The adapter and its base, for kind ``lora`` (None otherwise)."""
    scheme: str | None = None
    """For kind ``quantized``, how the linear projections are quantized (one of :data:`SCHEMES`);
    :attr:`dtype` is then that of every tensor the scheme leaves unquantized."""

    def __post_init__(self) -> None:
        if self.kind not in ARTEFACT_KINDS:
            raise RunSpecError(f"artefact kind {self.kind!r:.60}: this release publishes and reads {ARTEFACT_KINDS}")
        if self.dtype not in DTYPES:
            raise RunSpecError(f"artefact dtype {self.dtype!r:.60}: this release publishes and reads {DTYPES}")
        if (self.kind == "lora") != (self.lora is not None):
            raise RunSpecError("artefact kind 'lora' and its lora table go together")
        if (self.kind == "quantized") != (self.scheme is not None):
            raise RunSpecError("artefact kind 'quantized' and its scheme go together")
        if self.scheme is not None and self.scheme not in SCHEMES:
            raise RunSpecError(f"artefact scheme {self.scheme!r:.60}: this release publishes and reads {SCHEMES}")

    @property
    def format(self) -> str:
        """The schema a run of this artefact is written as: the oldest one that can say it."""
        return {"lora": LORA_FORMAT, "quantized": QUANTIZED_FORMAT}.get(self.kind, FORMAT)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "dtype": self.dtype}
        if self.lora is not None:
            out["lora"] = self.lora.to_dict()
        if self.scheme is not None:
            out["scheme"] = self.scheme
        return out


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
            "format": self.artefact.format,
            "artefact": self.artefact.to_dict(),
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
        if not isinstance(doc, dict) or doc.get("format") not in (FIRST, FORMAT, LORA_FORMAT, QUANTIZED_FORMAT):
            raise RunSpecError(f"{what}: not an {FORMAT} (or {FIRST}, {LORA_FORMAT} or {QUANTIZED_FORMAT}) document")
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
    lora, scheme = None, None
    if a["kind"] == "lora":
        if doc["format"] != LORA_FORMAT:
            raise RunSpecError(f"{what}: a LoRA artefact is an {LORA_FORMAT} document, not {doc['format']}")
        lora = LoraSpec.from_dict(a.get("lora"), what)
    if a["kind"] == "quantized":
        if doc["format"] != QUANTIZED_FORMAT:
            raise RunSpecError(f"{what}: a quantized artefact is an {QUANTIZED_FORMAT} document, not {doc['format']}")
        scheme = a.get("scheme")
        if not isinstance(scheme, str):
            raise RunSpecError(f"{what}: a quantized artefact must name its scheme")
    try:
        return Artefact(kind=a["kind"], dtype=a["dtype"], lora=lora, scheme=scheme)
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
