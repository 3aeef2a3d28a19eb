"""Sharded publishing: FSDP2 ranks each publish their shards, rank 0 commits.

The end-to-end test runs this file under ``torchrun --nproc_per_node 2`` (gloo, CPU): a tiny
Qwen3 with uneven shards trains a few AdamW steps and publishes every version; the test process
trains the same model unsharded and publishes it through ``Run.publish``. Every materialized
version must match bit for bit. Run as a script, the file is the torchrun worker.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import aurora_store
from aurora_store import CorruptError, StoreError, UnsupportedError
from aurora_store.bucket.audit import audit
from aurora_store.bucket.plan import PublishPlan
from aurora_store.bucket.publish import Baseline, Part, delta_part, whole
from aurora_store.format.delta import DeltaBuilder
from aurora_store.format.keys import manifest_key
from aurora_store.format.manifest import Parent, TensorSpec
from aurora_store.tensors import to_words
from tests.helpers import bits_equal, state_dict, step

REPO = Path(__file__).resolve().parents[1]
VOCAB = 99  # odd: the embedding and the head split 50 / 49 rows over two ranks
STEPS = 7
CONFIG = {"full_every": 1000, "segment_bytes": 4096, "shard_bytes": 24 << 10}
"""Small segments and shards, so each rank uploads several segments and builds some shards."""


def _key() -> Any:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.from_private_bytes(bytes(range(32)))


class Net(nn.Module):
    """A tiny causal LM plus parameters whose rows do not split evenly (3 rows; 1 row: rank 1 holds
    none of it) and an integer buffer (every rank holds it whole; rank 0 publishes it)."""

    steps: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        from aurora_store.rl.models import build_model, tiny_config

        self.lm = build_model(tiny_config(VOCAB, hidden=32, layers=2, heads=4, kv_heads=2), seed=0)
        g = torch.Generator().manual_seed(1)
        self.odd = nn.Parameter(torch.randn(3, 5, generator=g))
        self.one = nn.Parameter(torch.randn(1, generator=g))
        self.register_buffer("steps", torch.zeros(3, dtype=torch.int64))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        loss = self.lm(input_ids=ids, labels=ids).loss
        return loss + 1e-2 * (self.odd.square().sum() + self.one.square().sum())


def _train(net: Net, publish: Any) -> None:
    """Version 0, then one version per AdamW step on fixed data (every rank sees the same batch)."""
    ids = torch.randint(3, VOCAB, (4, 16), generator=torch.Generator().manual_seed(2))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    publish(0)
    for s in range(1, STEPS + 1):
        opt.zero_grad()
        net(ids).backward()
        opt.step()
        net.steps.add_(1)
        publish(s)


def _bf16(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in sd.items()}


def worker(uri: str, out: Path, extract: str = "auto") -> None:
    """One torchrun rank: FSDP2 on gloo, publish every step; dump what rank 0 gathered."""
    import torch.distributed as dist
    from safetensors.torch import save_file
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from trainer.sharded import ShardedPublisher

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    net = Net()
    lm: Any = net.lm
    for layer in lm.model.layers:
        fully_shard(layer)
    fully_shard(net)

    def open_() -> aurora_store.Run:
        return aurora_store.open_run(uri, signing_key=_key() if rank == 0 else None, extract=extract, **CONFIG)  # type: ignore[arg-type]

    pub = ShardedPublisher(open_(), net)
    log: dict[str, Any] = {"infos": [], "errors": []}

    def publish(s: int) -> None:
        nonlocal pub
        if s == 6:  # rank 1's uploads fail: every rank raises, nothing is committed, the retry works
            real = pub.run.upload
            if rank == 1:
                pub.run.upload = _fail  # type: ignore[method-assign]
            try:
                pub.publish(step=s)
            except StoreError as exc:
                log["errors"].append(f"{type(exc).__name__}: {exc}")
            pub.run.upload = real  # type: ignore[method-assign]
        if s == 7:  # a restarted publisher: rank 0 reloads the run and sends each rank its slices
            pub = ShardedPublisher(open_(), net)
        log["infos"].append(dataclasses.asdict(pub.publish(step=s)))
        info = log["infos"][-1]
        full = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in net.state_dict().items()}
        if rank == 0:
            save_file({k: v.contiguous() for k, v in _bf16(full).items()}, str(out / f"v{info['version']}.safetensors"))

    _train(net, publish)
    (out / f"rank{rank}.json").write_text(json.dumps(log))
    dist.destroy_process_group()


def _fail(version: int, obj: Any, staged: Any = None) -> None:
    raise StoreError(f"injected upload failure of {obj.entry.key}")


# ---------------------------------------------------------------- store side, no processes


def _halves(specs: tuple[TensorSpec, ...], rank: int) -> dict[str, tuple[int, int]]:
    """Rank 0 owns the first half of every tensor, rank 1 the rest."""
    out = {}
    for s in specs:
        cut = s.numel // 2
        lo, hi = (0, cut) if rank == 0 else (cut, s.numel)
        if hi > lo:
            out[s.name] = (lo, hi)
    return out


def test_one_plan_driven_by_two_ranks_commits_what_one_process_would(tmp_path: Path) -> None:
    """Two 'ranks' each make a part over half of every tensor; the commit of their parts reads back
    like a single publish: the same changes, digest and bits, and both ranks' keys interleaved."""
    run = aurora_store.open_run(f"file://{tmp_path}/run", segment_bytes=256)
    ref = aurora_store.open_run(f"file://{tmp_path}/ref", segment_bytes=256)
    sd0 = state_dict()
    sd1 = step(sd0, 1, lr=1e-2)
    run.publish(sd0)
    ref.publish(sd0)
    want = ref.publish(sd1, kind="delta")
    specs, old = to_words(sd0)
    _, new = to_words(sd1)
    plan = PublishPlan.from_dict(run.plan(specs, kind="delta").to_dict())  # as rank 0 sends it to every rank
    assert (plan.version, plan.full, plan.parent is not None and plan.parent.version) == (1, False, 0)
    parts = []
    for rank in (0, 1):
        ranges = _halves(specs, rank)
        base = Baseline(plan.parent, ranges, {k: old[k][lo:hi] for k, (lo, hi) in ranges.items()})  # type: ignore[arg-type]
        mine = {k: new[k][lo:hi] for k, (lo, hi) in ranges.items()}
        uploads = run.uploads(1)
        made = delta_part(plan, base, mine, uploads, segment_bytes=256, rank=rank, world=2)
        assert made is not None
        parts.append(Part.from_dict(made[0].to_dict(), plan.specs))  # as each rank sends rank 0 its part
    info = run.commit(plan, parts)
    assert (info.changed, info.weights_digest) == (want.changed, want.weights_digest)
    ordinals = {int(seg.key.rsplit("/", 1)[1][:5]) % 2 for seg in run.manifest(1).segments}
    assert ordinals == {0, 1}  # both ranks' keys, interleaved
    assert bits_equal(run.materialize(1), sd1)
    assert audit(run).ok


