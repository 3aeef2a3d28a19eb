"""Extraction and class lookup on the weights' own device, with torch ops.

A GPU publisher compares the BF16 bits it publishes with the bits it last published where both
live; only the changed positions and their words (about 1% of the model) cross to the host for
coding. A GPU actor turns a classed block's (class, rank) pairs into positions against its live
weights the same way (:class:`TensorWords`; its staged words are then scattered in place at the
safe point: ``actor.live.TensorWeights``). Every function here
gives exactly the arrays the host passes in :mod:`aurora_store.codec.classes` give (the tests
check it on CPU tensors).

Ranks on the device come from one stable sort of each range's classes (one-byte keys: a single
radix pass on CUDA). That costs many bare passes (``aurora bench codec --device`` measures how
many, on the device it runs on), where the host kernels cost about one: a fused device kernel
(per-block class histograms and a scan) would bring it to one, and is not built.
"""

from __future__ import annotations

import numpy as np
import torch

from aurora_store.codec import words as host
from aurora_store.codec.base import Exponent, Lookup, Overlay
from aurora_store.codec.classes import Extracted
from aurora_store.errors import CorruptError, StoreError
from aurora_store.tensors import word_tensor, word_view

CHUNK = 1 << 26
"""Elements sorted at once: the sort's index tensor is 8 bytes an element (512 MiB a chunk)."""


def _classes(w: torch.Tensor, exponent: Exponent) -> torch.Tensor:
    """Each word's exponent field (an arithmetic shift of a signed word, then masked), as uint8: a
    one-byte sort key. Index with it only after ``.long()`` (a uint8 index is a mask in torch)."""
    if exponent.bits > 8:
        raise StoreError(f"an exponent of {exponent.bits} bits has no one-byte class")
    return ((w >> exponent.shift) & ((1 << exponent.bits) - 1)).to(torch.uint8)


def _host(t: torch.Tensor, dtype: np.dtype | type) -> np.ndarray:
    return t.cpu().numpy().view(dtype) if t.dtype != torch.int64 else t.cpu().numpy()


def sizes(old: torch.Tensor, exponent: Exponent) -> np.ndarray:
    """Elements of each class among a flat word tensor (on the host: one entry per class)."""
    return torch.bincount(_classes(old, exponent), minlength=1 << exponent.bits).cpu().numpy().astype(np.int64)


def write(target: torch.Tensor, positions: np.ndarray, new: np.ndarray) -> None:
    """Words ``new`` (host) into a flat word tensor at ``positions``, on its device, in place."""
    target[torch.from_numpy(positions).to(target.device)] = word_tensor(new).to(target.device).view(target.dtype)


