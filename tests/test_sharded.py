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
from aurora_store import StoreError, UnsupportedError
from aurora_store.bucket.audit import audit
from aurora_store.bucket.parts import Share, range_table, whole
from aurora_store.format.delta import DeltaBuilder
from aurora_store.format.manifest import Parent, TensorSpec
from aurora_store.tensors import to_words
from aurora_store.testing.collective import ThreadGroup
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

    from trainer.publication import ModelPublisher

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    net = Net()
    lm: Any = net.lm
    for layer in lm.model.layers:
        fully_shard(layer)
    fully_shard(net)

    def open_() -> aurora_store.Run:
        return aurora_store.open_run(uri, signing_key=_key() if rank == 0 else None, extract=extract, **CONFIG)  # type: ignore[arg-type]

    pub = ModelPublisher(open_(), net)
    log: dict[str, Any] = {"infos": [], "errors": []}

    def publish(s: int) -> None:
        nonlocal pub
        if s == 6:  # rank 1's uploads fail: every rank raises, nothing is committed, the retry works
            store = pub.publisher.store
            real = store.put_immutable
            if rank == 1:
                store.put_immutable = _fail  # type: ignore[method-assign]
            try:
                pub.publish(step=s)
            except StoreError as exc:
                log["errors"].append(f"{type(exc).__name__}: {exc}")
            store.put_immutable = real  # type: ignore[method-assign]
        if s == 7:  # a restarted publisher: rank 0 reloads the run and sends each rank its slices
            pub = ModelPublisher(open_(), net)
        log["infos"].append(dataclasses.asdict(pub.publish(step=s)))
        info = log["infos"][-1]
        full = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in net.state_dict().items()}
        if rank == 0:
            save_file({k: v.contiguous() for k, v in _bf16(full).items()}, str(out / f"v{info['version']}.safetensors"))

    _train(net, publish)
    (out / f"rank{rank}.json").write_text(json.dumps(log))
    dist.destroy_process_group()


def _fail(key: str, data: Any, **kwargs: Any) -> None:
    raise StoreError(f"injected upload failure of {key}")


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


class _TwoRanks:
    """Two thread ranks of one group publishing to one run through the real publisher, each keeping
    its baseline from one publish to the next."""

    def __init__(self, uri: str, **config: Any) -> None:
        self.group = ThreadGroup(2)
        self.runs = [aurora_store.open_run(uri, **config) for _ in range(2)]
        self.pubs = [run.publisher.on(self.group.rank(r)) for r, run in enumerate(self.runs)]

    def publish(self, sd: dict[str, torch.Tensor], claim: Any = None, kind: Any = "auto") -> list[Any]:
        """``sd`` published with rank r owning ``claim(specs, r)`` (default: halves); each rank's
        VersionInfo or the exception it raised."""
        specs, words = to_words(sd)

        def one(r: int) -> Any:
            ranges = (claim or _halves)(specs, r)
            mine = {k: words[k][lo:hi] for k, (lo, hi) in ranges.items()}
            return self.pubs[r].publish(Share(specs, ranges, mine), kind=kind)

        return self.group.run(one)


def test_two_ranks_commit_what_one_process_would(tmp_path: Path) -> None:
    """Two ranks (threads of one group, the real publisher) each publish half of every tensor; the
    version reads back like a single publish: the same changes, digest and bits, both ranks' keys
    interleaved; a full version is the same objects one process writes."""
    ref = aurora_store.open_run(f"file://{tmp_path}/ref", segment_bytes=256)
    sd0 = state_dict()
    sd1 = step(sd0, 1, lr=1e-2)
    full = ref.publish(sd0)
    want = ref.publish(sd1, kind="delta")
    ranks = _TwoRanks(f"file://{tmp_path}/run", segment_bytes=256)
    run = ranks.runs[0]
    infos = ranks.publish(sd0)
    assert infos[0] == dataclasses.replace(infos[1], seconds=infos[0].seconds)  # the same outcome on both ranks
    assert [(s.key, s.sha256) for s in run.manifest(0).objects] == [(s.key, s.sha256) for s in ref.manifest(0).objects]
    assert infos[0].weights_digest == full.weights_digest
    (info, _) = ranks.publish(sd1, kind="delta")
    assert (info.changed, info.weights_digest) == (want.changed, want.weights_digest)
    ordinals = {int(seg.key.rsplit("/", 1)[1][:5]) % 2 for seg in run.manifest(1).segments}
    assert ordinals == {0, 1}  # both ranks' keys, interleaved
    assert bits_equal(run.materialize(1), sd1)
    assert audit(run).ok


