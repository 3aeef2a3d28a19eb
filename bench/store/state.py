"""What saving the trainer state of every version costs the training thread.

The same training loop (the trainer's own :func:`~trainer.step.optimizer_step` on synthetic GRPO
samples) runs ``--steps`` steps without saving states and ``--steps`` steps saving the state of
every step, in alternating blocks of four, with the trainer's :class:`~trainer.state.StateWriter`
into a local bucket, as ``--state-every 1`` does. Reported per model: the median step time of each
(the training thread's wall time), their ratio, the training thread's seconds in the writer per
state (capture, the wait for its copy before the next update, and the wait for a writer a step
behind), the writer thread's seconds per state (serialise, hash, write, commit: overlapped with the
next step), and the bytes of a state.

Models: ``demo`` (the built-in tiny model ``aurora demo`` trains) and ``qwen3-0.6b`` (Qwen3-0.6B's
shape, random weights built from the config; ``--layers`` fewer for a smaller machine). The step
here is the optimizer step alone: the trainer's real step also waits for rollouts and publishes,
which the writer overlaps too, so this is the least favourable case. The states written here are
bound to stand-in version hashes (no version is published) and are not loaded back.

``training_thread_ok`` is what decides ``--state-every 1`` as the default (the training thread pays
at most 5%); ``step_ratio_ok`` adds what the writer's CPU use costs the step on this host (on a few
CPU cores the writer competes with the step's own threads; a GPU trainer's step does not).
"""

from __future__ import annotations

import hashlib
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aurora_store.config.options import option, positive
from bench.output import Output, comma_list, emit

MODELS = ("demo", "qwen3-0.6b")
BLOCK = 4
"""Steps of one mode before the other's turn."""


@dataclass(kw_only=True, slots=True)
class Flags(Output):
    """The command line of ``aurora bench state``."""

    models: tuple[str, ...] = field(default=("demo",), metadata=option(parse=comma_list))
    """Comma-separated models: demo, qwen3-0.6b."""
    steps: int = field(default=8, metadata=option(parse=positive))
    """Measured steps in each mode (after two warm-up steps)."""
    samples: int = field(default=8, metadata=option(parse=positive))
    """Completions per step."""
    tokens: int = field(default=64, metadata=option(parse=positive))
    """Tokens per completion (half prompt, half completion)."""
    layers: int | None = None
    """Decoder layers of qwen3-0.6b (default: its 28)."""
    workdir: str | None = None
    """Where the local bucket goes (default: a temporary directory, deleted after)."""


def _model(name: str, layers: int | None) -> tuple[Any, int]:
    import torch

    from aurora_store.rl.models import build_model, tiny_config
    from aurora_store.rl.tokenizers import CharTokenizer
    from trainer.config import ModelConfig

    if name == "demo":
        m = ModelConfig()
        vocab = CharTokenizer().vocab_size
        return build_model(tiny_config(vocab, hidden=m.hidden, layers=m.layers), seed=0), vocab
    if name == "qwen3-0.6b":
        from transformers import AutoModelForCausalLM, Qwen3Config

        cfg = Qwen3Config(
            vocab_size=151936,
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=layers or 28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            tie_word_embeddings=True,
            max_position_embeddings=40960,
        )
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32), cfg.vocab_size
    raise SystemExit(f"aurora bench state: unknown model {name!r} (one of {', '.join(MODELS)})")