def changed(old: torch.Tensor, new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Positions (int64, ascending) where two flat word tensors differ, and the words there, on their device."""
    pos = torch.nonzero(old != new).reshape(-1)
    return pos, old[pos], new[pos]


def extract(old: torch.Tensor, new: torch.Tensor, exponent: Exponent, *, chunk: int = CHUNK) -> Extracted:
    """:func:`aurora_store.codec.classes.extract` of two flat word tensors
    (:func:`aurora_store.tensors.word_views`) on any device: the comparison, the class ranks and
    the gathers run there; only the changes come to the host."""
    if old.shape != new.shape or old.dtype != new.dtype or old.device != new.device:
        raise StoreError("old and new must be flat word tensors of one shape, dtype and device")
    n_cls = 1 << exponent.bits
    before = torch.zeros(n_cls, dtype=torch.int64, device=old.device)
    parts: list[tuple[torch.Tensor, ...]] = []
    for lo in range(0, old.numel(), chunk):
        o, n = old[lo : lo + chunk], new[lo : lo + chunk]
        cls = _classes(o, exponent)
        sizes = torch.bincount(cls, minlength=n_cls)
        order = torch.argsort(cls, stable=True)  # class-major; a class's elements stay in position order
        hit = torch.nonzero((o != n)[order]).reshape(-1)  # changed elements, by their index in that order
        if hit.numel():
            pos = order[hit]
            c = cls[pos].long()
            first = torch.cumsum(sizes, 0) - sizes  # where each class starts in the sorted order
            rank = hit - first[c] + before[c]
            back = torch.argsort(pos)  # to position order, as the host pass gives them
            parts.append((pos[back] + lo, c[back], rank[back], o[pos[back]], n[pos[back]]))
        before += sizes
    width = old.element_size()
    word = np.dtype(f"<u{width}")
    if not parts:
        empty = np.empty(0, np.int64)
        return Extracted(empty, empty, empty, np.empty(0, word), np.empty(0, word))
    cat = [torch.cat([p[i] for p in parts]) for i in range(5)]
    return Extracted(
        _host(cat[0], np.int64),
        _host(cat[1], np.int64),
        _host(cat[2], np.int64),
        _host(cat[3], word),
        _host(cat[4], word),
    )


def locate(old: torch.Tensor, lookup: Lookup, *, chunk: int = CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """:func:`aurora_store.codec.classes.locate` against a flat word tensor on its device: only the
    ranks go there and only the positions come back."""
    exponent, what = lookup.exponent, lookup.what
    n_cls = 1 << exponent.bits
    dev = old.device
    cls_of = torch.from_numpy(np.repeat(lookup.present, lookup.counts)).to(dev)
    want = torch.from_numpy(lookup.ranks).to(dev)
    src_all = torch.arange(want.numel(), device=dev)
    before = torch.zeros(n_cls, dtype=torch.int64, device=dev)
    found_pos, found_src = [], []
    for lo in range(0, old.numel(), chunk):
        cls = _classes(old[lo : lo + chunk], exponent)
        sizes = torch.bincount(cls, minlength=n_cls)
        local = want - before[cls_of]
        mine = (local >= 0) & (local < sizes[cls_of])
        if bool(mine.any()):
            order = torch.argsort(cls, stable=True)
            first = torch.cumsum(sizes, 0) - sizes
            found_pos.append(order[first[cls_of[mine]] + local[mine]] + lo)
            found_src.append(src_all[mine])
        before += sizes
    pos = torch.cat(found_pos) if found_pos else torch.empty(0, dtype=torch.int64, device=dev)
    if pos.numel() != want.numel():
        raise CorruptError(f"{what}: {want.numel() - pos.numel()} positions rank past the end of their exponent class")
    if pos.numel() == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    src = torch.cat(found_src)
    back = torch.argsort(pos)
    return pos[back].cpu().numpy(), src[back].cpu().numpy()


class TensorWords:
    """Words at a version held as torch tensors by HF name, on any device: the device implementation of
    :class:`~aurora_store.codec.base.Words`. Only the positions asked for (or a lookup's ranks and
    positions) cross to the host."""

    def __init__(self, tensors: dict[str, torch.Tensor] | None = None, *, lookup_on_device: bool | None = None) -> None:
        self.tensors: dict[str, torch.Tensor] = tensors if tensors is not None else {}
        self.lookup_on_device = lookup_on_device
        """Classed lookups with torch ops where the tensors live: None (the default) on an
        accelerator only; True also on CPU tensors (tests); False never (the host pass)."""

    def flat(self, name: str) -> torch.Tensor:
        """Tensor ``name`` as a flat word tensor (:func:`aurora_store.tensors.word_view`), sharing its memory."""
        return word_view(self.tensors[name].view(-1))

    def at(self, name: str, index: np.ndarray) -> np.ndarray:
        flat = self.flat(name)
        if flat.device.type == "cpu":  # numpy's gather: a third of torch's indexing cost here
            got = flat.numpy()[index]
        else:
            got = flat[torch.from_numpy(index).to(flat.device)].cpu().numpy()
        return got.view(f"<u{got.dtype.itemsize}")

    def locate(self, name: str, lo: int, hi: int, lookup: Lookup, over: Overlay | None = None) -> Overlay:
        """On an accelerator the lookup runs there: only ranks go and positions come back. Host
        tensors take the host pass (the compiled one is the faster)."""
        words = self.flat(name)[lo:hi]
        if not (words.device.type != "cpu" if self.lookup_on_device is None else self.lookup_on_device):
            got = words.cpu().numpy()
            return host.locate(got.view(f"<u{got.dtype.itemsize}"), lookup, over)
        if over is not None and over[0].size:  # the overlaid words' classes: a device copy of the range
            words = words.clone()
            write(words, over[0], over[1])
        return locate(words, lookup)
