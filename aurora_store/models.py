"""Tiny models built from a config, with a character-level tokenizer: nothing is downloaded.

The trainer attaches ``config.json`` and ``tokenizer.json`` to every version, so an actor
builds the same architecture from the store alone and then loads the version's weights.
The tokenizer maps each printable ASCII character to one id after three specials.
"""

from __future__ import annotations

import json
import string
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from aurora_store.errors import StoreError

if TYPE_CHECKING:
    import torch

PAD, BOS, EOS = 0, 1, 2
_SPECIALS = ("<pad>", "<bos>", "<eos>")


class CharTokenizer:
    """One id per character; ``<pad>``, ``<bos>``, ``<eos>`` first."""

    def __init__(self, chars: str = string.printable[:95]) -> None:
        if len(set(chars)) != len(chars) or not chars:
            raise StoreError("a character tokenizer needs distinct characters")
        self.chars = chars
        self.ids = {c: i + len(_SPECIALS) for i, c in enumerate(chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars) + len(_SPECIALS)

    def encode(self, text: str, *, bos: bool = True) -> list[int]:
        try:
            ids = [self.ids[c] for c in text]
        except KeyError as exc:
            raise StoreError(f"character {exc.args[0]!r} is not in the tokenizer's alphabet") from None
        return [BOS, *ids] if bos else ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text up to the first ``<eos>``; specials are dropped."""
        out = []
        for i in ids:
            if i == EOS:
                break
            if i >= len(_SPECIALS):
                out.append(self.chars[i - len(_SPECIALS)])
        return "".join(out)

    def to_json(self) -> bytes:
        return json.dumps({"type": "aurora-char", "specials": list(_SPECIALS), "chars": self.chars}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> CharTokenizer:
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise StoreError(f"tokenizer.json is not JSON: {exc}") from None
        if not isinstance(doc, dict) or doc.get("type") != "aurora-char" or not isinstance(doc.get("chars"), str):
            raise StoreError("tokenizer.json is not an aurora character tokenizer")
        if doc.get("specials") != list(_SPECIALS):
            raise StoreError(f"tokenizer.json: specials must be {list(_SPECIALS)}")
        return cls(doc["chars"])


def tiny_config(
    vocab_size: int, *, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2
) -> dict[str, Any]:
    """A Qwen3-architecture config small enough to train on two CPU cores in minutes."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": hidden * 3,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "max_position_embeddings": 64,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "pad_token_id": PAD,
    }


MAX_PARAMS = 20_000_000_000
"""Largest model :func:`build_model` makes: a config read from a bucket must not exhaust memory."""
_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


def check_config(config: object, *, max_params: int = MAX_PARAMS) -> dict[str, Any]:
    """``config`` if it is a plausible causal-LM config whose size is below ``max_params``."""
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise StoreError("a model config is a JSON object with a model_type")
    for key in _SIZES:
        v = config.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 < v < 1 << 31:
            raise StoreError(f"model config: {key} must be a positive integer, got {v!r}"[:200])
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    estimate = 2 * config["vocab_size"] * h + layers * (4 * h * h + 3 * h * config["intermediate_size"])
    if estimate > max_params:
        raise StoreError(f"model config describes ~{estimate:.3g} parameters, over the limit of {max_params:.3g}")
    return config


def build_model(config: dict[str, Any], *, seed: int = 0, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """A freshly initialised causal LM for ``config`` (a transformers config as a dict, checked first)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    check_config(config)
    try:
        cfg = AutoConfig.for_model(**config)
    except (ValueError, TypeError, KeyError) as exc:
        raise StoreError(f"model config: {exc}"[:500]) from None
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype or torch.float32)
    model.generation_config.pad_token_id = PAD
    return model
