"""The policy the trainer trains, and everything a run records about it.

A new run starts from a user's HF causal LM (``--model``: a local directory read offline, a hub
id, or a GGUF file dequantized once by :mod:`aurora_store.rl.gguf`) or from the built-in tiny Qwen3
with a character tokenizer. Masters are FP32 (a BF16
checkpoint widens exactly, so version 0 is its bits); versions are published in BF16. The run
records what actors and ``aurora replay`` need to rebuild the model and tokenizer from the
bucket alone (``config.json``, ``generation_config.json``, the tokenizer's files) and, in
``aurora_run.json``, how to sample and score. A resumed run rebuilds its policy from those
files; its weights then come from the trainer state.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from aurora_store.bucket.lora_base import base_files
from aurora_store.bucket.run import Run
from aurora_store.format import hostile_json
from aurora_store.format.weights import WeightState
from aurora_store.rl import gguf
from aurora_store.rl.errors import ModelError
from aurora_store.rl.models import build_model, generation_eos, load_pretrained, model_files, tiny_config
from aurora_store.rl.runspec import NAME as RUN_SPEC
from aurora_store.rl.runspec import Artefact, LoraSpec, RunSpec, RunSpecError
from aurora_store.rl.tokenizers import CHAR_KIND, HF_KIND, CharTokenizer, HFTokenizer, Tokenizer, from_files
from trainer import adapter
from trainer.adapter import LoraSettings
from trainer.config import TrainerConfig


@dataclass(slots=True)
class Policy:
    model: torch.nn.Module
    tokenizer: Tokenizer
    files: dict[str, bytes]
    """The run's attachments that describe it: config, generation config, tokenizer files."""
    vocab_size: int
    """Rows of the model's embedding: every token id an actor returns must be below it."""
    lora: LoraSpec | None = None
    """A LoRA run's adapter and the base the run carries (``model`` is then the base wrapped by PEFT)."""
    base: WeightState | None = None
    """A resumed LoRA run's base as read and verified from the run, for the frozen copies the trainer
    builds at start (each would read it again); the trainer lets go of it once started."""


def device_for(cfg: TrainerConfig, local_rank: int) -> torch.device:
    """Where this rank computes: ``--device``, or with ``auto`` its own GPU when there is one."""
    want = cfg.model.device
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(want)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelError(f"--device {cfg.model.device}: no CUDA device here")
        if device.index is None:
            device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    return device


def new_policy(cfg: TrainerConfig) -> Policy:
    """Version 0's policy: the user's model (FP32 masters) or the built-in tiny one."""
    m, d = cfg.model, cfg.data
    if m.model is None:
        chars = CharTokenizer()
        model = build_model(tiny_config(chars.vocab_size, hidden=m.hidden, layers=m.layers), seed=cfg.seed)
        return Policy(model, chars, {**model_files(model), **chars.files()}, chars.vocab_size)
    path = gguf.hf_directory(m.model) if gguf.gguf_file(m.model) is not None else m.model
    model = load_pretrained(path, dtype=torch.float32)
    files = model_files(model)
    hf = HFTokenizer.load(
        path, chat_template=d.chat_template, system_prompt=d.system_prompt, eos_ids=generation_eos(files)
    )
    return Policy(model, hf, {**files, **hf.files()}, _vocab(model))


def lora_settings(cfg: TrainerConfig) -> LoraSettings | None:
    """The adapter ``--lora-rank`` asks for; None to train every weight."""
    m = cfg.model
    return None if m.lora_rank == 0 else LoraSettings(rank=m.lora_rank, alpha=m.lora_alpha, targets=m.lora_targets)


def adapt(run: Run, policy: Policy, cfg: TrainerConfig, *, write: bool) -> None:
    """Make a new run's ``policy`` a LoRA adapter over its model, when ``--lora-rank`` asks: the base
    rounded to the run's dtype, attached to the run (by the first rank: ``write``), then wrapped."""
    settings = lora_settings(cfg)
    if settings is None:
        return
    adapter.check(settings, policy.model)  # before the base is attached to the run
    if cfg.publish.scheme is not None:
        raise RunSpecError(
            f"--lora-rank with --publish-dtype {cfg.publish.dtype}: a LoRA run publishes its adapter in BF16 over "
            "a BF16 base; quantized LoRA serving is not built"
        )
    dtype = getattr(torch, cfg.publish.float_dtype)
    adapter.round_base(policy.model, dtype)
    policy.lora = adapter.attach(run, policy.model, settings, dtype, write=write)
    policy.model = adapter.wrap(policy.model, settings)


def check_kind(run: Run, recorded: RunSpec | None, cfg: TrainerConfig) -> None:
    """A restarted trainer trains what the run publishes: an adapter or every weight, never the other."""
    lora = recorded.artefact.lora if recorded is not None else None
    if (lora is None) != (cfg.model.lora_rank == 0):
        have = "a LoRA adapter" if lora is not None else "every weight"
        want = f"--lora-rank {cfg.model.lora_rank}" if cfg.model.lora_rank else "no --lora-rank"
        raise RunSpecError(f"{run.uri}: this run publishes {have}; a trainer with {want} cannot continue it")