def measure_model(name: str, flags: Flags, root: Path) -> dict[str, Any]:
    import torch

    from aurora_store.bucket.run import open_run
    from trainer.grpo import GRPOConfig, Sample
    from trainer.state import StateWriter
    from trainer.step import optimizer_step

    model, vocab = _model(name, flags.layers)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    rng = random.Random(0)
    half = max(flags.tokens // 2, 1)
    samples = [
        Sample(
            tuple(rng.randrange(vocab) for _ in range(half)),
            tuple(rng.randrange(vocab) for _ in range(half)),
            tuple(-1.0 for _ in range(half)),
            float(i % 2),
        )
        for i in range(flags.samples)
    ]
    adv = [1.0 if i % 2 else -1.0 for i in range(flags.samples)]
    run = open_run((root / name).as_uri())
    writer = StateWriter(run)
    grpo = GRPOConfig(clip=0.2, kl_coef=0.0, temperature=1.0)

    blocked = [0.0]  # the training thread's seconds in the writer during measured steps

    def step(i: int, save: bool) -> float:
        t0, before = time.perf_counter(), writer.cost.training_thread_s
        optimizer_step(
            model,
            opt,
            samples,
            adv,
            grpo,
            step=i,
            base_lr=1e-5,
            warmup_steps=0,
            max_grad_norm=1.0,
            micro_batch_tokens=1 << 16,
            before_update=writer.before_update if save else None,
        )
        if save:
            writer.save(i, hashlib.sha256(f"bench {i}".encode()).hexdigest(), None, model, opt, rng, {})
        blocked[0] += writer.cost.training_thread_s - before
        return time.perf_counter() - t0

    for i in range(2):
        step(i, False)
    off: list[float] = []
    on: list[float] = []
    i = 2
    while len(on) < flags.steps:  # blocks of each mode in turn, so drift in the machine's load hits both
        block = min(BLOCK, flags.steps - len(on))
        off += [step(i + k, False) for k in range(block)]
        on += [step(i + block + k, True) for k in range(block)]
        writer.flush()  # the next block of steps without states must not overlap this block's last write
        i += 2 * block
    writer.close()
    cost = writer.cost
    off_s, on_s = statistics.median(off), statistics.median(on)
    state_bytes = cost.bytes / max(cost.saves, 1)
    return {
        "model": name,
        "parameters": params,
        "step_s_without_states": round(off_s, 4),
        "step_s_with_states": round(on_s, 4),
        "ratio": round(on_s / off_s, 4),
        "training_thread_s_per_state": round(blocked[0] / max(cost.saves, 1), 4),
        "training_thread_fraction": round(blocked[0] / max(sum(on), 1e-9), 4),
        "writer_s_per_state": round(cost.writer_s / max(cost.saves, 1), 4),
        "state_bytes": int(state_bytes),
        "state_bytes_per_parameter": round(state_bytes / params, 3),
        "saves": cost.saves,
        "failed": cost.failed,
    }


def measure(flags: Flags) -> dict[str, Any]:
    import torch

    with tempfile.TemporaryDirectory(prefix="aurora-bench-state-", dir=flags.workdir) as tmp:
        rows = [measure_model(name, flags, Path(tmp)) for name in flags.models]
    return {
        "bench": "state",
        "threads": torch.get_num_threads(),
        "steps": flags.steps,
        "samples": flags.samples,
        "tokens": flags.tokens,
        "models": rows,
        "training_thread_ok": all(r["training_thread_fraction"] <= 0.05 for r in rows),
        "step_ratio_ok": all(r["ratio"] <= 1.05 for r in rows),
    }


def _render(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="trainer state of every version: cost to the training thread")
    columns = (
        "model",
        "params",
        "step (no states)",
        "step (states)",
        "ratio",
        "blocked/state",
        "writer/state",
        "bytes",
    )
    for col in columns:
        table.add_column(col, justify="left" if col == "model" else "right")
    for r in result["models"]:
        table.add_row(
            r["model"],
            f"{r['parameters']:,}",
            f"{r['step_s_without_states']:.3f} s",
            f"{r['step_s_with_states']:.3f} s",
            f"{r['ratio']:.3f}x",
            f"{r['training_thread_s_per_state']:.3f} s",
            f"{r['writer_s_per_state']:.3f} s",
            f"{r['state_bytes']:,}",
        )
    Console().print(table)


def run(flags: Flags) -> int:
    for name in flags.models:
        if name not in MODELS:
            raise SystemExit(f"aurora bench state: unknown model {name!r} (one of {', '.join(MODELS)})")
    return emit(measure(flags), flags, _render)