def test_ranks_that_claim_the_same_elements_commit_nothing(tmp_path: Path) -> None:
    """Overlapping claims are refused on every rank before anything is written."""
    sd0 = state_dict()
    got = _TwoRanks(f"file://{tmp_path}/run").publish(sd0, lambda specs, r: whole(specs))
    assert all(isinstance(e, UnsupportedError) and "expected" in str(e) for e in got), got
    run = aurora_store.open_run(f"file://{tmp_path}/run")
    assert run.versions() == [] and run.store.list_keys("") == []
    specs, old = to_words(sd0)
    _, new = to_words(step(sd0, 1, lr=1e-2))
    with pytest.raises(StoreError, match="not inside"):
        next(DeltaBuilder(1, specs).add_tensor(specs[0], old[specs[0].name], new[specs[0].name], start=1))


def test_a_delta_that_outgrows_a_full_copy_is_never_uploaded(tmp_path: Path) -> None:
    """An ``auto`` delta is held until every rank's size is known: when the chain would outgrow a
    full copy, the version is published full and no segment of the abandoned delta exists."""
    sd0 = state_dict()
    sd1 = step(sd0, 1, lr=1.0)  # nearly every element changes: a delta costs more than the model
    for ranks in (1, 2):
        uri = f"file://{tmp_path}/r{ranks}"
        if ranks == 1:
            run = aurora_store.open_run(uri, segment_bytes=256)
            run.publish(sd0)
            info = run.publish(sd1)
        else:
            two = _TwoRanks(uri, segment_bytes=256)
            two.publish(sd0)
            info = two.publish(sd1)[0]
            run = aurora_store.open_run(uri)
        assert info.kind == "full", ranks
        keys = run.store.list_keys("versions/0000000001/")
        assert keys and not [k for k in keys if k.endswith(".seg")], keys
        assert bits_equal(run.materialize(1), sd1)


def test_range_table_must_tile_every_tensor() -> None:
    specs, _ = to_words({"w": torch.zeros(4, 3)})
    assert range_table(specs, [{"w": [0, 6]}, {"w": [6, 12]}]) == {"w": [(0, 0, 6), (1, 6, 12)]}
    with pytest.raises(UnsupportedError, match="starts at element 5"):
        range_table(specs, [{"w": [0, 6]}, {"w": [5, 12]}])
    with pytest.raises(UnsupportedError, match="cover 6 of 12"):
        range_table(specs, [{"w": [0, 6]}, {}])


def test_without_torch_distributed_the_whole_model_is_published(tmp_path: Path) -> None:
    from trainer.publication import ModelPublisher

    model = nn.Linear(4, 3)
    run = aurora_store.open_run(f"file://{tmp_path}/run")
    info = ModelPublisher(run, model).publish(step=0)
    assert (info.version, info.kind) == (0, "full")
    assert bits_equal(run.materialize(0), _bf16({k: v.detach() for k, v in model.state_dict().items()}))


