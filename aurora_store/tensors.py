"""torch tensors <-> word arrays: the only module of the store core that imports torch."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from aurora_store.errors import StoreError, UnsupportedError
from aurora_store.format.manifest import TensorSpec
from aurora_store.format.manifest_parser import check_tensor_name

_TO_NAME = {
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}
for _n, _t in (("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64")):
    if hasattr(torch, _t):
        _TO_NAME[getattr(torch, _t)] = _n
_FROM_NAME = {v: k for k, v in _TO_NAME.items()}
WORDS: dict[int, torch.dtype] = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
"""The torch dtype that holds an element's bit pattern, by its width in bytes: the one table of the
project. Wider words are signed because torch's uint16/32/64 lack most ops (indexing, scatter,
comparisons on every backend); a one-byte word is ``uint8``, which torch supports fully and which
is exactly the host's ``<u1`` word, so a one-byte word needs no reinterpretation either way (bool,
int8, uint8 and FP8 tensors alike) and never sign-extends under a shift."""


def word_view(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bit patterns as the word tensor of its width (:data:`WORDS`), sharing its memory."""
    return t.detach().view(WORDS[t.element_size()])


def word_views(state_dict: Mapping[str, torch.Tensor]) -> tuple[tuple[TensorSpec, ...], dict[str, torch.Tensor]]:
    """Specs (sorted by name) and flat views of a state dict's bit patterns, each the word tensor
    of its element's width (:data:`WORDS`) on the tensor's own device; no copy for contiguous
    tensors."""
    if not isinstance(state_dict, Mapping):
        raise StoreError(f"state_dict must be a mapping of names to tensors, got {type(state_dict).__name__}")
    specs = []
    views = {}
    for name, t in state_dict.items():
        check_tensor_name(name, StoreError)
        if not isinstance(t, torch.Tensor):
            raise StoreError(f"{name!r} is a {type(t).__name__}, expected a torch.Tensor")
        if t.layout != torch.strided or t.is_meta:
            raise UnsupportedError(f"{name!r}: only dense tensors with data can be published")
        dt = _TO_NAME.get(t.dtype)
        if dt is None:
            raise UnsupportedError(f"{name!r}: dtype {t.dtype} is not supported (known: {sorted(_FROM_NAME)})")
        flat = t.detach().contiguous().reshape(-1)
        views[name] = word_view(flat)
        specs.append(TensorSpec(name, dt, tuple(int(s) for s in t.shape)))
    specs.sort(key=lambda s: s.name)
    return tuple(specs), views


def host_words(view: torch.Tensor) -> np.ndarray:
    """A word view (:func:`word_views`) as a flat little-endian word array on the host (a copy
    only when it lives on another device)."""
    v = view if view.device.type == "cpu" else view.cpu()
    return v.numpy().view(f"<u{v.element_size()}")


def word_tensor(words: np.ndarray) -> torch.Tensor:
    """A host word array as the word tensor :func:`word_views` makes (:data:`WORDS`), sharing its memory."""
    return torch.from_numpy(words.view(f"<i{words.dtype.itemsize}" if words.dtype.itemsize > 1 else "<u1"))


def to_words(state_dict: Mapping[str, torch.Tensor]) -> tuple[tuple[TensorSpec, ...], dict[str, np.ndarray]]:
    """Specs (sorted by name) and flat word arrays of a state dict on the host; no copy for
    contiguous CPU tensors."""
    specs, views = word_views(state_dict)
    return specs, {k: host_words(v) for k, v in views.items()}


def torch_dtype(spec: TensorSpec) -> torch.dtype:
    """The torch dtype of a tensor spec."""
    dt = _FROM_NAME.get(spec.dtype)
    if dt is None:
        raise UnsupportedError(f"{spec.name!r}: dtype {spec.dtype} has no torch equivalent here")
    return dt


def dtype_named(name: str) -> torch.dtype:
    """The torch dtype of a safetensors dtype name (``BF16``, ``I8``, ``F8_E4M3``)."""
    dt = _FROM_NAME.get(name)
    if dt is None:
        raise UnsupportedError(f"dtype {name!r:.40} has no torch equivalent here")
    return dt


def from_words(spec: TensorSpec, words: np.ndarray) -> torch.Tensor:
    """A torch tensor sharing memory with ``words`` (flat little-endian words)."""
    return word_tensor(words).view(torch_dtype(spec)).reshape(spec.shape)