def test_commit_checks_assembled_manifests(tmp_path: Path) -> None:
    """Overlapping blocks from two ranks are refused before anything is committed."""
    run = aurora_store.open_run(f"file://{tmp_path}/run")
    sd0 = state_dict()
    sd1 = step(sd0, 1, lr=1e-2)
    run.publish(sd0)
    specs, old = to_words(sd0)
    _, new = to_words(sd1)
    plan = run.plan(specs, kind="delta")
    assert plan.parent is not None
    parts = []
    for rank in (0, 1):  # both claim the whole tensors
        base = Baseline(plan.parent, whole(specs), dict(old))
        uploads = run.uploads(1)
        made = delta_part(plan, base, new, uploads, segment_bytes=4 << 20, rank=rank, world=2)
        assert made is not None
        parts.append(made[0])
    with pytest.raises(CorruptError, match="overlap"):
        run.commit(plan, parts)
    assert not run.store.exists(manifest_key(1))
    with pytest.raises(StoreError, match="not inside"):
        next(DeltaBuilder(1, specs).add_tensor(specs[0], old[specs[0].name], new[specs[0].name], start=1))


def test_range_table_must_tile_every_tensor() -> None:
    from trainer.shard_ranges import range_table

    specs, _ = to_words({"w": torch.zeros(4, 3)})
    assert range_table(specs, [{"w": [0, 6]}, {"w": [6, 12]}]) == {"w": [(0, 0, 6), (1, 6, 12)]}
    with pytest.raises(UnsupportedError, match="starts at element 5"):
        range_table(specs, [{"w": [0, 6]}, {"w": [5, 12]}])
    with pytest.raises(UnsupportedError, match="cover 6 of 12"):
        range_table(specs, [{"w": [0, 6]}, {}])


