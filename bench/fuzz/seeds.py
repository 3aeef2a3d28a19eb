"""The seed inputs of ``aurora bench fuzz``: runs published here (signed with attachments and small
segments, unsigned; with sparse, classed and dense blocks) and the golden ``aurora/1`` and
``aurora/2`` runs, read back with their objects and parents."""

from __future__ import annotations

import functools
import hashlib
import json
import random
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

from aurora_store.format import dtypes
from aurora_store.format.manifest import Manifest, TensorSpec, canonical

DATA = Path(__file__).resolve().parents[2] / "tests" / "data"
GOLDEN = DATA / "golden"
GOLDEN_RUNS = (GOLDEN, DATA / "golden_sparse")
SPECS = (
    TensorSpec("a.weight", "BF16", (16, 32)),
    TensorSpec("b.norm", "F32", (64,)),
    TensorSpec("c.half", "F16", (8, 8)),
    TensorSpec("d.steps", "I64", (4,)),
    TensorSpec("e.mask", "BOOL", (6,)),
    TensorSpec("f.empty", "BF16", (0, 3)),
    TensorSpec("g.trained", "BF16", (64, 64)),
)
WIDTH = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8, "BOOL": 1}


# ---------------------------------------------------------------- seeds


@dataclass(frozen=True, slots=True)
class Published:
    """One version of a seed run, with what a reader holds when it reads it."""

    version: int
    raw: bytes
    manifest: Manifest
    objects: dict[str, bytes]
    """Every object the manifest names, by key."""
    parent: Any
    """The parent's WeightState (deltas), else None."""
    origin: Manifest
    key: Any
    """The run's Ed25519 private key if it is signed here (a mutant may be re-signed)."""
    verify: Any
    """Its public key if it is signed."""


class _Clock:
    """A fixed clock for the publisher: the seed manifests are the same bytes on every run."""

    @staticmethod
    def now(tz: Any = None) -> datetime:
        return datetime(2026, 1, 1, tzinfo=tz)


def _read(run: Any, key: Any, verify: Any) -> list[Published]:
    out: list[Published] = []
    for v in run.versions():
        m = run.manifest(v)
        objects = {s.key: bytes(run.reader.fetch(s)) for s in (*m.segments, *([m.index] if m.index else []))}
        parent = run.materialize_words(v - 1) if m.kind == "delta" else None
        raw = run.store.get(f"versions/{v:010d}/manifest.json", max_bytes=1 << 26)
        out.append(Published(v, raw, m, objects, parent, out[0].manifest if out else m, key, verify))
    return out


@functools.cache
def published(seed: int) -> tuple[Published, ...]:
    """A signed run with attachments and small segments (several per delta), an unsigned one, the golden run."""
    import aurora_store
    from aurora_store.bucket import plan
    from aurora_store.format.signing import load_signing_key
    from aurora_store.rl.models import tiny_config
    from aurora_store.rl.tokenizers import CharTokenizer

    out: list[Published] = []
    rng = np.random.default_rng(seed)
    signer = load_signing_key(hashlib.sha256(f"aurora-fuzz:{seed}".encode()).digest())
    with mock.patch.object(plan, "datetime", _Clock):
        for label, key, kinds, seg_bytes in (("signed", signer, "fddd", 512), ("unsigned", None, "fdfd", 4 << 20)):
            uri = f"memory://aurora-fuzz/{seed}/{label}"
            run = aurora_store.open_run(uri, signing_key=key, full_every=1000, segment_bytes=seg_bytes)
            if key is not None:
                run.files.put("config.json", json.dumps(tiny_config(98), indent=2, sort_keys=True).encode())
                run.files.put("tokenizer.json", CharTokenizer().to_json())
            words = {
                s.name: rng.integers(0, 1 << (8 * WIDTH[s.dtype]), int(np.prod(s.shape)), np.uint64).astype(
                    f"<u{WIDTH[s.dtype]}"
                )
                for s in SPECS
            }
            masters = rng.normal(0, 0.02, 64 * 64).astype(np.float32)  # trained-looking: classed blocks
            words["g.trained"] = dtypes.bf16_words(masters)
            for v, kind in enumerate(kinds):
                state = {k: w.copy() for k, w in words.items()}
                run.publish_words(SPECS, state, kind="full" if kind == "f" else "delta", step=v, meta={"v": str(v)})
                a = words["a.weight"]
                pos = rng.choice(a.size, 40, replace=False)
                a[pos[:35]] += rng.integers(1, 4, 35).astype(a.dtype)  # small steps
                a[pos[35:]] = rng.integers(0, 1 << 16, 5).astype(a.dtype)  # and escapes
                words["b.norm"][rng.choice(64, 6, replace=False)] ^= np.uint32(1 << 30)
                words["c.half"] += np.uint16(1)  # every element: a dense block
                words["d.steps"][0] += np.uint64(1)
                words["e.mask"][v % 6] ^= np.uint8(1)
                masters += np.float32(2e-5) * rng.choice(np.array([-1, 1], np.float32), masters.size)
                words["g.trained"] = dtypes.bf16_words(masters)
            out += _read(run, key, key.public_key() if key is not None else None)
    for root in GOLDEN_RUNS:
        golden = aurora_store.open_run(root.joinpath("run").as_uri(), verify_key=root.joinpath("key.pub").read_bytes())
        out += _read(golden, None, golden.reader.verify_key)
    return tuple(out)


def rehash(rng: random.Random, doc: Any, key: Any, always: bool = False) -> None:
    """Give a mutated manifest its correct version hash (and signature): an attacker's best effort."""
    from aurora_store.format.signing import sign

    if not isinstance(doc, dict) or (not always and rng.random() < 0.3):
        return
    try:
        h = hashlib.sha256(canonical({k: v for k, v in doc.items() if k not in ("version_hash", "signature")}))
    except (ValueError, TypeError, RecursionError):
        return
    doc["version_hash"] = h.hexdigest()
    if key is not None and isinstance(doc.get("signature"), dict) and rng.random() < 0.7:
        doc["signature"] = sign(doc["version_hash"], key).to_dict()