def resumed_policy(run: Run, spec: RunSpec | None, cfg: TrainerConfig) -> Policy:
    """A resumed run's policy, rebuilt from the run's own files (its weights come from the trainer state).
    ``spec`` is the run's recorded one; a run an earlier trainer started has none."""
    files = verified_files(run)
    if "config.json" not in files:
        raise ModelError(f"{run.uri}: the run has no config.json")
    try:
        config: dict[str, Any] = hostile_json.loads(files["config.json"])
    except ValueError as exc:
        raise ModelError(f"{run.uri}: config.json is not JSON: {exc}") from None
    model = build_model(config, seed=cfg.seed)
    lora = spec.artefact.lora if spec is not None else None
    base = None
    if lora is not None:  # the frozen base the run carries; the adapter comes from the trainer state
        base = adapter.load_base_into(run, model, lora)
        model = adapter.wrap(model, adapter.settings_of(lora))
    if spec is None:
        kind = HF_KIND if "tokenizer_config.json" in files else CHAR_KIND
        tok = from_files(kind, files, chat_template=cfg.data.chat_template, system_prompt=cfg.data.system_prompt)
    else:
        tok = from_files(
            spec.tokenizer,
            files,
            chat_template=spec.chat_template,
            system_prompt=spec.system_prompt,
            eos_ids=spec.eos_ids,
        )
    return Policy(model, tok, files, _vocab(model), lora, base)


def _vocab(model: torch.nn.Module) -> int:
    emb = model.get_input_embeddings()  # type: ignore[operator]
    return int(emb.weight.shape[0])


def run_spec(cfg: TrainerConfig, policy: Policy) -> RunSpec:
    """What this trainer's actors must do, from its options."""
    reward = cfg.reward.reward
    if reward is None:
        if cfg.data.data is None:
            reward = f"task:{cfg.data.task}"
        elif cfg.data.data_format is not None:
            reward = "math"
        else:
            raise RunSpecError("--data without --data-format needs a --reward (math, exact, regex:..., module:fn)")
    hf = isinstance(policy.tokenizer, HFTokenizer)
    return RunSpec(
        tokenizer=policy.tokenizer.kind,
        chat_template=bool(hf and policy.tokenizer.chat_template),  # type: ignore[attr-defined]
        system_prompt=cfg.data.system_prompt if hf else None,
        sampling=cfg.sampling,
        reward=reward,
        reward_timeout_s=cfg.reward.reward_timeout_s,
        eos_ids=policy.tokenizer.eos_ids,
        artefact=_artefact(cfg, policy),
    )


def _artefact(cfg: TrainerConfig, policy: Policy) -> Artefact:
    """What each version holds: every weight (quantized, with ``--publish-dtype`` naming a scheme), or
    (``--lora-rank``) the adapter over the base the run carries."""
    settings = lora_settings(cfg)
    dtype = cfg.publish.float_dtype
    if settings is None or policy.lora is None:
        if cfg.publish.scheme is not None:
            return Artefact(kind="quantized", dtype=dtype, scheme=cfg.publish.scheme)
        return Artefact(kind="weights", dtype=dtype)
    lora = replace(policy.lora, rank=settings.rank, alpha=settings.alpha, targets=settings.targets)
    return Artefact(kind="lora", dtype=dtype, lora=lora)


def verified_files(run: Run) -> dict[str, bytes]:
    """The run's attached files as its latest version's verified manifest lists them (hash-checked):
    a file swapped in the bucket since is refused, and one no version names is not read. A LoRA
    run's base is left out (read on its own, :mod:`aurora_store.bucket.lora_base`)."""
    latest = run.latest()
    return {} if latest is None else run.reader.files(run.manifest(latest), names=lambda name: not base_files(name))


def recorded_spec(run: Run) -> RunSpec | None:
    """The run's ``aurora_run.json``, or None for a run started by an earlier trainer (it had none)."""
    files = verified_files(run)
    if RUN_SPEC not in files:
        return None
    return RunSpec.from_bytes(files[RUN_SPEC], f"{run.uri}/files/{RUN_SPEC}")


def record(run: Run, policy: Policy, spec: RunSpec) -> None:
    """Attach the policy's files and the run spec (before version 0, so its manifest lists them)."""
    for name, data in sorted(policy.files.items()):
        run.files.put(name, data)
    run.files.put(RUN_SPEC, spec.to_bytes())


def check_resume(run: Run, recorded: RunSpec | None, mine: RunSpec) -> None:
    """A restarted trainer must sample and score as the run was started; say what differs if not."""
    if recorded is not None and recorded != mine:
        raise RunSpecError(
            f"{run.uri}: this run was started with other settings ({'; '.join(recorded.differences(mine))}); "
            "restart with the run's own, or start a new run"
        )


def frozen_copy(policy: Policy, device: torch.device, run: Run | None = None) -> torch.nn.Module:
    """A frozen module of the policy's architecture in the dtype it computes in (BF16 on GPU; on CPU
    FP32, which holds BF16 weights exactly), weights undefined until copied in; of a LoRA policy, the
    base ``run`` carries (once it has a committed version) under an adapter of the run's shape, the
    adapter undefined until copied in."""
    config = hostile_json.loads(policy.files["config.json"])
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(config, seed=0).to(dtype=dtype)
    if policy.lora is not None:
        if run is not None and run.latest() is not None:  # a new run's base is copied in with the adapter
            adapter.load_base_into(run, model, policy.lora, policy.base)
        model = adapter.wrap(model, adapter.settings_of(policy.lora))
    return model.to(device=device).eval().requires_grad_(False)


def version_loader(policy: Policy, run: Run, copy: torch.nn.Module) -> Callable[[int], Mapping[str, torch.Tensor]]:
    """A published version's weights by the parameter names of ``copy`` (a :func:`frozen_copy`): the
    run's tensors, or of a LoRA run the version's adapter over the base the copy holds."""
    if policy.lora is None:
        return run.materialize
    return lambda version: adapter.version_weights(copy, run.materialize(version))


def reference_model(policy: Policy, run: Run, device: torch.device) -> torch.nn.Module:
    """The frozen KL reference: version 0 exactly as published."""
    ref = frozen_copy(policy, device, run)
    weights = version_loader(policy, run, ref)(0)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            p.copy_(weights[name].to(p.dtype))
    return ref


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))
