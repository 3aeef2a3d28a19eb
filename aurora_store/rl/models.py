"""Causal LMs: a user's own (any HF ``AutoModelForCausalLM``), or one built from a config
(nothing is downloaded), and the checks a config read from a bucket must pass before anything
is allocated.

The trainer attaches ``config.json`` (and ``generation_config.json``) to every run, so an actor
builds the same architecture from the store alone and then loads a version's weights. Tensors
an architecture ties (Qwen3-0.6B's ``lm_head`` is its ``embed_tokens``) are published once,
under the first name, as transformers and vLLM expect them back.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aurora_store.format import hostile_json
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
    if config.get("pad_token_id") is not None:
        model.generation_config.pad_token_id = config["pad_token_id"]
    return model


def load_pretrained(path: str, *, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """The causal LM at ``path`` with its own weights: a local directory is read offline; a hub
    id goes through transformers' own download and cache."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype or torch.float32, local_files_only=os.path.isdir(path)
        )
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ModelError(f"cannot load a causal LM from {path!r}: {exc}"[:500]) from None


def model_files(model: Any) -> dict[str, bytes]:
    """``config.json`` (recording BF16, what versions hold) and ``generation_config.json`` when the
    model has one: what a loader needs beside the weights."""
    with tempfile.TemporaryDirectory(prefix="aurora-config-") as d:
        config = model.config.to_dict()
        config["dtype"] = "bfloat16"
        config.pop("torch_dtype", None)
        out = {"config.json": json.dumps(config, indent=2, sort_keys=True).encode() + b"\n"}
        gen = getattr(model, "generation_config", None)
        if gen is not None and getattr(model, "can_generate", lambda: True)():
            gen.save_pretrained(d)
            if Path(d, "generation_config.json").exists():
                out["generation_config.json"] = Path(d, "generation_config.json").read_bytes()
    return out


def generation_eos(files: Mapping[str, bytes]) -> tuple[int, ...]:
    """The EOS ids ``generation_config.json`` names (one or a list), if there is one."""
    raw = files.get("generation_config.json")
    if raw is None:
        return ()
    try:
        eos = hostile_json.loads(raw).get("eos_token_id")
    except (ValueError, AttributeError):
        raise ModelError("generation_config.json is not a JSON object") from None
    ids = eos if isinstance(eos, list) else [eos]
    return tuple(i for i in ids if type(i) is int and i >= 0)


def tied_names(state: Mapping[str, Any]) -> set[str]:
    """Names of a state dict whose tensor is the same one as an earlier name's (tied weights)."""
    seen: set[object] = set()
    tied = set()
    for name, t in state.items():
        local = t.to_local() if hasattr(t, "to_local") else t
        ident = (
            (local.untyped_storage().data_ptr(), local.storage_offset(), tuple(local.shape)) if local.numel() else id(t)
        )
        if ident in seen:
            tied.add(name)
        seen.add(ident)
    return tied
