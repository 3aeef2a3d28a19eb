"""Where each element of an HF-named tensor lives in vLLM's fused, tensor-parallel parameters.

vLLM loads Qwen3/Llama-style checkpoints into its own layout: ``q/k/v_proj`` become the rows
``[q | k | v]`` of ``qkv_proj``, ``gate/up_proj`` the rows ``[gate | up]`` of ``gate_up_proj``,
and with ``tp`` ranks every column-parallel tensor is split by output rows per rank (each rank:
its q heads, its k heads, its v heads; its slice of gate, its slice of up), row-parallel
weights (``o_proj``, ``down_proj``) by input columns, the vocabulary tensors by rows after
padding the vocabulary to a multiple of 64 (``pad_vocab_size``, then split evenly; rows past
the vocabulary are zero), and norms are replicated. :class:`VllmLayout` maps flat HF positions
to (rank, vLLM parameter, local flat position) in O(positions), never building an HF tensor.
No vllm import: this mirrors vLLM's loaders (``QKVParallelLinear``, ``MergedColumnParallelLinear``,
``RowParallelLinear``, ``VocabParallelEmbedding``) without LoRA or replicated KV heads.

Quantized projections (docs/FORMAT.md §6a) keep their words under ``weight`` (laid out as BF16 weights
are) beside their scales, which vLLM fuses and splits as their weights: per-channel ``weight_scale``
[N, 1] by output rows (so row-parallel layers replicate it), block ``weight_scale_inv`` [N/128, K/128]
by blocks of rows (fused parts must then be whole blocks, as vLLM's block-FP8 loader requires) or of
columns.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from aurora_store.errors import LayoutError
from aurora_store.format.manifest import TensorSpec

VOCAB_PADDING = 64
"""vLLM's ``DEFAULT_VOCAB_PADDING_SIZE``: the whole vocabulary is padded to a multiple of it."""

_KINDS = r"(?P<kind>weight|bias|weight_scale|weight_scale_inv)"
_QKV = re.compile(r"^(?P<pre>.+)\.(?P<part>q|k|v)_proj\." + _KINDS + "$")
_GATE_UP = re.compile(r"^(?P<pre>.+)\.(?P<part>gate|up)_proj\." + _KINDS + "$")
_ROW = re.compile(r"\.(o_proj|down_proj)\." + _KINDS + "$")
BLOCK = 128
"""The side of a block-FP8 scale's block (``weight_scale_inv``)."""
_VOCAB = re.compile(r"(^|\.)(?P<which>embed_tokens|lm_head)\.weight$")
_NORM = re.compile(r"norm\.(weight|bias)$")


@dataclass(frozen=True, slots=True)
class Geometry:
    """The attention shape the fused layout depends on (from the model's config.json)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    tied: bool = False
    """``tie_word_embeddings``: vLLM keeps one parameter, ``model.embed_tokens.weight``."""

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Geometry:
        try:
            heads = int(config["num_attention_heads"])
            kv = int(config.get("num_key_value_heads") or heads)
            head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
            raise LayoutError(f"config.json lacks a usable attention shape: {exc!r}") from None
        if min(heads, kv, head_dim) < 1 or heads % kv:
            raise LayoutError(f"config.json: {heads} attention heads cannot share {kv} KV heads")
        return cls(heads, kv, head_dim, bool(config.get("tie_word_embeddings", False)))


@dataclass(frozen=True, slots=True)
class Rule:
    """How one HF tensor maps onto a vLLM parameter."""

    param: str
    spec: TensorSpec
    dim: int | None
    """Split dimension; None when every rank holds the whole tensor."""
    chunk: int = 0
    """HF extent per rank along ``dim``."""
    offset: int = 0
    """Where a rank's chunk starts in the parameter along ``dim`` (its place in a fused tensor)."""


@dataclass(frozen=True, slots=True)
class Piece:
    """Positions of one rank's parameter: ``local`` flat positions, ``select`` into the input."""

    rank: int
    param: str
    local: np.ndarray
    select: np.ndarray


@dataclass(frozen=True, slots=True)
class Slab:
    """A slab copied between an HF tensor and a rank's parameter (``length`` along ``dim``)."""

    rank: int
    param: str
    dim: int
    hf_start: int
    param_start: int
    length: int