def test_a_streamed_delta_that_outgrows_the_budget_is_published_full_and_removed(tmp_path: Path) -> None:
    """After a small delta, the next ``auto`` delta streams its segments as they are sealed (each
    announced as it lands); when it grew far past the last one and outgrows the chain budget, the
    version is published full and the streamed segments are removed: nothing is left that no
    manifest names."""

    class Announced:
        def __init__(self) -> None:
            self.segments: list[tuple[int, str]] = []

        def segment(self, version: int, entry: Any) -> None:
            self.segments.append((version, entry.key))

        def commit(self, manifest: Any) -> None:
            pass

    run = aurora_store.open_run(f"file://{tmp_path}/run", segment_bytes=256)
    run.announcer = told = Announced()
    sd0 = state_dict()
    sd1 = step(sd0, 1, lr=1e-5)
    sd2 = step(sd1, 2, lr=1.0)  # nearly every element changes
    run.publish(sd0)
    assert run.publish(sd1).kind == "delta"
    info = run.publish(sd2)
    assert info.kind == "full"
    streamed = [k for v, k in told.segments if v == 2 and k.endswith(".seg")]
    assert streamed, "the delta streamed before its size was known"
    assert not [k for k in streamed if run.store.exists(k)], "and its segments were removed"
    keys = run.store.list_keys("versions/0000000002/")
    assert keys and not [k for k in keys if k.endswith(".seg")], keys
    assert bits_equal(run.materialize(2), sd2)
    assert audit(run).ok


# ---------------------------------------------------------------- gloo ranks under torchrun


def _torchrun(tmp_path: Path, uri: str, *, ranks: int, extract: str) -> Path:
    """This file's :func:`worker` on ``ranks`` gloo ranks under torchrun; the folder of their dumps."""
    out = tmp_path / "dumps"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)]
    proc = subprocess.run(
        [*cmd, str(Path(__file__)), uri, str(out), extract],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    return out


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

    from trainer.publication import ModelPublisher

    uri = f"file://{tmp_path}/sharded"
    out = _torchrun(tmp_path, uri, ranks=2, extract=extract)

    logs = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    sharded = aurora_store.open_run(uri, verify_key=_key().public_key())
    kinds = [sharded.manifest(v).kind for v in sharded.versions()]

    # the same training in one process, published through Run.publish with the same kinds (the
    # ranks' deltas are a little larger, each rank's blocks tiling its own half of a tensor, so the
    # chain may outgrow a full copy a version sooner)
    ref = aurora_store.open_run(f"file://{tmp_path}/single", signing_key=_key(), **CONFIG)  # type: ignore[arg-type]
    net = Net()
    pub = ModelPublisher(ref, net)
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


@pytest.mark.slow
def test_one_torch_rank_writes_object_for_object_what_the_local_collective_writes(tmp_path: Path) -> None:
    """The publisher's two collectives: one gloo rank under torchrun (``TorchCollective``) and this
    process alone (``LocalCollective``) train the same model and write the same objects, key for key
    and byte for byte; the manifests differ only in their creation times and what hashes them."""
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("this torch build has no gloo backend")
    from trainer.publication import ModelPublisher

    uri = f"file://{tmp_path}/gloo"
    _torchrun(tmp_path, uri, ranks=1, extract="auto")
    gloo = aurora_store.open_run(uri, verify_key=_key().public_key())
    local = aurora_store.open_run(f"file://{tmp_path}/local", signing_key=_key(), **CONFIG)  # type: ignore[arg-type]
    net = Net()
    pub = ModelPublisher(local, net)

    def publish(s: int) -> None:
        nonlocal pub
        if s == 6:  # the worker's step with a failing rank 1: without one, it publishes twice
            pub.publish(step=s)
        if s == 7:  # the worker restarts its publisher here too
            pub = ModelPublisher(aurora_store.open_run(local.uri, signing_key=_key(), **CONFIG), net)  # type: ignore[arg-type]
        pub.publish(step=s)

    _train(net, publish)
    assert gloo.versions() == local.versions() == list(range(STEPS + 2))
    keys = gloo.store.list_keys("")
    assert keys == local.store.list_keys("")
    unhashed = ("created", "version_hash", "signature", "parent", "run")
    for key in keys:
        a, b = (r.store.get(key, max_bytes=1 << 30) for r in (gloo, local))
        if key.endswith("manifest.json"):
            a, b = ({k: v for k, v in json.loads(x).items() if k not in unhashed} for x in (a, b))
        assert a == b, key
    assert any(gloo.manifest(v).kind == "delta" for v in gloo.versions())


if __name__ == "__main__":
    worker(sys.argv[1], Path(sys.argv[2]), sys.argv[3])
