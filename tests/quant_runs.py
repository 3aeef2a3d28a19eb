"""Runs of quantized weights for the tests (issue 37): a tiny model trained a few steps, each version
published as the trainer publishes a run with ``--publish-dtype``: its linear projections as a
scheme's words and scales, everything else in BF16."""

from __future__ import annotations

from typing import Any

import torch

import aurora_store
from aurora_store.rl.models import build_model, model_files, tiny_config
from aurora_store.rl.runspec import NAME, Artefact, RunSpec
from aurora_store.rl.sampling import SamplingConfig
from aurora_store.rl.tokenizers import CharTokenizer
from trainer.publication import ModelPublisher, artefact_for

VOCAB = CharTokenizer().vocab_size
IDS = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(1))
SCHEMES = ("fp8-e4m3-block128", "int8-w8a8-channel")


def spec_of(scheme: str) -> RunSpec:
    """The run spec a trainer with ``--publish-dtype scheme`` writes for a char-tokenizer task."""
    return RunSpec(
        tokenizer="aurora-char",
        chat_template=False,
        system_prompt=None,
        sampling=SamplingConfig(group=2, max_new_tokens=4),
        reward="task:arith",
        reward_timeout_s=5.0,
        eos_ids=CharTokenizer().eos_ids,
        artefact=Artefact(kind="quantized", scheme=scheme),
    )


def quantized_run(
    uri: str,
    scheme: str,
    versions: int = 3,
    *,
    lr: float = 3e-3,
    config: dict[str, Any] | None = None,
    fulls: tuple[int, ...] = (),
    words_only: tuple[int, ...] = (),
    rotations: dict[int, Any] | None = None,
    storage_options: Any = None,
    **open_kw: Any,
) -> tuple[Any, torch.nn.Module]:
    """A run at ``uri`` of ``versions`` versions of a model (``config``, default a tiny one) trained by
    Adam, each published quantized by ``scheme`` (``fulls``: steps published as full versions besides
    0; ``words_only``: steps that move words but no scale instead, :func:`halve_below_max`;
    ``rotations``: the signing key each of those steps rotates to; ``open_kw``: the run's options);
    returns the run and the trainer's model (FP32 masters)."""
    run = aurora_store.open_run(uri, storage_options=storage_options, **open_kw)
    chars = CharTokenizer()
    model = build_model(config or tiny_config(VOCAB), seed=5)
    spec = spec_of(scheme)
    for name, data in {**model_files(model), **chars.files(), NAME: spec.to_bytes()}.items():
        run.files.put(name, data)
    publisher = ModelPublisher(run, model, artefact=artefact_for(spec.artefact))
    publisher.publish(step=0, kind="full")
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for step in range(1, versions):
        if step in words_only:
            halve_below_max(model)
        else:
            model(input_ids=IDS, labels=IDS).loss.backward()
            opt.step()
            opt.zero_grad()
        if rotations and step in rotations:
            run.signing.rotate_to(rotations[step])  # the next version published is the rotation
        publisher.publish(step=step, kind="full" if step in fulls else "auto")
    return run, model


@torch.no_grad()
def halve_below_max(model: torch.nn.Module) -> None:
    """Halve every element of every ``q_proj`` weight but the largest in magnitude of its row and of its
    128-column block row: many quantized words change (what the model computes, too) and no scale does,
    per channel or per 128 x 128 block (each row's and block's largest element stays)."""
    for name, p in model.named_parameters():
        if not name.endswith("q_proj.weight"):
            continue
        w = p.data
        keep = torch.zeros_like(w, dtype=torch.bool)
        for lo in range(0, w.shape[1], 128):
            part = w[:, lo : lo + 128].abs()
            keep[:, lo : lo + 128] |= part == part.amax(dim=1, keepdim=True)
        for lo in range(0, w.shape[0], 128):  # the largest of each block is also kept
            for co in range(0, w.shape[1], 128):
                blk = w[lo : lo + 128, co : co + 128].abs()
                keep[lo : lo + 128, co : co + 128] |= blk == blk.max()
        keep |= w.abs() == w.abs().amax(dim=1, keepdim=True)
        w[~keep] *= 0.5
