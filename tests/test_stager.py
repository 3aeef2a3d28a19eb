"""Versions staged where the weights live (``actor.stager``): decoded from their verified bytes against
the live tensors, checked, kept, written at the safe point; hostile bytes and manifests change nothing.
The same decode runs in a vLLM worker (its ops over views of fused parameters, packed as on the wire)."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aurora_store
from actor.engines.vllm.weights import OPS, LocalRunner, VllmWeights, pack, unpack
from actor.live import TensorWeights
from actor.stager import Base, Staged
from actor.updater import Updater
from aurora_store.errors import ChainError, CorruptError, LimitError, StoreError
from aurora_store.format.digest import Digest
from aurora_store.format.manifest import Manifest
from tests.helpers import bits_equal, state_dict, step
from tests.test_vllm_layout import GEOM, fuse, garbage_like, hf, same
from tests.test_vllm_layout import step as hf_step


def chain(n: int, lr: float = 3e-4) -> tuple[aurora_store.Run, list[dict[str, torch.Tensor]]]:
    run = aurora_store.open_run(f"memory://aurora-tests/{uuid.uuid4().hex}/run", full_every=100, segment_bytes=512)
    hist = [state_dict(scale=4)]
    for i in range(n):
        hist.append(step(hist[-1], i, lr=lr))
    for v, sd in enumerate(hist):
        run.publish(sd, kind="delta" if v else "full")
    return run, hist


def applied(run: aurora_store.Run, v: int) -> Base:
    m = run.manifest(v)
    return Base(v, m.version_hash, m.weights_digest)


def live_at(run: aurora_store.Run, v: int) -> TensorWeights:
    state = run.materialize(v)
    return TensorWeights({k: t.clone() for k, t in state.items()})


def data(run: aurora_store.Run, m: Manifest) -> list[memoryview]:
    return run.reader.fetch_all(m)


def test_a_staged_chain_writes_exactly_the_last_version_and_nothing_before_the_commit() -> None:
    run, hist = chain(3)
    live = live_at(run, 0)
    s1 = live.stage_version(applied(run, 0), run.manifest(1), data(run, run.manifest(1)))
    s2 = live.stage_version(s1, run.manifest(2), data(run, run.manifest(2)))
    assert bits_equal(live.tensors, hist[0]), "staging never touches the live weights"
    assert (s2.base_version, s2.version, s2.digest.hex()) == (0, 2, run.manifest(2).weights_digest)
    changed = sum(int((hist[0][k].view(torch.int16) != hist[2][k].view(torch.int16)).sum()) for k in hist[0])
    # positions staged: every element changed by either version (a dense block also lists equal words)
    assert s2.changed >= changed > 0 and s2.nbytes <= s2.changed * (8 + 8)
    live.drop_staged(s1)
    live.commit_staged(s2)
    assert bits_equal(live.tensors, hist[2]) and live.digest() == run.manifest(2).weights_digest
    assert live.stager.tokens == [], "a commit forgets every staging made over the weights before it"


@pytest.mark.parametrize(
    "damage",
    ["flipped_payload", "truncated", "missing_segment", "swapped_segments", "wrong_digest", "wrong_parent", "full"],
)
def test_hostile_bytes_and_manifests_stage_nothing(damage: str) -> None:
    run, hist = chain(3)
    live = live_at(run, 1)
    good = live.stage_version(applied(run, 1), run.manifest(2), data(run, run.manifest(2)))
    m, got = run.manifest(3), [bytearray(d) for d in data(run, run.manifest(3))]
    base: Staged | Base = good
    error: type[StoreError] = CorruptError
    if damage == "flipped_payload":  # bytes that passed the hash check but do not decode to the version
        for b in got:
            b[len(b) // 2] ^= 0x5A
    elif damage == "truncated":
        got[0] = got[0][:-1]
    elif damage == "missing_segment":
        got = got[:-1]
    elif damage == "swapped_segments":
        if len(got) < 2:
            pytest.skip("one segment")
        got = got[::-1]
    elif damage == "wrong_digest":
        m = replace(m, weights_digest="0" * 32)
        error = ChainError
    elif damage == "wrong_parent":
        base = applied(run, 1)  # version 3 does not follow version 1
        error = ChainError
    else:
        m = run.manifest(0)
        base, error = applied(run, 0), StoreError
    with pytest.raises(error):
        live.stage_version(base, m, [memoryview(b) for b in got])
    assert live.stager.tokens == [good.token], "the staging it would have extended is still there"
    assert bits_equal(live.tensors, hist[1])
    live.commit_staged(good)  # and still good
    assert bits_equal(live.tensors, hist[2])


def test_a_block_past_the_decode_cap_is_refused_before_decoding() -> None:
    run, _ = chain(1)
    live = live_at(run, 0)
    live.stager.max_decoded_bytes = 16
    with pytest.raises(LimitError):
        live.stage_version(applied(run, 0), run.manifest(1), data(run, run.manifest(1)))
    assert live.stager.tokens == []


def test_an_unknown_staging_is_refused() -> None:
    run, _ = chain(1)
    live = live_at(run, 0)
    ghost = Staged("nope", 0, 0, "", Digest.from_hex(run.manifest(0).weights_digest), 0, 0)
    with pytest.raises(StoreError, match="no version is staged"):
        live.stage_version(ghost, run.manifest(1), data(run, run.manifest(1)))
    with pytest.raises(StoreError, match="no version is staged"):
        live.commit_staged(ghost)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.floats(1e-5, 3e-2), min_size=1, max_size=3), st.integers(0, 2**16))
def test_staged_versions_round_trip_bit_exact(lrs: list[float], seed: int) -> None:
    run = aurora_store.open_run(f"memory://aurora-tests/{uuid.uuid4().hex}/run", full_every=100, segment_bytes=1024)
    hist = [state_dict(seed=seed % 7, scale=2)]
    for i, lr in enumerate(lrs):
        hist.append(step(hist[-1], seed + i, lr=lr))
    for sd in hist:
        run.publish(sd, kind="delta" if run.versions() else "full")
    up = Updater(run, region="eu", live=TensorWeights())
    up.bootstrap(0)
    for v in range(1, len(hist)):
        staged = up.stage(v)
        assert isinstance(staged, Staged)
        up.apply()
        assert bits_equal(up.weights, hist[v])


# ---------------------------------------------------------------- the same decode inside vLLM workers


def wired(ranks: list[dict[str, torch.Tensor]], sent: list[int]) -> Any:
    """A runner that packs every payload as the vLLM engine does, and counts what it hands in."""
    local = LocalRunner(ranks)

    def run(op: str, args: tuple[Any, ...]) -> list[Any]:
        packed = pack(args)
        sent.append(sum(len(a) for a in _bytes_in(packed)))
        return list(unpack([pack(OPS[op](r, p, local.stash[r], *unpack(packed))) for r, p in enumerate(local.ranks)]))

    return run


def _bytes_in(obj: Any) -> list[bytes]:
    if isinstance(obj, bytes):
        return [obj]
    if isinstance(obj, list):
        return [b for x in obj for b in _bytes_in(x)]
    if isinstance(obj, dict):
        return [b for x in obj.values() for b in _bytes_in(x)]
    return []


def test_a_vllm_worker_decodes_a_version_from_its_bytes_alone() -> None:
    run = aurora_store.open_run(f"memory://aurora-tests/{uuid.uuid4().hex}/run", full_every=100, segment_bytes=4096)
    hist = [hf()]
    for i in range(3):
        hist.append(hf_step(hist[-1], i, lr=1e-3))
    for v, sd in enumerate(hist):
        run.publish(sd, kind="delta" if v else "full")
    ranks = garbage_like(fuse(hist[0], 1))
    sent: list[int] = []
    live = VllmWeights(GEOM, runner=wired(ranks, sent), tp_size=1)
    up = Updater(run, region="eu", live=live)
    up.bootstrap(0)
    for v in (1, 3):
        sent.clear()
        staged = up.stage(v)
        assert isinstance(staged, Staged)
        delta = sum(run.manifest(u).stats.bytes for u in range(up.applied.version + 1, v + 1))  # type: ignore[union-attr]
        manifests = sum(len(run.manifest(u).to_bytes()) for u in range(up.applied.version + 1, v + 1))  # type: ignore[union-attr]
        assert sum(sent) == delta + manifests, "the version's bytes and manifest cross, nothing else"
        assert same(ranks, fuse(hist[v - 1 if v == 1 else 1], 1))
        up.apply()
        assert same(ranks, fuse(hist[v], 1)) and up.live_digest() == run.manifest(v).weights_digest


def test_a_rank_that_cannot_decode_answers_with_the_error_and_every_rank_drops_the_staging() -> None:
    run = aurora_store.open_run(f"memory://aurora-tests/{uuid.uuid4().hex}/run", full_every=100, segment_bytes=4096)
    hist = [hf(), hf_step(hf(), 0, lr=1e-3)]
    for v, sd in enumerate(hist):
        run.publish(sd, kind="delta" if v else "full")
    ranks = garbage_like(fuse(hist[0], 1))
    live = VllmWeights(GEOM, ranks=ranks)
    up = Updater(run, region="eu", live=live)
    up.bootstrap(0)
    m = run.manifest(1)
    bad = [bytearray(d) for d in run.reader.fetch_all(m)]
    bad[0][len(bad[0]) // 2] ^= 0xFF
    assert up.applied is not None
    with pytest.raises(CorruptError, match="rank 0"):
        live.stage_version(Base(0, up.applied.version_hash, up.applied.weights_digest), m, [memoryview(b) for b in bad])
    runner = live.runner
    assert isinstance(runner, LocalRunner) and runner.ranks[0].hf is not None
    assert runner.ranks[0].hf.stager.tokens == []
    assert same(ranks, fuse(hist[0], 1))
    got = live._run("vstage", "t", [0, "x", "y"], b"{not json", [])
    assert got[0]["error"][0] == "CorruptError", "a manifest a rank cannot parse is an answer, not a crash"
    assert live.digest() == run.manifest(0).weights_digest


def test_verify_live_reads_back_the_positions_a_delta_wrote_and_the_whole_after_a_load() -> None:
    run, _ = chain(2)
    up = Updater(run, region="eu", live=TensorWeights())
    up.bootstrap(0)
    assert up.verify() == (run.manifest(0).weights_digest, "whole")
    for v in (1, 2):
        up.stage(v)
        up.apply()
        assert up.verify() == (run.manifest(v).weights_digest, "written")
    live = up.live
    assert isinstance(live, TensorWeights)
    last = live.stager._last
    assert last is not None
    name, (idx, _) = next((n, c) for n, c in last[0].changes.items() if c[0].size)
    flat = live.flat(name)
    flat[int(idx[0])] = flat[int(idx[0])] ^ 1  # a write that did not land as staged
    got, how = up.verify()
    assert how == "written" and got != run.manifest(2).weights_digest
    assert up.live_digest() == got, "the read-back digest is the whole weights' digest, at O(changed)"


def test_a_failed_stage_after_a_commit_leaves_the_read_back_of_that_commit() -> None:
    run, _ = chain(3)
    up = Updater(run, region="eu", live=TensorWeights())
    up.bootstrap(0)
    up.stage(1)
    up.apply()
    m = run.manifest(2)
    bad = [bytearray(d) for d in run.reader.fetch_all(m)]
    bad[0][len(bad[0]) // 2] ^= 0x5A
    with pytest.raises(CorruptError):
        up.live.stage_version(applied(run, 1), m, [memoryview(b) for b in bad])
    assert up.verify() == (run.manifest(1).weights_digest, "written")


def test_a_vllm_worker_reads_back_what_it_wrote() -> None:
    run = aurora_store.open_run(f"memory://aurora-tests/{uuid.uuid4().hex}/run", full_every=100, segment_bytes=4096)
    hist = [hf(), hf_step(hf(), 0, lr=1e-3)]
    for v, sd in enumerate(hist):
        run.publish(sd, kind="delta" if v else "full")
    sent: list[int] = []
    live = VllmWeights(GEOM, runner=wired(garbage_like(fuse(hist[0], 1)), sent), tp_size=1)
    up = Updater(run, region="eu", live=live)
    up.bootstrap(0)
    up.stage(1)
    up.apply()
    sent.clear()
    assert up.verify() == (run.manifest(1).weights_digest, "written")
    assert sum(sent) == 0, "nothing but the request crosses"