def pad_vocab(vocab: int, pad_to: int = VOCAB_PADDING) -> int:
    """vLLM's ``pad_vocab_size``: round up to a multiple of ``pad_to``."""
    return -(-vocab // pad_to) * pad_to


class VllmLayout:
    """HF tensors (``specs``) laid out as vLLM holds them on ``tp_size`` ranks."""

    def __init__(
        self, specs: Iterable[TensorSpec], geometry: Geometry, tp_size: int = 1, *, vocab_padding: int = VOCAB_PADDING
    ) -> None:
        if tp_size < 1 or vocab_padding < 1:
            raise LayoutError(f"tp_size and vocab_padding must be >= 1, got {tp_size} and {vocab_padding}")
        g = geometry
        if g.num_heads % tp_size or g.num_kv_heads % tp_size:
            raise LayoutError(
                f"tensor parallelism over {tp_size} ranks needs num_attention_heads ({g.num_heads}) and "
                f"num_key_value_heads ({g.num_kv_heads}) divisible by {tp_size}; vLLM replicates KV heads "
                "when num_key_value_heads < tp_size, and that layout is not supported here"
            )
        self.geometry = geometry
        self.tp_size = tp_size
        self.vocab_padding = vocab_padding
        self.specs = tuple(specs)
        self.rules: dict[str, Rule] = {}
        self.params: dict[str, tuple[tuple[int, ...], str]] = {}
        """vLLM parameter name -> (shape on every rank, dtype)."""
        groups: dict[tuple[str, str], dict[str, TensorSpec]] = {}
        if len({s.name for s in self.specs}) != len(self.specs):
            raise LayoutError("a tensor name is listed twice")
        for s in self.specs:
            m = _QKV.match(s.name) or _GATE_UP.match(s.name)
            if m is not None:
                fused = "qkv_proj" if m["part"] in "qkv" else "gate_up_proj"
                groups.setdefault((f"{m['pre']}.{fused}.{m['kind']}", fused), {})[m["part"]] = s
            else:
                self._single(s)
        for (param, fused), parts in groups.items():
            self._fused(param, fused, parts)

    # ------------------------------------------------------------ building

    def _add(self, rule: Rule, shape: tuple[int, ...]) -> None:
        have = self.params.get(rule.param)
        if have is not None and have != (shape, rule.spec.dtype):
            raise LayoutError(f"{rule.spec.name!r} maps onto {rule.param!r}, which another tensor already fills")
        if have is not None and not (self.geometry.tied and rule.param.endswith("embed_tokens.weight")):
            raise LayoutError(f"{rule.spec.name!r} and another tensor both map onto {rule.param!r}")
        self.params[rule.param] = (shape, rule.spec.dtype)
        self.rules[rule.spec.name] = rule

    def _single(self, s: TensorSpec) -> None:
        tp = self.tp_size
        vocab, row = _VOCAB.search(s.name), _ROW.search(s.name)
        if vocab is not None:
            if len(s.shape) != 2:
                raise LayoutError(f"{s.name!r}: a vocabulary tensor is 2-D, got shape {list(s.shape)}")
            padded = pad_vocab(s.shape[0], self.vocab_padding)
            if padded % tp:
                raise LayoutError(f"{s.name!r}: the padded vocabulary ({padded}) does not split over {tp} ranks")
            param = s.name
            if self.geometry.tied and vocab["which"] == "lm_head":
                param = s.name[: vocab.start("which")] + "model.embed_tokens.weight"
            self._add(Rule(param, s, 0, padded // tp), (padded // tp, s.shape[1]))
        elif row is not None and row["kind"] in ("weight", "weight_scale_inv"):
            if len(s.shape) != 2 or s.shape[1] % tp:
                raise LayoutError(f"{s.name!r}: a row-parallel weight is 2-D with columns divisible by {tp}")
            self._add(Rule(s.name, s, 1, s.shape[1] // tp), (s.shape[0], s.shape[1] // tp))
        elif row is not None or _NORM.search(s.name) or tp == 1:
            self._add(Rule(s.name, s, None), s.shape)  # row-parallel biases and norms: on every rank
        else:
            raise LayoutError(f"{s.name!r}: no known tensor-parallel placement in vLLM for this tensor")

    def _fused(self, param: str, fused: str, parts: dict[str, TensorSpec]) -> None:
        order = "qkv" if fused == "qkv_proj" else ("gate", "up")
        if set(parts) != set(order):
            raise LayoutError(f"{param!r} fuses {list(order)}, but only {sorted(parts)} are present")
        g, tp = self.geometry, self.tp_size
        rows = {"q": g.num_heads * g.head_dim, "k": g.num_kv_heads * g.head_dim, "v": g.num_kv_heads * g.head_dim}
        first = parts[order[0]]
        if param.endswith(".weight_scale_inv"):  # block scales: one row a block of rows
            sizes = {p: rows.get(p, first.shape[0] * BLOCK) for p in order}
            if any(n % (BLOCK * tp) for n in sizes.values()):
                raise LayoutError(
                    f"{param!r} fuses block-FP8 weights whose rows ({sorted(sizes.values())}) are not whole "
                    f"{BLOCK}-row blocks on each of {tp} ranks: vLLM's block-FP8 layers need them to be"
                )
            rows = {p: n // BLOCK for p, n in sizes.items()}
        offset = 0
        for part in order:
            s = parts[part]
            want = rows.get(part, first.shape[0])
            if s.shape[:1] != (want,) or s.shape[1:] != first.shape[1:] or s.dtype != first.dtype:
                raise LayoutError(
                    f"{s.name!r}: shape {list(s.shape)} {s.dtype} does not fit {param!r} "
                    f"(expected {want} rows like {first.name!r}, {first.dtype})"
                )
            if want % tp:
                raise LayoutError(f"{s.name!r}: {want} rows do not split over {tp} ranks")
            self.rules[s.name] = Rule(param, s, 0, want // tp, offset)
            offset += want // tp
        self._add(self.rules[first.name], (offset, *first.shape[1:]))

    # ------------------------------------------------------------ translation

    def rule(self, name: str) -> Rule:
        rule = self.rules.get(name)
        if rule is None:
            raise LayoutError(f"tensor {name!r} is not in this model's layout")
        return rule

    def pieces(self, name: str, index: np.ndarray, *, write: bool) -> list[Piece]:
        """Per rank and parameter, the local flat positions of HF ``name`` at flat ``index``.

        Replicated tensors give one piece per rank when writing and rank 0's when reading."""
        rule = self.rule(name)
        idx = np.asarray(index)
        numel = rule.spec.numel
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            raise LayoutError(f"positions into {name!r} must be a 1-D integer array, got {idx.dtype} {idx.shape}")
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= numel):
            raise LayoutError(f"positions into {name!r} run outside its {numel} elements")
        idx = idx.astype(np.int64, copy=False)
        if idx.size == 0:
            return []
        if rule.dim is None:
            everywhere = np.arange(idx.size, dtype=np.int64)
            return [Piece(r, rule.param, idx, everywhere) for r in range(self.tp_size if write else 1)]
        shape = rule.spec.shape
        if rule.dim == 0:
            inner = math.prod(shape[1:])
            rank = idx // (rule.chunk * inner)
            local = idx - (rank * rule.chunk - rule.offset) * inner
        else:
            row, col = np.divmod(idx, shape[1])
            rank = col // rule.chunk
            local = row * rule.chunk + (col - rank * rule.chunk)
        if self.tp_size == 1:
            return [Piece(0, rule.param, local, np.arange(idx.size, dtype=np.int64))]
        order = np.argsort(rank, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(np.bincount(rank, minlength=self.tp_size))])
        out = []
        for r in range(self.tp_size):
            sel = order[bounds[r] : bounds[r + 1]]
            if sel.size:
                out.append(Piece(r, rule.param, local[sel], sel))
        return out

    def regions(self, name: str, *, write: bool) -> list[Slab]:
        """The slabs of HF ``name`` on each rank (replicated: every rank to write, rank 0 to read)."""
        rule = self.rule(name)
        shape = rule.spec.shape
        if rule.dim is None:
            dim, length = (0, shape[0]) if shape else (0, 1)
            return [Slab(r, rule.param, dim, 0, 0, length) for r in range(self.tp_size if write else 1)]
        out = []
        for r in range(self.tp_size):
            start = r * rule.chunk
            length = min(rule.chunk, shape[rule.dim] - start)
            if length > 0:
                out.append(Slab(r, rule.param, rule.dim, start, rule.offset, length))
        return out

    def padding(self) -> list[Slab]:
        """Rows of padded vocabulary parameters that hold no token (vLLM zeroes them)."""
        out: list[Slab] = []
        for rule in self.rules.values():
            if _VOCAB.search(rule.spec.name) is None:
                continue
            for r in range(self.tp_size):
                valid = max(0, min(rule.chunk, rule.spec.shape[0] - r * rule.chunk))
                if valid < rule.chunk and not any(p.rank == r and p.param == rule.param for p in out):
                    out.append(Slab(r, rule.param, 0, -1, valid, rule.chunk - valid))
        return out


def narrow(array: np.ndarray, dim: int, start: int, length: int) -> np.ndarray:
    """``array[..., start:start+length, ...]`` along ``dim`` (a view)."""
    index: list[slice] = [slice(None)] * array.ndim
    if array.ndim:
        index[dim] = slice(start, start + length)
    return array[tuple(index)]
