"""How tests/data/golden/run was made (kept for the record: the tests never run this).

The run was written once, by the code of commit b8f1510 (before the store was split into
layers; this script has since followed the API's renames), and is committed as it came out:
every later version of the code must list, audit and materialize it bit-exact
(tests/test_golden.py). Rerunning this script writes a new run
with whatever code is current, which is *not* a golden run; do that only for a deliberate
format change, next to the old run, never over it.

    python tests/data/golden/make_golden.py OUT_DIR
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import torch
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

SEED = bytes(range(32))
"""The signing key's 32 raw bytes: not a secret, the run is a test vector."""


def tensors(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    emb = (torch.randn(64, 16, generator=g) * 0.02).to(torch.bfloat16)
    up = (torch.randn(32, 16, generator=g) * 0.02).to(torch.bfloat16)
    head = torch.randn(6, generator=g)
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), 1e-40, 3.0], dtype=torch.bfloat16)
    payloads = [0x7FC1, 0xFFC3, 0x7F81 + (step >= 4)]  # NaN payloads, one of them changes at step 4
    nan = torch.tensor([p - (1 << 16) * (p >= 1 << 15) for p in payloads], dtype=torch.int16).view(torch.bfloat16)
    norm = torch.ones(8, dtype=torch.float16)
    if step:  # a few elements of each tensor move, as in an RL step (the chain stays deltas)
        gs = torch.Generator().manual_seed(step)
        for t, k, scale in ((emb, 10, 2e-3), (up, 6, 2e-3), (head, 2, 1e-3)):
            flat = t.view(-1)
            idx = torch.randperm(flat.numel(), generator=gs)[:k]
            flat[idx] = (flat[idx].float() + torch.randn(k, generator=gs) * scale).to(t.dtype)
        norm[step % 8] += 0.001 * step
        if step % 2:
            special = special.flip(0)
    return {
        "model.embed_tokens.weight": emb,
        "model.layers.0.mlp.up_proj.weight": up,
        "model.norm.weight": norm,
        "head.bias": head,
        "special.values": special,
        "special.nan_payloads": nan,
        "buffers.position_ids": torch.arange(10) + step,
        "buffers.mask": torch.arange(6) % (2 + step % 2) == 0,
        "empty.thing": torch.empty(0, 3, dtype=torch.bfloat16),
    }


def main(out: str) -> None:
    from aurora_store import open_run

    key = Ed25519PrivateKey.from_private_bytes(SEED)
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    os.makedirs(out, exist_ok=False)
    with open(os.path.join(out, "key.pub"), "wb") as f:
        f.write(pub)
    run = open_run(f"file://{os.path.abspath(out)}/run", signing_key=key, full_every=3, segment_bytes=256)
    run.files.put("config.json", json.dumps({"model_type": "golden", "hidden_size": 8}).encode())
    run.files.put("tokenizer.json", b'{"type": "golden"}')
    expected = {}
    for step in range(6):
        sd = tensors(step)
        info = run.publish(sd, step=step, meta={"note": f"golden step {step}"})
        words = {}
        for name, t in sorted(sd.items()):
            flat = t.contiguous().reshape(-1)
            raw = (
                flat.view(torch.uint8)
                if t.dtype == torch.bool
                else flat.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[flat.element_size()])
            )
            words[name] = hashlib.sha256(raw.numpy().tobytes()).hexdigest()
        expected[str(info.version)] = {
            "kind": info.kind,
            "version_hash": info.version_hash,
            "weights_digest": info.weights_digest,
            "tensor_sha256": words,
        }
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
