"""LoRA adapters, for the trainer and the actors alike: PEFT wraps a base model, and an adapter's
matrices are named as PEFT saves them (``base_model.model.<module>.lora_A.weight``).

PEFT does the adapter (``get_peft_model``, target matching); this module only says how a run's
adapter maps onto a wrapped model's parameters, so a version's tensors are written into them in
place (:func:`adapter_parameters`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch

from aurora_store.rl.errors import ModelError

ADAPTER_NAME = "default"
"""The one adapter a wrapped model holds (PEFT's default name, which its saved names leave out)."""


def check_targets(model: torch.nn.Module, targets: Sequence[str]) -> None:
    """Every target names linear layers of ``model`` (PEFT's match: a module's name, or its last parts)
    other than its output head, or a ModelError says which does not. An adapter over the output head or
    an embedding is saved by PEFT with that layer's whole weights (not an adapter's matrices, which is
    what a version of a LoRA run holds), and vLLM serves neither."""
    output = getattr(model, "get_output_embeddings", None)
    head = output() if callable(output) else None
    modules = list(model.named_modules())
    linear = sorted({n.rsplit(".", 1)[-1] for n, m in modules if isinstance(m, torch.nn.Linear) and m is not head})
    for target in targets:
        matched = [m for n, m in modules if n == target or n.endswith("." + target)]
        if not matched:
            raise ModelError(
                f"LoRA targets {target}: no module of the model is named so (its linear layers: {', '.join(linear)})"
            )
        if any(not isinstance(m, torch.nn.Linear) or m is head for m in matched):
            raise ModelError(
                f"LoRA targets {target}: not a linear layer of the decoder (an output head or an embedding is "
                f"saved whole with its adapter, and vLLM serves no adapter over it); target {', '.join(linear)}"
            )


def wrap(model: torch.nn.Module, *, rank: int, alpha: float, targets: Sequence[str]) -> torch.nn.Module:
    """``model`` frozen under a new LoRA adapter (PEFT's initialisation: B is zero, so it computes
    exactly as the base until the adapter moves). A ModelError names targets the model does not have
    or that are not its linear layers (:func:`check_targets`)."""
    import peft

    check_targets(model, targets)

    config = peft.LoraConfig(
        r=rank,
        lora_alpha=alpha,  # type: ignore[arg-type]  # PEFT annotates int; it scales by alpha / r
        target_modules=list(targets),
        lora_dropout=0.0,
        bias="none",
    )
    try:
        with warnings.catch_warnings():  # PEFT asks transformers a deprecated question; nothing for a user to do
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            # the adapter in the base's own dtype (PEFT would widen it to FP32 over a BF16 base): an
            # actor's adapter holds the bits a version publishes, the trainer's its FP32 masters
            return peft.get_peft_model(model, config, autocast_adapter_dtype=False)
    except ValueError as exc:
        present = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ModelError(
            f"LoRA targets {', '.join(targets)}: {str(exc).splitlines()[0][:200]} "
            f"(the model's linear layers: {', '.join(present)})"
        ) from None


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's matrices of a wrapped model, by the names PEFT saves them under: what a version
    of a LoRA run holds.

    Read from the model's own state dict rather than PEFT's ``get_peft_model_state_dict``: under FSDP2
    the matrices are DTensors, and each rank publishes its own shard of them. PEFT 0.22 gathers every
    DTensor whole in that function (a collective on every rank, after which rank 0 would publish all
    of it). The names are PEFT's saved names: the adapter's name left out (:func:`saved_name`)."""
    return {saved_name(k): v for k, v in model.state_dict().items() if _is_adapter_matrix(k)}


def _is_adapter_matrix(key: str) -> bool:
    return any(f"{part}{ADAPTER_NAME}." in key for part in _MATRICES)


_MATRICES = (".lora_A.", ".lora_B.")
"""The adapter's two matrices in a module's name: the only tensors of an adapter over linear layers
with no bias (:func:`wrap`'s configuration)."""


def saved_name(parameter: str) -> str:
    """The name PEFT saves a wrapped model's adapter parameter under
    (``...q_proj.lora_A.default.weight`` -> ``...q_proj.lora_A.weight``): :func:`parameter_name`'s
    inverse."""
    for part in _MATRICES:
        if f"{part}{ADAPTER_NAME}." in parameter:
            return parameter.replace(f"{part}{ADAPTER_NAME}.", part, 1)
    raise ModelError(f"{parameter!r} is not a LoRA adapter's parameter")


def parameter_name(saved: str) -> str:
    """The wrapped model's parameter that a saved adapter tensor's name stands for
    (``...q_proj.lora_A.weight`` -> ``...q_proj.lora_A.default.weight``)."""
    for part in _MATRICES:
        if part in saved:
            return saved.replace(part, f"{part}{ADAPTER_NAME}.", 1)
    raise ModelError(f"{saved!r} is not a LoRA adapter's tensor")


def adapter_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The wrapped model's adapter parameters by their saved names: the tensors a version's adapter is
    written into, in place."""
    params = dict(model.named_parameters())
    return {name: params[parameter_name(name)] for name in adapter_state(model)}