def test_without_torch_distributed_the_whole_model_is_published(tmp_path: Path) -> None:
    from trainer.sharded import ShardedPublisher

    model = nn.Linear(4, 3)
    run = aurora_store.open_run(f"file://{tmp_path}/run")
    info = ShardedPublisher(run, model).publish(step=0)
    assert (info.version, info.kind) == (0, "full")
    assert bits_equal(run.materialize(0), _bf16({k: v.detach() for k, v in model.state_dict().items()}))


# ---------------------------------------------------------------- two gloo ranks


@pytest.mark.slow
@pytest.mark.parametrize("extract", ["auto", "device"])
def test_two_fsdp2_ranks_publish_what_one_process_publishes(tmp_path: Path, extract: str) -> None:
    """Each rank extracts its shards' deltas on the host (``auto`` on CPU tensors) or with torch ops
    where the shards live (``device``, as on a GPU)."""
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        pytest.skip("this torch build has no FSDP2 (torch.distributed.fsdp.fully_shard)")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("this torch build has no gloo backend")
    from safetensors.torch import load_file

    from trainer.sharded import ShardedPublisher

    uri = f"file://{tmp_path}/sharded"
    out = tmp_path / "dumps"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    proc = subprocess.run(
        [*cmd, str(Path(__file__)), uri, str(out), extract],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]

    logs = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    sharded = aurora_store.open_run(uri, verify_key=_key().public_key())
    kinds = [sharded.manifest(v).kind for v in sharded.versions()]

    # the same training in one process, published through Run.publish with the same kinds (the
    # ranks' deltas are a little larger, each rank's blocks tiling its own half of a tensor, so the
    # chain may outgrow a full copy a version sooner)
    ref = aurora_store.open_run(f"file://{tmp_path}/single", signing_key=_key(), **CONFIG)  # type: ignore[arg-type]
    net = Net()
    pub = ShardedPublisher(ref, net)
    _train(net, lambda s: pub.publish(step=s, kind=kinds[s]))  # type: ignore[arg-type]
    assert sharded.versions() == ref.versions() == list(range(STEPS + 1))
    assert kinds == [ref.manifest(v).kind for v in ref.versions()]
    assert kinds[:4] == ["full", "delta", "delta", "delta"]
    assert "full" in kinds[4:]  # the chain outgrew a full copy: the ranks' deltas were set aside for a full version
    for v in sharded.versions():
        got, want, m, r = sharded.materialize(v), ref.materialize(v), sharded.manifest(v), ref.manifest(v)
        dumped = load_file(str(out / f"v{v}.safetensors"))
        assert bits_equal(got, dumped), f"version {v} differs from what the ranks held"
        assert bits_equal(got, want), f"version {v} differs from the single-process run"
        assert (m.weights_digest, m.stats.changed, m.kind) == (r.weights_digest, r.stats.changed, r.kind)
        assert [i["version_hash"] for i in (logs[0]["infos"][v], logs[1]["infos"][v])] == [m.version_hash] * 2
        if m.kind == "full":  # the same shards a single process writes, built on both ranks
            assert [(s.key, s.sha256) for s in m.objects] == [(s.key, s.sha256) for s in r.objects]
        else:
            assert m.parent == Parent(v - 1, sharded.manifest(v - 1).version_hash)
            assert {int(s.key.rsplit("/", 1)[1][:5]) % 2 for s in m.segments} == {0, 1}
            embed = [t.name for t in m.tensors].index("lm.model.embed_tokens.weight")
            starts = sorted(b.start for s in m.segments for b in s.blocks if b.tensor == embed)
            assert starts[0] == 0 and 50 * 32 in starts  # rank 1's rows start at row 50
    assert all(len(sharded.manifest(v).segments) >= 2 for v in sharded.versions() if kinds[v] == "full")
    assert audit(sharded).ok
    # rank 1's injected failure: both ranks raised, the version was published on the retry
    assert len(logs[1]["errors"]) == 1 and "injected upload failure" in logs[1]["errors"][0]
    assert len(logs[0]["errors"]) == 1 and logs[0]["errors"][0].startswith("StoreError: rank 1: injected")
    assert np.array_equal(sharded.materialize(STEPS)["steps"].numpy(), np.full(3, STEPS))


if __name__ == "__main__":
    worker(sys.argv[1], Path(sys.argv[2]), sys.argv[3])
