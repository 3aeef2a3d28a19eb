"""How tests/data/golden_lora/run was made (kept for the record: the tests never run this).

Written once by the code of the commit that added it: a signed LoRA run (issue 36; its run spec
``aurora-run/3`` with ``artefact.kind`` ``lora``), whose frozen base travels as the attachment
``lora-base-00001-of-00001.safetensors`` named by its weight digest, and whose versions hold a rank-4
PEFT adapter over q_proj and v_proj: full, delta, delta, full, delta. Every later version of the code
must list, audit and materialize it bit-exact, verify its base against the digest the run spec names,
and replay it as the same PEFT adapter directory (tests/test_golden.py). Never rerun it over the
committed run.

    python tests/data/golden_lora/make_golden.py OUT_DIR
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import torch
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

SEED = bytes(range(64, 96))
"""The signing key's 32 raw bytes: not a secret, the run is a test vector."""
KINDS = ("full", "delta", "delta", "full", "delta")


def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().view(torch.int16).numpy().tobytes()).hexdigest()


def main(out: str) -> None:
    from aurora_store import open_run
    from aurora_store.rl.adapters import adapter_state
    from aurora_store.rl.models import build_model, model_files, tiny_config
    from aurora_store.rl.runspec import NAME, Artefact, RunSpec
    from aurora_store.rl.sampling import SamplingConfig
    from aurora_store.rl.tokenizers import CharTokenizer
    from trainer.adapter import LoraSettings, attach, round_base, wrap
    from trainer.publication import ModelPublisher, artefact_for

    key = Ed25519PrivateKey.from_private_bytes(SEED)
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    os.makedirs(out, exist_ok=False)
    with open(os.path.join(out, "key.pub"), "wb") as f:
        f.write(pub)
    run = open_run(f"file://{os.path.abspath(out)}/run", signing_key=key)
    chars = CharTokenizer()
    model = build_model(tiny_config(chars.vocab_size, hidden=32, layers=1, heads=2, kv_heads=1), seed=3)
    round_base(model, torch.bfloat16)
    base = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    for name, data in {**model_files(model), **chars.files()}.items():
        run.files.put(name, data)
    settings = LoraSettings(rank=4, alpha=8.0, targets=("q_proj", "v_proj"))
    lora = attach(run, model, settings, torch.bfloat16)
    spec = RunSpec(
        tokenizer="aurora-char",
        chat_template=False,
        system_prompt=None,
        sampling=SamplingConfig(group=2, max_new_tokens=4),
        reward="task:arith",
        reward_timeout_s=5.0,
        eos_ids=chars.eos_ids,
        artefact=Artefact(kind="lora", lora=lora),
    )
    run.files.put(NAME, spec.to_bytes())
    policy = wrap(model, settings)
    publisher = ModelPublisher(run, policy, artefact=artefact_for(spec.artefact))
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=3e-2)
    ids = torch.randint(0, chars.vocab_size, (2, 8), generator=torch.Generator().manual_seed(7))
    expected: dict[str, object] = {
        "base_digest": lora.base_digest,
        "base_sha256": {k: _sha(v) for k, v in sorted(base.items()) if v.is_floating_point()},
    }
    for step, kind in enumerate(KINDS):
        if step:
            policy(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
        info = publisher.publish(step=step, kind=kind)
        sd = {k: v.to(torch.bfloat16) for k, v in adapter_state(policy).items()}
        expected[str(info.version)] = {
            "kind": info.kind,
            "version_hash": info.version_hash,
            "weights_digest": info.weights_digest,
            "tensor_sha256": {name: _sha(t) for name, t in sorted(sd.items())},
        }
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
