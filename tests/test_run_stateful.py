"""A Hypothesis state machine over one run on a real local bucket: publishes of every kind, layout
changes, materializing, reopening, a publisher that dies between its uploads and its commit, and a
second publisher that commits first. After every step the artifact contract must hold: versions
consecutive from 0, version 0 full, every named object present and verified, the chain linked, and
every version materializing to exactly the bits that were published."""

from __future__ import annotations

import shutil
import tempfile

import numpy as np
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import aurora_store
from aurora_store import ConflictError, LayoutError
from aurora_store.bucket.audit import audit
from aurora_store.bucket.delta_part import encode_delta
from aurora_store.bucket.parts import Baseline, Uploads, whole
from aurora_store.bucket.run import Run
from aurora_store.tensors import to_words
from tests.helpers import bits_equal, state_dict, step


def _changed(sd: dict[str, torch.Tensor], seed: int, lr: float) -> dict[str, torch.Tensor]:
    return step(sd, seed, lr=lr)


class RunMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="aurora-stateful-")
        self.uri = f"file://{self.dir}/run"
        self.run = self._open()
        self.published: list[dict[str, torch.Tensor]] = []
        """What each committed version must materialize to."""
        self.seed = 0

    def _open(self) -> Run:
        return aurora_store.open_run(self.uri, full_every=4, segment_bytes=512, shard_bytes=4096)

    def _next(self, lr: float) -> dict[str, torch.Tensor]:
        self.seed += 1
        return _changed(self.published[-1], self.seed, lr)

    @initialize()
    def version_zero(self) -> None:
        sd = state_dict()
        info = self.run.publish(sd, step=0)
        assert (info.version, info.kind) == (0, "full")
        self.published.append(sd)

    @rule(kind=st.sampled_from(["auto", "delta", "full"]), lr=st.sampled_from([1e-5, 3e-4, 1e-1]))
    def publish(self, kind: str, lr: float) -> None:
        sd = self._next(lr)
        info = self.run.publish(sd, kind=kind)  # type: ignore[arg-type]
        assert info.version == len(self.published)
        if kind != "auto":
            assert info.kind == kind
        self.published.append(sd)

    @rule()
    def change_the_layout(self) -> None:
        sd = {**self._next(1e-3), f"extra.{self.seed}": torch.full((3,), float(self.seed))}
        try:
            self.run.publish(sd, kind="delta")
            raise AssertionError("a delta cannot change the tensor table")
        except LayoutError:
            pass
        assert self.run.publish(sd, kind="full").kind == "full"
        self.published.append(sd)

    @rule(version=st.integers(0, 1000))
    def materialize(self, version: int) -> None:
        v = version % len(self.published)
        assert bits_equal(self.run.materialize(v), self.published[v])

    @rule()
    def reopen(self) -> None:
        self.run.close()
        self.run = self._open()

    @rule(lr=st.sampled_from([1e-5, 3e-4]))
    def crash_between_uploads_and_commit(self, lr: float) -> None:
        """A publisher uploads every segment of the next version, then dies before its manifest."""
        crashed = self._open()
        specs, words = to_words(self._next(lr))
        latest = crashed.publisher.planner.latest()
        if latest is None or latest.specs != specs:
            return  # the last version changed the layout: no delta to crash in
        plan = crashed.publisher.planner.plan(specs, kind="delta")
        assert plan.parent == latest
        state = crashed.materialize_words(plan.parent.version)
        base = Baseline(plan.parent, whole(specs), state.words)
        uploads = Uploads(crashed.store, plan.version)
        encode_delta(plan, base, words, uploads, segment_bytes=512)
        uploads.wait()
        crashed.close()  # and no commit: the segments belong to no manifest

    @rule(lr=st.sampled_from([1e-5, 3e-4]))
    def another_publisher_commits_first(self, lr: float) -> None:
        other = self._open()
        sd = self._next(lr)
        assert other.publish(sd).version == len(self.published)
        self.published.append(sd)
        other.close()
        mine = self._next(lr)
        try:
            self.run.publish(mine)  # held no baseline (just reopened): planned on top of the other one
        except ConflictError as exc:  # held the version before: it lost the race
            assert "committed by another publisher" in str(exc)
            assert self.run.publish(mine).version == len(self.published), "the next publish continues on top"
        self.published.append(mine)

    @invariant()
    def the_artifact_contract_holds(self) -> None:
        fresh = self._open()
        versions = fresh.versions()
        assert versions == list(range(len(self.published)))
        assert fresh.manifest(0).kind == "full"
        chain = fresh.reader.chain(versions[-1])
        assert chain[0].kind == "full" and [m.version for m in chain] == list(range(chain[0].version, versions[-1] + 1))
        latest = fresh.materialize_words(versions[-1])
        _, want = to_words(self.published[-1])
        assert latest.specs == to_words(self.published[-1])[0]
        assert all(np.array_equal(latest.words[k], w) for k, w in want.items())
        fresh.close()

    def teardown(self) -> None:
        try:
            result = audit(self._open())
            assert result.ok, result.first_error
            assert [r.version for r in result.versions] == list(range(len(self.published)))
        finally:
            self.run.close()
            shutil.rmtree(self.dir, ignore_errors=True)


TestRunMachine = RunMachine.TestCase
TestRunMachine.settings = settings(max_examples=20, stateful_step_count=10, deadline=None)
