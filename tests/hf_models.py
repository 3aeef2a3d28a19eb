"""Real HF checkpoints for the tests, made here: a BPE tokenizer trained with ``tokenizers`` on text
written here (with a chat template), and tiny random Qwen3 (tied embeddings) and Llama models saved
with ``save_pretrained`` in BF16. Nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import torch

DATA = Path(__file__).parent / "data"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<pad>", "<|im_start|>", "<|im_end|>", "<unk>"]


def corpus() -> list[str]:
    """Text to train the tokenizer on: the GSM8K-style problems of tests/data and some arithmetic."""
    rows = [json.loads(line) for line in (DATA / "gsm8k_tiny.jsonl").read_text().splitlines()]
    text = [r["question"] for r in rows] + [r["answer"] for r in rows]
    text += [f"{a} + {b} = {a + b}. The answer is \\boxed{{{a + b}}}." for a in range(20) for b in range(20)]
    return [*text, "system", "user", "assistant", "You are a careful solver."]


def train_tokenizer(out: Path, vocab_size: int = 512) -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<pad>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def save_model(out: Path, arch: str, *, seed: int = 0) -> Path:
    """A tiny random ``arch`` ("qwen3", tied embeddings; or "llama") with its tokenizer, saved in BF16."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(out)
    ids = {"bos_token_id": None, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}  # type: ignore[attr-defined]
    common = dict(
        vocab_size=len(tok),  # type: ignore[arg-type]
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        **ids,
    )
    if arch == "qwen3":
        config = Qwen3Config(**common, head_dim=8, tie_word_embeddings=True)
    else:
        config = LlamaConfig(**common, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # larger weights than the init's, so greedy outputs differ from token to token
        for p in model.parameters():
            p.mul_(4.0)
    model.to(torch.bfloat16).save_pretrained(out)
    model.generation_config.eos_token_id = tok.eos_token_id  # type: ignore[attr-defined]
    model.generation_config.save_pretrained(out)
    return out
