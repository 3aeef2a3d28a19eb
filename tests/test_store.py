"""One store test suite, run on memory://, file:// and s3:// (moto over HTTP)."""

from __future__ import annotations

import threading

import pytest
import torch

import aurora_store
from aurora_store import ConflictError, LayoutError, StoreError, UnsupportedError
from aurora_store.format.keys import manifest_key
from tests.conftest import Root
from tests.helpers import bits_equal, state_dict, step


def open_(root: Root, **kw):  # type: ignore[no-untyped-def]
    return aurora_store.open_run(root.uri, storage_options=root.storage_options, **kw)


def test_publish_materialize_round_trip(root: Root) -> None:
    run = open_(root, full_every=4, segment_bytes=512)
    history = []
    sd = state_dict()
    for s in range(7):
        info = run.publish(sd, step=s)
        assert info.version == s
        history.append(sd)
        sd = step(sd, s)
    assert run.versions() == list(range(7))
    kinds = [run.manifest(v).kind for v in range(7)]
    assert kinds == ["full", "delta", "delta", "delta", "full", "delta", "delta"]
    fresh = open_(root)
    for v, expected in enumerate(history):
        assert bits_equal(fresh.materialize(v), expected), v
    assert bits_equal(fresh.materialize(), history[-1])
    m = fresh.manifest(5)
    assert m.step == 5 and m.parent is not None and m.parent.version_hash == fresh.manifest(4).version_hash
    assert len(m.segments) > 1, "small segment_bytes must split a delta into several segments"


def test_delta_is_small_and_counts_changes(root: Root) -> None:
    run = open_(root)
    sd = state_dict(scale=8)
    run.publish(sd)
    nxt = dict(sd)
    w = sd["model.embed_tokens.weight"].clone()
    w.view(-1)[[0, 17, w.numel() - 1]] = torch.tensor([1.0, -0.0, float("nan")], dtype=torch.bfloat16)
    nxt["model.embed_tokens.weight"] = w
    info = run.publish(nxt)
    assert info.kind == "delta" and info.changed == 3
    assert info.bytes < 200
    assert bits_equal(run.materialize(1), nxt)


def test_unchanged_state_publishes_an_empty_delta(root: Root) -> None:
    run = open_(root)
    sd = state_dict()
    run.publish(sd)
    info = run.publish(sd)
    assert (info.kind, info.changed, info.bytes, info.segments) == ("delta", 0, 0, 0)
    assert bits_equal(run.materialize(1), sd)


def test_every_bit_pattern_survives(root: Root) -> None:
    """Signed zeros, NaN payloads, infinities and subnormals are bit patterns like any other."""
    run = open_(root)
    patterns = torch.tensor(
        [0x0000, 0x8000, 0x7FC0, 0x7FC1, 0xFFFF, 0x7F80, 0xFF80, 0x0001, 0x8001, 0x3F80], dtype=torch.int32
    ).to(torch.int16)
    a = {"x": patterns.view(torch.bfloat16).clone(), "y": torch.zeros(4, dtype=torch.float32)}
    run.publish(a)
    b = {
        "x": patterns.flip(0).view(torch.bfloat16).clone(),
        "y": torch.tensor([0x7FC00001, -0x80000000, 0x00000001, 0x7F800000], dtype=torch.int32).view(torch.float32),
    }
    run.publish(b)
    assert bits_equal(run.materialize(0), a)
    assert bits_equal(run.materialize(1), b)


def test_full_when_the_chain_costs_more_than_a_full_copy(root: Root) -> None:
    run = open_(root, full_every=1000)
    sd = state_dict()
    run.publish(sd)
    kinds = []
    for s in range(4):
        sd = step(sd, s, lr=1.0)  # every element changes: each delta is about as large as a full copy
        kinds.append(run.publish(sd).kind)
    assert "full" in kinds
    chain = [run.manifest(v) for v in run.versions()]
    for m in chain:
        if m.kind == "delta":
            assert m.stats.chain_bytes <= m.stats.full_bytes


