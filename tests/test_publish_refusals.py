"""A publish the readers would refuse writes nothing: the writer checks what the reader checks
(step, meta, tensor names and their order), before the first byte."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid
from typing import Any

import pytest
import torch

import aurora_store
from aurora_store.bucket.audit import audit
from aurora_store.bucket.full_part import elements_part
from aurora_store.bucket.parts import Baseline
from aurora_store.bucket.plan import Latest
from aurora_store.errors import CorruptError, StoreError
from aurora_store.format.manifest import canonical
from aurora_store.format.manifest_parser import parse_manifest
from tests.helpers import bits_equal


def _run() -> Any:
    return aurora_store.open_run(f"memory://refusals/{uuid.uuid4().hex}/run")


def _weights(name: str = "w") -> dict[str, torch.Tensor]:
    return {name: torch.arange(8, dtype=torch.float32).to(torch.bfloat16)}


@pytest.mark.parametrize(
    "args",
    [
        {"step": -1},
        {"step": 1.5},
        {"step": 2**70},
        {"step": True},
        {"meta": {"lr": 1}},
        {"meta": {"lr": float("nan")}},
        {"meta": {"k\ud800": "v"}},
        {"meta": {"k": "\ud800"}},
        {"meta": {"": "v"}},
        {"meta": {f"k{i}": "v" for i in range(1025)}},
        {"meta": ["not", "a", "mapping"]},
    ],
    ids=lambda a: repr(a)[:40],
)
def test_a_publish_the_readers_would_refuse_writes_nothing(args: dict[str, Any]) -> None:
    run = _run()
    with pytest.raises(StoreError):
        run.publish(_weights(), **args)
    assert run.store.list_keys("") == [], "refused before the first byte is written"
    run.publish(_weights(), step=0, meta={"lr": "1e-6"})  # the run goes on
    assert run.versions() == [0] and run.manifest(0).meta == {"lr": "1e-6"}


@pytest.mark.parametrize("name", ["__metadata__", "w\ud800", ""])
def test_a_tensor_name_the_readers_would_refuse_writes_nothing(name: str) -> None:
    run = _run()
    with pytest.raises(StoreError):
        run.publish(_weights(name))
    assert run.store.list_keys("") == []


@pytest.mark.parametrize(
    "change",
    [{"meta": {"k": "\ud800"}}, {"meta": {"\ud800": "v"}}, {"step": -1}],
    ids=["surrogate-value", "surrogate-key", "negative-step"],
)
def test_the_parser_refuses_by_the_same_rules(change: dict[str, Any]) -> None:
    run = _run()
    run.publish(_weights())
    m = dataclasses.replace(run.manifest(0), **change)
    data = dataclasses.replace(m, version_hash=m.compute_hash()).to_bytes()
    with pytest.raises(CorruptError):
        parse_manifest(data, expect_version=0)


def test_an_unsorted_tensor_table_is_refused_before_the_first_byte() -> None:
    import numpy as np

    from aurora_store.format.manifest import TensorSpec

    run = _run()
    specs = (TensorSpec("b", "BF16", (2,)), TensorSpec("a", "BF16", (2,)))
    with pytest.raises(StoreError, match="unique and sorted"):
        run.publish_words(specs, {s.name: np.zeros(2, dtype="<u2") for s in specs})
    assert run.store.list_keys("") == []


def _many_tiny(n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f"model.layers.{i:05d}.w": torch.randn(4, generator=g).to(torch.bfloat16) for i in range(n)}


def test_a_manifest_over_the_cap_is_refused_before_the_first_byte(tmp_path: Any) -> None:
    """Hole (issue 22): the manifest cap was checked at commit, after every shard of the version was
    uploaded. Its size is known from the plan (tensor table, shards, files): a version whose
    manifest cannot fit fails at once, and the bucket holds nothing new."""
    from aurora_store.bucket.limits import Limits
    from aurora_store.errors import LimitError

    weights = _many_tiny(2000)  # ~2,000 table entries: ~130 KB of manifest
    uri = (tmp_path / "run").as_uri()
    run = aurora_store.open_run(uri, shard_bytes=4096, limits=Limits(max_manifest_bytes=64 << 10))
    with pytest.raises(LimitError, match=r"version 0: its manifest would be at least \d+ bytes, over the cap of 65536"):
        run.publish(weights)
    assert run.store.list_keys("") == [], "refused before the first byte is written"

    small = aurora_store.open_run(uri, shard_bytes=4096, limits=Limits(max_manifest_bytes=64 << 10))
    small.publish(_many_tiny(50))  # a table that fits; then a delta whose meta does not
    before = sorted(small.store.list_keys(""))
    meta = {f"note{i:04d}": "x" * 100 for i in range(1000)}
    for kind in ("delta", "auto"):
        with pytest.raises(LimitError, match="version 1: its manifest would be at least"):
            small.publish(_many_tiny(50, seed=1), kind=kind, meta=meta)
        assert sorted(small.store.list_keys("")) == before, f"no {kind} segment was written either"
    small.publish(_many_tiny(50, seed=1), kind="delta", meta={"note": "x"})  # the run goes on
    assert small.versions() == [0, 1]


def test_an_auto_delta_whose_manifest_would_not_fit_is_published_full(tmp_path: Any) -> None:
    """A delta's blocks are known once it is encoded: an ``auto`` delta held until then (the first of a
    publisher) whose manifest would be over the cap is published full instead, none of its segments
    written; the run stays readable under the cap."""
    from aurora_store.bucket.limits import Limits

    g = torch.Generator().manual_seed(0)
    w = {f"t{i}": torch.randn(65536, generator=g).to(torch.bfloat16) for i in range(4)}
    uri = (tmp_path / "run").as_uri()
    run = aurora_store.open_run(uri, segment_bytes=512, limits=Limits(max_manifest_bytes=2048))
    assert run.publish(w).kind == "full"  # a manifest of ~1 KB
    for t in w.values():  # ~1% changed: a delta of ~7 KB in ~14 segments of 512 bytes: ~3.4 KB of manifest
        idx = torch.randperm(t.numel(), generator=g)[:600]
        t.view(-1)[idx] = (t.view(-1)[idx].float() + 0.5).to(torch.bfloat16)
    info = run.publish(w)
    assert info.kind == "full", "not a delta its readers would refuse"
    assert not [k for k in run.store.list_keys("versions/0000000001") if k.endswith(".seg")], "no segment written"
    assert bits_equal(aurora_store.open_run(uri, limits=Limits(max_manifest_bytes=2048)).materialize(1), w)


@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_a_restarted_publisher_whose_parent_chain_is_damaged_publishes_full(tmp_path: Any, damage: str) -> None:
    """A publisher without a baseline (a restarted trainer) loads the parent's bits to diff against;
    when an object of that chain was damaged by someone else, it publishes a full version (which
    needs no parent bits) instead of dying, and a forced delta says why it cannot."""
    uri = (tmp_path / "run").as_uri()
    run = aurora_store.open_run(uri)
    w = _weights()
    run.publish(w)
    w["w"][0] += 1
    assert run.publish(w, kind="delta").kind == "delta"
    seg = next(p for p in (tmp_path / "run" / "versions" / "0000000001").iterdir() if p.suffix == ".seg")
    if damage == "truncate":
        seg.write_bytes(seg.read_bytes()[:-3])
    else:
        seg.unlink()
    w["w"][1] += 1
    with pytest.raises(CorruptError, match="publish a full version"):
        aurora_store.open_run(uri).publish(w, kind="delta")
    restarted = aurora_store.open_run(uri)
    info = restarted.publish(w)
    assert info.version == 2 and info.kind == "full"
    assert bits_equal(restarted.materialize(2), w)


def _damage_segment(root: Any, version: int) -> tuple[Any, bytes]:
    """Truncate one delta segment of ``version`` in a local run: (its path, its true bytes)."""
    seg = next(p for p in (root / "versions" / f"{version:010d}").iterdir() if p.suffix == ".seg")
    good = seg.read_bytes()
    seg.write_bytes(good[:-3])
    return seg, good


def _published_over_a_damaged_parent(tmp_path: Any) -> tuple[str, Any, tuple[Any, bytes]]:
    """Versions 0 (full) and 1 (delta), then version 1's segment truncated and version 2 published by a
    restarted publisher (no baseline, the parent unreadable): the run's URI, version 2's info, and the
    damaged segment with its true bytes."""
    uri = (tmp_path / "run").as_uri()
    run = aurora_store.open_run(uri)
    w = _weights()
    run.publish(w)
    w["w"][0] += 1
    run.publish(w, kind="delta")
    damaged = _damage_segment(tmp_path / "run", 1)
    w["w"][1] += 1
    return uri, aurora_store.open_run(uri).publish(w), damaged


def test_a_full_version_published_without_its_parents_bits_audits_clean_once_the_parent_is_repaired(
    tmp_path: Any,
) -> None:
    """Issue 39: a restarted publisher that cannot read its parent (an object of it damaged, or a
    read that failed on the way) publishes a full version. It cannot count what changed against bits
    it does not have, so its manifest says the count is unknown (format aurora/5), and audit checks
    what the manifest declares: once the parent is repaired, the run audits clean, and ``ls`` says
    that the count is unknown rather than showing every element as changed."""
    uri, info, (seg, good) = _published_over_a_damaged_parent(tmp_path)
    assert info.kind == "full"
    seg.write_bytes(good)  # repaired (or the read fault was on the way only)
    reopened = aurora_store.open_run(uri)
    m = reopened.manifest(2)
    assert m.format == "aurora/5" and m.stats.counted is False and m.stats.changed == m.stats.elements
    assert reopened.manifest(1).format != "aurora/5", "a counted version keeps the older format"
    result = audit(reopened)
    assert result.ok, result.first
    rows = [r.to_dict() for r in result.versions]
    assert rows[2]["counted"] is False and rows[1]["counted"] is True


def test_a_full_version_is_never_counted_against_a_baseline_of_another_version() -> None:
    """What a full version counts against: the parent's very bits, or nothing. A baseline of another
    version with the same tensor table (one left over from before a rollback or a commit elsewhere)
    is not the parent: the count is unknown then, not taken against the wrong version."""
    run = _run()
    w = _weights()
    for i in range(3):
        w["w"][i] += 1
        run.publish(w)
    lineage = run.reader.lineage()
    versions = [Latest.of(run.manifest(v), lineage) for v in range(3)]
    ranges = {"w": (0, 8)}
    words = {"w": run.reader.materialize(2).words["w"]}
    old = Baseline(versions[1], dict(ranges), {"w": run.reader.materialize(1).words["w"]})
    specs = versions[2].specs
    assert elements_part(specs, ranges, words, old, versions[2])[::2] == (8, False)
    same = Baseline(versions[2], dict(ranges), {"w": words["w"].copy()})
    assert elements_part(specs, ranges, words, same, versions[2])[::2] == (0, True)
    assert elements_part(specs, ranges, words, None, None)[::2] == (8, False), "compared with nothing"
    first = run.manifest(0)  # published with nothing to compare with: the plan knows a new chain's count
    assert first.stats.counted and first.stats.changed == first.stats.elements, "a new chain counts every element"


def test_a_full_version_with_its_parents_bits_counts_against_them(tmp_path: Any) -> None:
    """The usual case keeps its count: a full version published with the parent's bits held says how
    many elements differ from the parent, in the older format, and audit checks that count."""
    run = aurora_store.open_run((tmp_path / "run").as_uri())
    w = _weights()
    run.publish(w)
    w["w"][:3] += 1
    info = run.publish(w, kind="full")
    m = run.manifest(1)
    assert info.changed == 3 and m.stats.counted is True and m.format != "aurora/5"
    assert audit(run).ok


def _rehashed(doc: dict[str, Any]) -> bytes:
    """``doc`` with a version hash that matches it: only the rule under test can refuse it."""
    body = {k: v for k, v in doc.items() if k not in ("version_hash", "signature", "rotation_signature")}
    return json.dumps({**doc, "version_hash": hashlib.sha256(canonical(body)).hexdigest()}).encode()


@pytest.mark.parametrize(
    ("version", "change"),
    [
        (2, {"counted": True}),
        (2, {"counted": 0}),
        (2, {"counted": None}),
        (2, {"changed": 1}),
        (2, {"format": "aurora/4"}),
        (1, {"counted": False, "format": "aurora/5"}),
        (0, {"counted": False, "format": "aurora/5"}),
    ],
    ids=["true", "zero", "null", "changed-not-elements", "in-aurora/4", "in-a-delta", "in-version-0"],
)
def test_the_uncounted_field_is_checked_by_the_parser(tmp_path: Any, version: int, change: dict[str, Any]) -> None:
    """``stats.counted`` (aurora/5) has one spelling, false, only in a full version with a parent,
    with ``changed`` equal to ``elements``; the parser refuses anything else with a CorruptError."""
    _published_over_a_damaged_parent(tmp_path)
    doc = json.loads((tmp_path / "run" / "versions" / f"{version:010d}" / "manifest.json").read_bytes())
    parse_manifest(_rehashed(doc), expect_version=version)  # as written: accepted
    fmt = change.pop("format", None)
    doc = {**doc, "stats": {**doc["stats"], **change}} | ({"format": fmt} if fmt else {})
    with pytest.raises(CorruptError):
        parse_manifest(_rehashed(doc), expect_version=version)
