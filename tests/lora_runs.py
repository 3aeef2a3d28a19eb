"""LoRA runs for the tests (issue 36): a tiny model's base carried by the run, and a few versions of an
adapter trained over it with PEFT, published as the trainer publishes them."""

from __future__ import annotations

from typing import Any

import torch

import aurora_store
from aurora_store.rl.models import build_model, model_files, tiny_config
from aurora_store.rl.runspec import NAME, Artefact, RunSpec
from aurora_store.rl.sampling import SamplingConfig
from aurora_store.rl.tokenizers import CharTokenizer
from trainer.adapter import LoraSettings, attach, round_base, wrap
from trainer.publication import ModelPublisher, artefact_for

SETTINGS = LoraSettings(rank=4, alpha=8.0, targets=("q_proj", "v_proj"))
VOCAB = CharTokenizer().vocab_size
IDS = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(1))


def lora_run(
    uri: str,
    versions: int = 3,
    *,
    lr: float = 3e-2,
    storage_options: Any = None,
    config: dict[str, Any] | None = None,
    settings: LoraSettings = SETTINGS,
    fulls: tuple[int, ...] = (),
    rotations: dict[int, Any] | None = None,
    **open_kw: Any,
) -> tuple[Any, Any]:
    """A LoRA run at ``uri`` with ``versions`` versions whose adapter moves every step (over a model of
    ``config``, default a tiny one; ``fulls``: steps published as full versions besides 0; ``rotations``:
    the signing key each of those steps rotates to, as ``--rotate-signing-key`` does; ``open_kw``: the
    run's options); returns the run and the trainer's wrapped model (FP32 masters)."""
    run = aurora_store.open_run(uri, storage_options=storage_options, **open_kw)
    chars = CharTokenizer()
    model = build_model(config or tiny_config(VOCAB), seed=5)
    round_base(model, torch.bfloat16)
    for name, data in {**model_files(model), **chars.files()}.items():
        run.files.put(name, data)
    lora = attach(run, model, settings, torch.bfloat16)
    spec = RunSpec(
        tokenizer="aurora-char",
        chat_template=False,
        system_prompt=None,
        sampling=SamplingConfig(group=2, max_new_tokens=4),
        reward="task:arith",
        reward_timeout_s=5.0,
        eos_ids=chars.eos_ids,
        artefact=Artefact(kind="lora", lora=lora),
    )
    run.files.put(NAME, spec.to_bytes())
    policy = wrap(model, settings)
    publisher = ModelPublisher(run, policy, artefact=artefact_for(spec.artefact))
    publisher.publish(step=0, kind="full")
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=lr)
    for step in range(1, versions):
        policy(input_ids=IDS, labels=IDS).loss.backward()
        opt.step()
        opt.zero_grad()
        if rotations and step in rotations:
            run.signing.rotate_to(rotations[step])  # the next version published is the rotation
        publisher.publish(step=step, kind="full" if step in fulls else "auto")
    return run, policy