def test_layout_change_needs_a_full_version(root: Root) -> None:
    run = open_(root)
    sd = state_dict()
    run.publish(sd)
    bad = dict(sd)
    bad["model.norm.weight"] = torch.ones(33)
    with pytest.raises(LayoutError, match="model.norm.weight.*F32\\[32\\] -> F32\\[33\\].*kind='full'"):
        run.publish(bad)
    renamed = {("x." + k if k == "head.bias" else k): v for k, v in sd.items()}
    with pytest.raises(LayoutError, match="added 'x.head.bias'.*removed 'head.bias'"):
        run.publish(renamed)
    retyped = dict(sd, **{"head.bias": sd["head.bias"].to(torch.bfloat16)})
    with pytest.raises(LayoutError, match="head.bias"):
        run.publish(retyped)
    assert run.versions() == [0]
    info = run.publish(bad, kind="full")
    assert info.kind == "full" and info.version == 1
    assert bits_equal(run.materialize(1), bad) and bits_equal(run.materialize(0), sd)


def test_bad_state_dicts_are_refused(root: Root) -> None:
    run = open_(root)
    with pytest.raises(StoreError, match="mapping"):
        run.publish([torch.zeros(2)])  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="expected a torch.Tensor"):
        run.publish({"a": [1.0, 2.0]})  # type: ignore[dict-item]
    with pytest.raises(StoreError, match="non-empty"):
        run.publish({"": torch.zeros(2)})
    with pytest.raises(UnsupportedError, match="complex"):
        run.publish({"a": torch.zeros(2, dtype=torch.complex64)})
    with pytest.raises(LayoutError, match="version 0 must be full"):
        run.publish({"a": torch.zeros(2)}, kind="delta")
    assert run.versions() == []


def test_concurrent_publishers_exactly_one_wins(root: Root) -> None:
    base = state_dict()
    open_(root).publish(base)
    runs = [open_(root) for _ in range(4)]
    for r in runs:
        assert r.latest() == 0
        r.resume()  # both load version 0 before racing, as two live trainers would
    outcomes: list[object] = [None] * len(runs)
    barrier = threading.Barrier(len(runs))

    def go(i: int) -> None:
        barrier.wait()
        try:
            outcomes[i] = runs[i].publish(step(base, 100 + i))
        except ConflictError as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(runs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, o in enumerate(outcomes) if isinstance(o, aurora_store.VersionInfo)]
    assert len(winners) == 1, outcomes
    assert all(isinstance(o, ConflictError) for i, o in enumerate(outcomes) if i != winners[0])
    fresh = open_(root)
    assert fresh.versions() == [0, 1]
    assert bits_equal(fresh.materialize(1), step(base, 100 + winners[0]))
    # a loser reloads and publishes the next version on top of the winner
    loser = runs[(winners[0] + 1) % len(runs)]
    assert loser.publish(step(base, 999)).version == 2


