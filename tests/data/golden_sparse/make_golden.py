"""How tests/data/golden_sparse/run was made (kept for the record: the tests never run this).

Written once by the code of the commit that added it (format aurora/2, every delta block coded
by the ``sparse`` codec, large enough that its symbol streams are split by exponent), before the
``classed`` codec and format aurora/3 existed. Every later version of the code must list, audit
and materialize it bit-exact (tests/test_golden.py). Never rerun it over the committed run.

    python tests/data/golden_sparse/make_golden.py OUT_DIR
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import torch
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

SEED = bytes(range(32, 64))
"""The signing key's 32 raw bytes: not a secret, the run is a test vector."""
STEPS = 4


def main(out: str) -> None:
    from aurora_store import open_run

    key = Ed25519PrivateKey.from_private_bytes(SEED)
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    os.makedirs(out, exist_ok=False)
    with open(os.path.join(out, "key.pub"), "wb") as f:
        f.write(pub)
    run = open_run(f"file://{os.path.abspath(out)}/run", signing_key=key, full_every=8, segment_bytes=4096)
    run.files.put("config.json", json.dumps({"model_type": "golden_sparse", "hidden_size": 512}).encode())
    g = torch.Generator().manual_seed(99)
    masters = {
        "model.embed_tokens.weight": torch.randn(48, 512, generator=g) * 0.02,
        "model.layers.0.mlp.down_proj.weight": torch.randn(512, 24, generator=g) * 0.05,
        "model.norm.weight": torch.ones(512),
    }
    expected = {}
    for step in range(STEPS):
        if step:  # an Adam-like step: every master moves by about 4e-5, so a few percent of BF16 words change
            for name, t in masters.items():
                t += torch.randn(t.shape, generator=g).sign() * (4e-6 if "norm" not in name else 2e-3)
        sd = {k: v.to(torch.bfloat16) for k, v in masters.items()}
        info = run.publish(sd, step=step, meta={"note": f"golden_sparse step {step}"})
        expected[str(info.version)] = {
            "kind": info.kind,
            "version_hash": info.version_hash,
            "weights_digest": info.weights_digest,
            "tensor_sha256": {
                name: hashlib.sha256(t.contiguous().view(torch.int16).numpy().tobytes()).hexdigest()
                for name, t in sorted(sd.items())
            },
        }
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
