"""Hypothesis: publish/materialize is bit-exact for any dtypes, shapes and change patterns;
parsers survive arbitrary mutations of valid input with errors of the store's family."""

from __future__ import annotations

import uuid

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aurora_store
from aurora_store.errors import StoreError
from aurora_store.format import safetensors_file
from aurora_store.format.keys import manifest_key
from aurora_store.format.manifest_parser import parse_manifest
from tests.helpers import bits_equal

DTYPES = [
    torch.bfloat16,
    torch.float16,
    torch.float32,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.uint8,
    torch.bool,
    torch.int8,
    torch.float8_e4m3fn,  # 1-byte words coded sparse since aurora/6 (quantized versions), with INT8
    torch.float8_e5m2,
]
_INT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_INT_VIEW = {torch.float8_e4m3fn: torch.uint8, torch.float8_e5m2: torch.uint8}


def random_tensor(draw: st.DrawFn, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    width = torch.empty(0, dtype=dtype).element_size()
    n = int(np.prod(shape)) if shape else 1
    seed = draw(st.integers(0, 2**32 - 1))
    raw = np.random.default_rng(seed).integers(0, 2 ** (8 * width), n, dtype=_INT[width], endpoint=False)
    if dtype == torch.bool:
        raw = raw & 1
    signed = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[width]
    t = torch.from_numpy(raw.view(f"<i{width}") if width > 1 else raw).view(signed)
    return t.view(dtype).reshape(shape).clone()


@st.composite
def histories(draw: st.DrawFn) -> list[dict[str, torch.Tensor]]:
    n_tensors = draw(st.integers(1, 4))
    specs = []
    for i in range(n_tensors):
        shape = tuple(draw(st.lists(st.integers(0, 7), min_size=0, max_size=3)))
        specs.append((f"t{i}.{draw(st.sampled_from(['weight', 'bias']))}", draw(st.sampled_from(DTYPES)), shape))
    sd = {name: random_tensor(draw, dt, shape) for name, dt, shape in specs}
    out = [sd]
    for _ in range(draw(st.integers(1, 4))):
        nxt = {}
        for name, t in out[-1].items():
            pattern = draw(st.sampled_from(["none", "all", "first", "last", "some"]))
            new = t.clone()
            bits = _INT_VIEW.get(t.dtype)  # torch has no indexed writes of float8: move their bits as integers
            flat = new.view(-1) if bits is None else new.view(bits).view(-1)
            if flat.numel() and pattern != "none":
                fresh = random_tensor(draw, t.dtype, tuple(t.shape)).view(-1)
                fresh = fresh if bits is None else fresh.view(bits)
                if pattern == "all":
                    flat.copy_(fresh)
                elif pattern == "first":
                    flat[0] = fresh[0]
                elif pattern == "last":
                    flat[-1] = fresh[-1]
                else:
                    mask = torch.from_numpy(np.random.default_rng(draw(st.integers(0, 99))).random(flat.numel()) < 0.3)
                    flat[mask] = fresh[mask]
            nxt[name] = new
        out.append(nxt)
    return out


@given(histories(), st.integers(1, 3), st.sampled_from([64, 4096]))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_any_history_round_trips(history: list[dict[str, torch.Tensor]], full_every: int, seg: int) -> None:
    uri = f"memory://aurora-props/{uuid.uuid4().hex}"
    run = aurora_store.open_run(uri, full_every=full_every, segment_bytes=seg)
    for sd in history:
        run.publish(sd)
    fresh = aurora_store.open_run(uri)
    for v, sd in enumerate(history):
        assert bits_equal(fresh.materialize(v), sd), v


def _valid_manifests() -> list[bytes]:
    uri = f"memory://aurora-props/{uuid.uuid4().hex}"
    run = aurora_store.open_run(uri, segment_bytes=64)
    g = torch.Generator().manual_seed(1)
    sd = {"a": torch.randn(40, generator=g).bfloat16(), "b": torch.arange(6)}
    run.publish(sd)
    sd2 = {"a": sd["a"].clone(), "b": sd["b"] + 1}
    sd2["a"][::3] = 0.5
    run.publish(sd2)
    return [run.store.get(manifest_key(v), max_bytes=1 << 20) for v in (0, 1)]


VALID = _valid_manifests()


@given(st.sampled_from([0, 1]), st.data())
@settings(max_examples=400, deadline=None)
def test_manifest_parser_survives_mutations(v: int, data: st.DataObject) -> None:
    raw = bytearray(VALID[v])
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert", "digit"]))
        i = data.draw(st.integers(0, len(raw) - 1))
        if op == "flip":
            raw[i] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "cut":
            del raw[i : i + data.draw(st.integers(1, 20))]
        elif op == "insert":
            raw[i:i] = data.draw(st.binary(min_size=1, max_size=8))
        else:
            digits = [j for j, c in enumerate(raw) if chr(c).isdigit()]
            raw[data.draw(st.sampled_from(digits))] = ord(str(data.draw(st.integers(0, 9))))
        if not raw:
            break
    try:
        m = parse_manifest(bytes(raw), expect_version=v)
    except StoreError:
        return
    # anything that parses must be self-consistent: its hash is its contents' hash
    assert m.compute_hash() == m.version_hash


@given(st.binary(max_size=300))
@settings(max_examples=300)
def test_safetensors_parser_survives_garbage(blob: bytes) -> None:
    _parses_or_refuses(blob)


@given(st.integers(0, 2**20), st.binary(max_size=200))
def test_safetensors_parser_header_lengths(n: int, rest: bytes) -> None:
    _parses_or_refuses(n.to_bytes(8, "little") + rest)


def _parses_or_refuses(blob: bytes) -> None:
    """A safetensors file parses into entries that tile its data area, or is refused by the store's
    family; what parses is written back by ``build`` into a file that parses to the same tensors."""
    try:
        entries, base = safetensors_file.parse(blob, "fuzz")
    except StoreError:
        return
    assert 8 <= base <= 8 + safetensors_file.MAX_HEADER and base <= len(blob)
    ordered = sorted(entries.values(), key=lambda e: (e.start, e.stop))
    assert sum(e.stop - e.start for e in ordered) == len(blob) - base, "the tensors cover the data area"
    tensors = [(e.name, e.dtype, e.shape, safetensors_file.words(blob, base, e)) for e in ordered]
    rebuilt = bytes(safetensors_file.build(tensors))
    again, base2 = safetensors_file.parse(rebuilt, "rebuilt")
    assert [(e.name, e.dtype, e.shape) for e in again.values()] == [(n, d, s) for n, d, s, _ in tensors]
    for (*_, words), e in zip(tensors, again.values(), strict=True):
        assert np.array_equal(safetensors_file.words(rebuilt, base2, e), words)
