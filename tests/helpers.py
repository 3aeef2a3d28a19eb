"""Small builders shared by the tests: state dicts, a training-like stepper, bit-exact comparison."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from aurora_store.testing.processes import deadline


def state_dict(seed: int = 0, scale: int = 1) -> dict[str, torch.Tensor]:
    """A small model-shaped state dict with every kind of tensor the store meets."""
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": (torch.randn(64 * scale, 32, generator=g) * 0.02).to(torch.bfloat16),
        "model.layers.0.mlp.up_proj.weight": (torch.randn(48, 32, generator=g) * 0.02).to(torch.bfloat16),
        "model.layers.0.input_layernorm.weight": torch.ones(32, dtype=torch.bfloat16),
        "model.layers.0.self_attn.q_norm.weight": torch.ones(8, dtype=torch.float16),
        "model.norm.weight": torch.ones(32),
        "head.bias": torch.randn(16, generator=g),
        "buffers.position_ids": torch.arange(20),
        "buffers.mask": torch.rand(5, 4, generator=g) > 0.5,
        "scalar.temperature": torch.tensor(0.7, dtype=torch.bfloat16),
        "empty.thing": torch.empty(0, 3, dtype=torch.bfloat16),
    }


def step(sd: dict[str, torch.Tensor], seed: int, lr: float = 3e-5) -> dict[str, torch.Tensor]:
    """A training-like step: float tensors move by small random amounts, rounded to their dtype."""
    g = torch.Generator().manual_seed(10_000 + seed)
    out = {}
    for k, v in sd.items():
        if v.is_floating_point() and v.numel():
            noise = torch.randn(v.shape, generator=g) * lr
            out[k] = (v.float() + noise).to(v.dtype)
        else:
            out[k] = v.clone()
    return out


def bits_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Bit-for-bit equality of two state dicts (NaN payloads and signed zeros included)."""
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        if x.dtype == torch.bool:
            x, y = x.view(torch.uint8), y.view(torch.uint8)
        elif x.is_floating_point():
            iv = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
            x, y = x.contiguous().view(iv), y.contiguous().view(iv)
        if not torch.equal(x, y):
            return False
    return True


def readme_commands(section: str) -> list[list[str]]:
    """The ``aurora`` commands of the README's ``## section``'s bash blocks, as argv lists
    (line continuations joined, comments dropped): the tests run what the README shows."""
    import re
    import shlex
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    start = text.index(f"## {section}\n")
    end = text.find("\n## ", start + 1)
    body = text[start : end if end != -1 else len(text)]
    out = []
    for block in re.findall(r"^```bash\n(.*?)^```", body, re.MULTILINE | re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv and argv[0] == "aurora":
                out.append(argv)
    return out


def decoded_change(old: Any, got: Any, count: int) -> Any:
    """What a block decoded from hostile bytes (``got``) did to ``old``: checked to be ``count`` real
    changes at exactly the positions it names; the new words, for the caller to code again."""
    import numpy as np

    from aurora_store.codec import sparse

    assert got.delta is not None and len(got.positions) == len(got.delta) == count
    new = old.copy()
    sparse.apply(new, 0, got.positions, got.delta)
    assert np.array_equal(got.positions, np.flatnonzero(old != new))
    return new


REPO = Path(__file__).resolve().parents[1]


def aurora(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``python -m aurora_store.cli ARGS`` as a separate process (``env``: added to the environment;
    ``timeout`` scaled by AURORA_TEST_PATIENCE)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "aurora_store.cli", *args], capture_output=True, text=True, cwd=REPO, env=env,
        timeout=deadline(timeout),
    )  # fmt: skip
