"""The weights digest: the compiled mixer gives the numpy mixer's bits, every way of adding elements
agrees, and a process without the compiled mixer computes the same manifests' digests."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aurora_store.format import digest
from aurora_store.format.digest import Digest, tensor_keys

WIDTHS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _words(seed: int, n: int, width: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2 ** (8 * width), n, dtype=WIDTHS[width], endpoint=False)


def _numpy_sums(keys: tuple[int, ...], index: np.ndarray, words: np.ndarray) -> list[int]:
    return digest._lane_sums(keys, index.astype(np.uint64), words)


@pytest.fixture(scope="module")
def compiled() -> None:
    pytest.importorskip("numba", reason="the compiled mixer needs numba (the trainer and actor extras install it)")
    if digest._kernel() is None:
        pytest.fail("numba is installed but the digest's mixer did not compile")


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(0, 3000),
    width=st.sampled_from(sorted(WIDTHS)),
    start=st.integers(0, 2**40),
    name=st.text(min_size=1, max_size=20),
)
def test_compiled_mixer_equals_numpy_over_ranges_and_indices(
    compiled: None, seed: int, n: int, width: int, start: int, name: str
) -> None:
    keys = tensor_keys(name, "X", (n,))
    words = _words(seed, n, width)
    index = np.arange(start, start + n, dtype=np.uint64)
    expected = _numpy_sums(keys, index, words)
    assert digest._sums(keys, None, start, words) == expected
    shuffled = np.random.default_rng(seed).permutation(index)
    assert digest._sums(keys, shuffled, 0, words) == _numpy_sums(keys, shuffled, words)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 5000), cut=st.floats(0, 1), width=st.sampled_from([2, 4]))
def test_whole_tensor_equals_its_ranges_and_its_elements(seed: int, n: int, cut: float, width: int) -> None:
    keys = tensor_keys("w", "BF16" if width == 2 else "F32", (n,))
    words = _words(seed, n, width)
    whole = Digest()
    whole.add_tensor(keys, words)
    split = int(cut * n)
    halves = Digest()
    halves.add_range(keys, 0, words[:split])
    halves.add_range(keys, split, words[split:])
    one_by_one = Digest()
    one_by_one.add_elements(keys, np.arange(n, dtype=np.uint64), words)
    assert whole == halves == one_by_one


def test_update_moves_the_digest_to_the_new_words() -> None:
    keys = tensor_keys("w", "BF16", (4096,))
    old = _words(1, 4096, 2)
    new = old.copy()
    changed = np.array([0, 17, 4095], dtype=np.uint64)
    new[changed] ^= 0x5A5A
    moved = Digest()
    moved.add_tensor(keys, old)
    moved.update(keys, changed, old[changed], new[changed])
    fresh = Digest()
    fresh.add_tensor(keys, new)
    assert moved == fresh
    assert moved != Digest(), "a digest of something is not the empty digest"


@pytest.mark.slow
def test_large_tensors_split_over_threads_give_the_same_digest() -> None:
    n = 64 * digest._CHUNK * 3 + 123  # several spans on the pool
    keys = tensor_keys("embed", "BF16", (n,))
    words = _words(7, n, 2)
    pooled = Digest()
    pooled.add_tensor(keys, words)
    serial = Digest(digest._lane_sums(keys, np.arange(n, dtype=np.uint64), words))
    assert pooled == serial


@pytest.mark.slow
def test_a_process_without_the_compiled_mixer_agrees() -> None:
    code = (
        "import numpy as np\n"
        "from aurora_store.format import digest\n"
        "d = digest.Digest()\n"
        "w = np.random.default_rng(3).integers(0, 2**16, 300_000, dtype=np.uint16)\n"
        "d.add_tensor(digest.tensor_keys('w', 'BF16', (300_000,)), w, start=5)\n"
        "print(digest._kernel() is not None, d.hex())\n"
    )
    out = {}
    for mode, env in (("numpy", {"AURORA_DIGEST_NUMPY": "1"}), ("default", {})):
        proc = subprocess.run(
            [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, check=True
        )
        out[mode] = proc.stdout.split()
    assert out["numpy"][0] == "False"
    assert out["numpy"][1] == out["default"][1]
