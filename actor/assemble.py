"""What an actor builds from its region's bucket alone: the run's spec, its tokenizer, its engine.

Sampling (group size, lengths, temperature, top-p), the reward and the tokenizer's settings come
from the run's ``aurora_run.json``, written by the trainer, never from actor flags that could
disagree with it. A run an earlier trainer started has no ``aurora_run.json``: its
``task.json`` names the task and the defaults of that time apply. The torch engine is the
model built from the run's ``config.json`` in BF16, its weights then loaded from the version
the actor bootstraps on; vLLM loads that version replayed as a HF directory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import TYPE_CHECKING, Any

import torch

from actor.config import EngineConfig
from actor.engines.base import Engine
from actor.engines.dequantized import DequantizedWeights
from actor.engines.torch import TorchEngine
from actor.live import TensorWeights
from aurora_store.bucket.lora_base import base_files, load_base
from aurora_store.bucket.run import Run
from aurora_store.errors import UnsupportedError
from aurora_store.format import hostile_json
from aurora_store.rl.adapters import adapter_parameters, wrap
from aurora_store.rl.errors import ModelError
from aurora_store.rl.models import build_model, check_config, tied_names
from aurora_store.rl.runspec import NAME as RUN_SPEC
from aurora_store.rl.runspec import LoraSpec, RunSpec, RunSpecError
from aurora_store.rl.sampling import SamplingConfig
from aurora_store.rl.tokenizers import CHAR_KIND, EOS, Tokenizer, from_files
from aurora_store.tensors import from_words

if TYPE_CHECKING:
    from collections.abc import Mapping


def run_files(run: Run, version: int) -> dict[str, bytes]:
    """The run's attached files as verified ``version``'s manifest lists them (their hashes checked
    against it), never as the bucket merely holds them; a LoRA run's base is not among them (it is
    loaded on its own, :mod:`aurora_store.bucket.lora_base`)."""
    return run.reader.files(run.manifest(version), names=lambda name: not base_files(name))


def run_spec(run: Run, files: Mapping[str, bytes]) -> RunSpec:
    """The run's ``aurora_run.json``, or for a run an earlier trainer started, what its ``task.json`` implies."""
    if RUN_SPEC in files:
        return RunSpec.from_bytes(files[RUN_SPEC], f"{run.uri}/files/{RUN_SPEC}")
    if "task.json" not in files:
        raise RunSpecError(f"{run.uri}: the run has neither {RUN_SPEC} nor task.json")
    try:
        task = hostile_json.loads(files["task.json"])["task"]
    except (ValueError, KeyError, TypeError):
        raise RunSpecError(f"{run.uri}/files/task.json: not a task record") from None
    if not isinstance(task, str):
        raise RunSpecError(f"{run.uri}/files/task.json: the task must be named by a string")
    return RunSpec(
        tokenizer=CHAR_KIND,
        chat_template=False,
        system_prompt=None,
        sampling=SamplingConfig(),
        reward=f"task:{task}",
        reward_timeout_s=10.0,
        eos_ids=(EOS,),
    )


def tokenizer(spec: RunSpec, files: Mapping[str, bytes]) -> Tokenizer:
    return from_files(
        spec.tokenizer, files, chat_template=spec.chat_template, system_prompt=spec.system_prompt, eos_ids=spec.eos_ids
    )


def vocab_size(run: Run, files: Mapping[str, bytes]) -> int:
    """Rows of the model's embedding (``config.json``): every prompt id must be below it."""
    return int(_config(run, files)["vocab_size"])


def _config(run: Run, files: Mapping[str, bytes]) -> dict[str, Any]:
    if "config.json" not in files:
        raise ModelError(f"{run.uri}: the run has no config.json")
    try:
        return check_config(hostile_json.loads(files["config.json"]))
    except ValueError as exc:
        raise ModelError(f"{run.uri}/files/config.json: not JSON ({exc})") from None


def _check_ties(run: Run, config: Mapping[str, Any]) -> None:
    """A config that ties the word embeddings (one tensor as input embedding and output head) over a run
    that publishes both as two tensors: they may differ, and an engine keeps one (vLLM maps both onto one
    parameter, which would hold whichever came last). Refused before any engine is built."""
    latest = run.latest()
    if not config.get("tie_word_embeddings") or latest is None:
        return
    names = [t.name for t in run.manifest(latest).tensors]
    head = [n for n in names if n.endswith("lm_head.weight")]
    embed = [n for n in names if n.endswith("embed_tokens.weight")]
    if head and embed:
        raise ModelError(
            f"{run.uri}: its config.json ties the word embeddings (tie_word_embeddings), but version {latest} "
            f"publishes {head[0]} and {embed[0]} as two tensors, which may differ: an actor cannot hold both. "
            "Publish the embedding once (a trainer does: tied tensors are one), or untie them in config.json"
        )