def test_retry_after_a_crash_half_way(root: Root) -> None:
    """Segments of a crashed publish are already there; the retry reuses or ignores them."""
    run = open_(root, segment_bytes=256)
    sd = state_dict()
    run.publish(sd)
    nxt = step(sd, 1)
    # crash simulation: upload the segments of version 1 but not its manifest
    from aurora_store.format.delta import DeltaBuilder
    from aurora_store.tensors import to_words

    specs, words = to_words(nxt)
    base = run.materialize_words(0)
    builder = DeltaBuilder(1, specs, 256)
    objs = [o for s in specs for o in builder.add_tensor(s, base.words[s.name], words[s.name])]
    objs += list(builder.finish())
    for o in objs[: len(objs) // 2 + 1]:
        assert run.store.put_if_absent(o.entry.key, o.data)
    assert run.versions() == [0]
    # the retry publishes the same weights: same keys, verified and reused
    assert open_(root).publish(nxt).version == 1
    assert bits_equal(open_(root).materialize(1), nxt)


def test_retry_with_other_weights_after_a_crash(root: Root) -> None:
    run = open_(root)
    sd = state_dict()
    run.publish(sd)
    from aurora_store.format.delta import DeltaBuilder
    from aurora_store.tensors import to_words

    specs, words = to_words(step(sd, 1))
    builder = DeltaBuilder(1, specs)
    base = run.materialize_words(0)
    for s in specs:
        for o in builder.add_tensor(s, base.words[s.name], words[s.name]):
            run.store.put_if_absent(o.entry.key, o.data)
    for o in builder.finish():
        run.store.put_if_absent(o.entry.key, o.data)
    other = step(sd, 2)
    assert run.publish(other).version == 1
    assert bits_equal(open_(root).materialize(1), other)


def test_existing_object_with_other_bytes_is_a_conflict(root: Root) -> None:
    run = open_(root)
    run.store.put_if_absent("x/obj", b"one")
    assert run.store.put_immutable("x/obj", b"one", verify=lambda b: b == b"one") is False
    with pytest.raises(ConflictError, match="immutable"):
        run.store.put_immutable("x/obj", b"two", verify=lambda b: b == b"two")
    assert run.store.get("x/obj", max_bytes=10) == b"one"


def test_manifest_is_written_once(root: Root) -> None:
    run = open_(root)
    run.publish(state_dict())
    before = run.store.get(manifest_key(0), max_bytes=1 << 20)
    assert run.store.put_if_absent(manifest_key(0), b"{}") is False
    assert run.store.get(manifest_key(0), max_bytes=1 << 20) == before


def test_signed_run(root: Root) -> None:
    from aurora_store.format.signing import generate_keypair

    priv, pub = generate_keypair()
    _, other_pub = generate_keypair()
    run = open_(root, signing_key=priv)
    sd = state_dict()
    run.publish(sd)
    run.publish(step(sd, 0))
    assert run.manifest(1).signature is not None
    assert bits_equal(open_(root, verify_key=pub).materialize(1), step(sd, 0))
    with pytest.raises(aurora_store.UnauthenticatedError, match="signed by key"):
        open_(root, verify_key=other_pub).materialize(1)
    unsigned = open_(root.child("unsigned"))
    unsigned.publish(sd)
    with pytest.raises(aurora_store.UnauthenticatedError, match="unsigned"):
        open_(root.child("unsigned"), verify_key=pub).materialize(0)


def test_publisher_keeps_one_copy_and_reopens(root: Root) -> None:
    run = open_(root)
    sd = state_dict()
    run.publish(sd)
    sd1 = step(sd, 1)
    run.publish(sd1)
    # another process (a restarted trainer) opens the run and continues the chain
    again = open_(root)
    sd2 = step(sd1, 2)
    info = again.publish(sd2)
    assert (info.version, info.kind) == (2, "delta")
    assert bits_equal(open_(root).materialize(2), sd2)
    # the original publisher notices it is behind: a conflict first, then it continues on top
    sd3 = step(sd2, 3)
    with pytest.raises(ConflictError, match="another publisher"):
        run.publish(sd3)
    assert run.publish(sd3).version == 3
    with pytest.raises(ConflictError, match="next version is 4"):
        run.publish(sd3, version=7)
    assert bits_equal(open_(root).materialize(3), sd3)


def test_full_versions_are_standard_safetensors(root: Root) -> None:
    import json

    import safetensors.torch

    run = open_(root, shard_bytes=2048)
    sd = state_dict()
    run.publish(sd)
    m = run.manifest(0)
    assert len(m.segments) > 1 and m.index is not None
    loaded: dict[str, torch.Tensor] = {}
    for seg in m.segments:
        assert seg.key.endswith(".safetensors")
        loaded.update(safetensors.torch.load(run.store.get(seg.key, max_bytes=1 << 24)))
    assert bits_equal(loaded, sd)
    index = json.loads(run.store.get(m.index.key, max_bytes=1 << 20))
    shards = {seg.key.rsplit("/", 1)[1] for seg in m.segments}
    assert set(index["weight_map"]) == set(sd) and set(index["weight_map"].values()) == shards
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in sd.values())


@pytest.mark.slow
def test_many_large_objects_with_few_connections(root: Root) -> None:
    """Objects larger than a ranged-GET part, more of them than connections: no starvation."""
    limits = aurora_store.Limits(part_bytes=64)
    run = open_(root, shard_bytes=1024, concurrency=2, limits=limits)
    sd = state_dict(scale=4)
    run.publish(sd)
    assert len(run.manifest(0).segments) > 2
    assert bits_equal(open_(root, concurrency=2, limits=limits).materialize(0), sd)
