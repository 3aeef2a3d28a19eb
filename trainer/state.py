"""The trainer's resumable state: FP32 masters, optimizer, RNG, position.

Saved every K versions through the run's :class:`~aurora_store.bucket.state.StateStore`
(``trainer/state-<version>/``, see docs/FORMAT.md): ``tensors.safetensors`` (master weights
and AdamW moments, by HF name) and ``state.json`` (the version it belongs to, the optimizer's
step counts and hyper-parameters, RNG states), written last: its existence is the commit, as
a manifest is for a version. No pickle: safetensors and JSON only.
"""

from __future__ import annotations

import base64
import json
import random
from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from aurora_store.bucket.run import Run
from aurora_store.errors import CorruptError, StoreError
from aurora_store.format import hostile_json

MAX_JSON_BYTES = 1 << 20
TENSORS = "tensors.safetensors"


@dataclass(frozen=True, slots=True)
class SavedState:
    version: int
    extra: dict[str, Any]


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor, on the CPU: a DTensor shard is gathered (a collective: every rank must call)."""
    full = getattr(t, "full_tensor", None)
    return (full() if full is not None else t).detach().cpu()


def _like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``full`` laid out as ``like``: this rank's shard when ``like`` is a DTensor."""
    mesh = getattr(like, "device_mesh", None)
    if mesh is None:
        return full.to(like.device)
    from torch.distributed.tensor import distribute_tensor

    on_mesh = full.to(device=mesh.device_type, dtype=like.dtype)
    return distribute_tensor(on_mesh, mesh, like.placements)  # type: ignore[attr-defined]


def save_state(
    run: Run,
    version: int,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    rng: random.Random,
    extra: dict[str, Any] | None = None,
    *,
    write: bool = True,
) -> None:
    """Write the state that produced ``version`` (after its optimizer step). Under FSDP2 every rank
    calls it (shards are gathered) and only the one with ``write`` set writes."""
    names = {id(p): n for n, p in model.named_parameters()}
    tensors: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        tensors[f"model/{name}"] = _full(param).float().contiguous()
    steps: dict[str, float] = {}
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state.get(p, {})
            n = names.get(id(p))
            if n is None:
                raise StoreError("trainer state: the optimizer holds a parameter the model does not have")
            for k in ("exp_avg", "exp_avg_sq"):
                if k in st:
                    tensors[f"opt/{n}/{k}"] = _full(st[k]).contiguous()
            if "step" in st:
                steps[n] = float(st["step"])
    if not write:
        return
    doc = {
        "format": "aurora-trainer-state/1",
        "version": version,
        "opt_steps": steps,
        "opt_groups": [{k: v for k, v in g.items() if k != "params" and _jsonable(v)} for g in opt.param_groups],
        "python_rng": _encode_rng(rng.getstate()),
        "torch_rng": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
        "extra": extra or {},
    }
    run.state.put(version, TENSORS, st_save(tensors))
    run.state.commit(version, json.dumps(doc, sort_keys=True).encode())


def saved_versions(run: Run) -> list[int]:
    """Versions with a committed trainer state, ascending."""
    return run.state.versions()


def load_state(
    run: Run, version: int, model: torch.nn.Module, opt: torch.optim.Optimizer, rng: random.Random
) -> SavedState:
    """Restore the state saved at ``version`` into ``model``, ``opt`` and ``rng`` (in place)."""
    where = run.state.url(version)
    try:
        doc = hostile_json.loads(run.state.get_commit(version, max_bytes=MAX_JSON_BYTES))
        if not isinstance(doc, dict) or doc.get("format") != "aurora-trainer-state/1" or doc.get("version") != version:
            raise CorruptError(f"{where}: state.json is not the trainer state of version {version}")
        cap = 12 * sum(p.numel() for p in model.parameters()) + (1 << 20)  # masters + two moments, + header
        tensors = st_load(run.state.get(version, TENSORS, max_bytes=cap))
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptError(f"{where}: unreadable trainer state: {exc}") from None
    params = dict(model.named_parameters())
    expected = {f"model/{n}" for n in params}
    if not expected <= set(tensors):
        raise CorruptError(f"{where}: state lacks {sorted(expected - set(tensors))[:3]}")
    with torch.no_grad():
        for n, p in params.items():
            src = tensors[f"model/{n}"]
            if src.shape != p.shape:
                raise CorruptError(f"{where}: {n} has shape {tuple(src.shape)}, the model {tuple(p.shape)}")
            p.copy_(_like(src, p))
    for n, p in params.items():
        if n in doc["opt_steps"]:
            opt.state[p] = {
                "step": torch.tensor(doc["opt_steps"][n]),
                "exp_avg": _like(tensors[f"opt/{n}/exp_avg"].clone(), p),
                "exp_avg_sq": _like(tensors[f"opt/{n}/exp_avg_sq"].clone(), p),
            }
    rng.setstate(_decode_rng(doc["python_rng"]))
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(doc["torch_rng"])), dtype=torch.uint8))
    return SavedState(version, dict(doc.get("extra", {})))


def _jsonable(v: object) -> bool:
    try:
        json.dumps(v)
    except (TypeError, ValueError):
        return False
    return True


def _encode_rng(state: tuple[Any, ...]) -> list[Any]:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _decode_rng(doc: list[Any]) -> tuple[Any, ...]:
    if not isinstance(doc, list) or len(doc) != 3:
        raise StoreError("trainer state: bad python_rng")
    return (doc[0], tuple(doc[1]), doc[2])