def engine(run: Run, spec: RunSpec, files: Mapping[str, bytes], cfg: EngineConfig, worker_id: str) -> Engine:
    config = _config(run, files)
    _check_ties(run, config)
    lora = spec.artefact.lora
    if lora is not None and cfg.engine == "torch":
        return TorchEngine(
            lora_model(run, config, spec),
            device=cfg.device,
            eos_ids=spec.eos_ids,
            live=lambda model, device: TensorWeights(adapter_parameters(model), device=device),
        )
    if lora is not None:
        return vllm_lora_engine(run, spec, lora, cfg, worker_id)
    if cfg.engine == "torch":
        model = build_model(config, dtype=getattr(torch, spec.artefact.dtype))  # what versions hold
        scheme = spec.artefact.scheme
        if scheme is None:
            return TorchEngine(model, device=cfg.device, eos_ids=spec.eos_ids)
        return TorchEngine(
            model,
            device=cfg.device,
            eos_ids=spec.eos_ids,
            live=lambda model, device: DequantizedWeights(model, scheme, device=device),
        )
    # vLLM loads a HF directory: the region's latest version, replayed bit-exact; later versions are
    # written to what vLLM computes from (actor/engines/vllm/engine.py)
    from actor.engines.vllm.engine import VllmEngine

    if spec.artefact.scheme == "fp8-e4m3-block128" and _vllm_on_cpu():
        raise UnsupportedError(
            f"{run.uri}: the run publishes FP8 weights, which vLLM's CPU build cannot serve (it has no FP8 "
            "linear kernel); serve it with --engine torch (computing from the dequantized words) or vLLM on a GPU"
        )
    from aurora_store.bucket.replay import replay

    out = tempfile.mkdtemp(prefix=f"aurora-{worker_id}-")
    try:
        replay(run, None, out, force=True, scheme=spec.artefact.scheme)  # a quantized run: its checkpoint
        return VllmEngine(
            out,
            tensor_parallel_size=cfg.tensor_parallel,
            stop_token_ids=list(spec.eos_ids),
            dtype=spec.artefact.dtype,
            weight_transfer=cfg.vllm_weight_transfer,
            enable_prefix_caching=cfg.vllm_prefix_caching,
            max_model_len=cfg.vllm_max_model_len,
        )
    finally:  # vLLM has read it (or failed to): the weights now live in the engine
        shutil.rmtree(out, ignore_errors=True)


def _vllm_on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def vllm_lora_engine(run: Run, spec: RunSpec, lora: LoraSpec, cfg: EngineConfig, worker_id: str) -> Engine:
    """vLLM over the run's base (replayed, verified against the digest the run names), serving each
    version's adapter (:mod:`actor.engines.vllm.lora`). A rank above the engine's is refused first."""
    from actor.engines.vllm.lora import VllmLoraEngine, engine_rank
    from aurora_store.bucket.replay import BASE_DIR, Adapter, replay

    if cfg.tensor_parallel != 1:
        raise UnsupportedError(
            f"{run.uri}: a LoRA run on vLLM runs on one rank here (tensor parallelism with adapters is not "
            "built): start this actor with --tensor-parallel 1"
        )
    rank = engine_rank(lora.rank, cfg.vllm_max_lora_rank)  # before minutes of start-up
    shape = Adapter(lora.rank, lora.alpha, lora.targets, lora.base_files, lora.base_digest)
    out = tempfile.mkdtemp(prefix=f"aurora-{worker_id}-")
    try:
        replay(run, None, os.path.join(out, "replay"), adapter=shape)
        return VllmLoraEngine(
            os.path.join(out, "replay", BASE_DIR),
            shape,
            max_lora_rank=rank,
            stop_token_ids=list(spec.eos_ids),
            dtype=spec.artefact.dtype,
            enable_prefix_caching=cfg.vllm_prefix_caching,
            max_model_len=cfg.vllm_max_model_len,
        )
    finally:  # vLLM has read the base; each version's adapter is written where the engine keeps them
        shutil.rmtree(out, ignore_errors=True)


def lora_model(run: Run, config: Mapping[str, Any], spec: RunSpec) -> torch.nn.Module:
    """A LoRA run's engine model: the model ``config.json`` describes, holding the base the run carries
    (verified against the digest the run names), wrapped by a new adapter of the run's shape; the
    versions' adapters are then written into that adapter's parameters."""
    lora = spec.artefact.lora
    assert lora is not None
    latest = run.latest()
    if latest is None:
        raise ModelError(f"{run.uri}: the run has no committed version yet, so no base to build on")
    base = load_base(run, run.manifest(latest), lora.base_files, lora.base_digest)
    model = build_model(dict(config), dtype=getattr(torch, spec.artefact.dtype))
    state = model.state_dict()
    names = {s.name for s in base.specs}
    extra = sorted(names - state.keys())
    missing = sorted(state.keys() - names - tied_names(state))
    if extra or missing:
        raise ModelError(
            f"{run.uri}: the run's LoRA base does not fit its config.json: "
            f"{'no such tensor ' + extra[0] if extra else 'no ' + missing[0] + ' in the base'}"
        )
    with torch.no_grad():
        for s in base.specs:
            t = from_words(s, base.words[s.name])
            if tuple(t.shape) != tuple(state[s.name].shape) or t.dtype != state[s.name].dtype:
                raise ModelError(f"{run.uri}: the LoRA base's {s.name} is {s.dtype} {s.shape}, the model's is not")
            state[s.name].copy_(t)
    return wrap(model, rank=lora.rank, alpha=lora.alpha, targets=lora.targets)
