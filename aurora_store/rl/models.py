"""Causal LMs built from a config (nothing is downloaded), and the checks a config read from a
bucket must pass before anything is allocated.

The trainer attaches ``config.json`` to every run, so an actor builds the same architecture
from the store alone and then loads a version's weights.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aurora_store.rl.errors import ModelError
from aurora_store.rl.tokenizers import BOS, EOS, PAD

if TYPE_CHECKING:
    import torch


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
        raise ModelError("a model config is a JSON object with a model_type")
    for key in _SIZES:
        v = config.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 < v < 1 << 31:
            raise ModelError(f"model config: {key} must be a positive integer, got {v!r}"[:200])
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    estimate = 2 * config["vocab_size"] * h + layers * (4 * h * h + 3 * h * config["intermediate_size"])
    if estimate > max_params:
        raise ModelError(f"model config describes ~{estimate:.3g} parameters, over the limit of {max_params:.3g}")
    return config


def build_model(config: dict[str, Any], *, seed: int = 0, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """A freshly initialised causal LM for ``config`` (a transformers config as a dict, checked first)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    check_config(config)
    try:
        cfg = AutoConfig.for_model(**config)
    except (ValueError, TypeError, KeyError) as exc:
        raise ModelError(f"model config: {exc}"[:500]) from None
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype or torch.float32)
    model.generation_config.pad_token_id = PAD
    return model
