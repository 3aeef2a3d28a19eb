"""Serving the jobs an actor claimed: each job's prompt checked against the model, the jobs of one
version generated as one batch on exactly that version, each group scored by the run's reward and
submitted (:class:`actor.outbox.Outbox`); a job that cannot be served (a prompt another process
wrote wrong, a version the weights moved past or cannot reach, a reward process that died because
the actor is stopping) is given back, so the trainer leases it again.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections import defaultdict
from collections.abc import Sequence

from actor.config import RolloutConfig
from actor.engines.base import Completion, Engine
from actor.follower import Follower
from actor.metrics import ActorMetrics
from actor.outbox import Outbox
from actor.renewals import Renewer
from actor.rewards import RewardPool
from actor.updater import Applied, Updater
from aurora_store.coord.lease import Lease
from aurora_store.coord.throughput import Throughputs
from aurora_store.errors import AuroraError
from aurora_store.format import results as payloads
from aurora_store.rl.sampling import SamplingConfig
from aurora_store.rl.tasks import Prompt, TaskError
from aurora_store.rl.tokenizers import Tokenizer

log = logging.getLogger("aurora.actor")
CALIBRATION_PROMPT = "Count from one to twenty, one number a line."


class Batches:
    """An actor's serving of its leases, on its engine and the weights its follower keeps current.
    ``vocab`` is the model's vocabulary size, which every prompt's ids must stay below."""

    def __init__(
        self,
        worker_id: str,
        *,
        engine: Engine,
        tok: Tokenizer,
        vocab: int,
        sampling: SamplingConfig,
        rewards: RewardPool,
        follower: Follower,
        outbox: Outbox,
        renewer: Renewer,
        throughputs: Throughputs,
        metrics: ActorMetrics,
        rollout: RolloutConfig,
        stop: threading.Event,
    ) -> None:
        self.wid = worker_id
        self.engine, self.tok, self.vocab, self.sampling, self.rewards = engine, tok, vocab, sampling, rewards
        self.follower, self.outbox, self.renewer = follower, outbox, renewer
        self.throughputs, self.metrics, self.rollout, self.stop = throughputs, metrics, rollout, stop

    @property
    def up(self) -> Updater:
        return self.follower.up

    def serve(self, leases: list[Lease]) -> None:
        """Serve ``leases``, oldest version first: each version's jobs once the weights hold it (waiting
        for it while their leases last), given back if they never will."""
        by_version: dict[int, list[tuple[Lease, Prompt]]] = defaultdict(list)
        for lease in leases:
            try:
                by_version[lease.version].append((lease, self._prompt(lease)))
            except TaskError as exc:  # another process wrote the job: give it back, never die of it
                log.warning("actor %s: job %s: %s", self.wid, lease.job, exc)
                self.give_back(lease)
        for version in sorted(by_version):
            batch = by_version[version]
            assert self.up.applied is not None
            if version < self.up.applied.version:  # the weights moved past it: let the trainer lease it again
                for lease, _ in batch:
                    self.give_back(lease)
                continue
            wait_s = max(0.0, min(lease.deadline_ms for lease, _ in batch) / 1000 - time.time())
            try:
                ready = self.follower.advance_to(version, wait_s=wait_s)
            except AuroraError as exc:
                log.warning("actor %s: cannot reach version %d: %s", self.wid, version, exc)
                ready = False
            if not ready:
                for lease, _ in batch:
                    self.give_back(lease)
                continue
            self._generate(batch)

    def calibrate(self) -> None:
        """One batch on a fixed prompt, so the first split already knows this actor's speed."""
        prompt = self.tok.prompt_ids(CALIBRATION_PROMPT)
        t0 = time.perf_counter()
        outs = self._sample([prompt] * self.rollout.batch, seed=0)
        self._emulate_slowdown(time.perf_counter() - t0)
        tokens = sum(len(c.token_ids) for comps in outs for c in comps)
        tau = self.throughputs.report(self.wid, tokens, time.perf_counter() - t0, beta=self.rollout.beta)
        self.metrics.calibrated(tau)

    def abandon(self, leases: list[Lease]) -> None:
        """Redis failed under a batch (a submit, a renewal): the leases of it still held, whose results were
        not submitted, are given back if Redis answers, else no longer renewed (they expire, and the trainer
        leases them again) and owed (an actor that leaves names them). Renewed on, they would never come
        back: the batch is over."""
        held = set(self.renewer.held)
        for lease in leases:
            if lease.job in held:  # one Redis cannot be told of is owed: named (and tried again) when leaving
                self.renewer.give_back(lease, owe=True)

    def give_back(self, lease: Lease) -> None:
        """Hand a lease back to the trainer (it leases the job again); while stopping, one Redis cannot
        be told of is owed, for the leaving actor to name."""
        self.renewer.give_back(lease, owe=self.stop.is_set())

    def _prompt(self, lease: Lease) -> Prompt:
        """The job's prompt, its ids checked against the model (the trainer tokenized it; an older
        trainer's jobs carry text only, tokenized here)."""
        prompt = Prompt.from_dict(lease.prompt)
        if not prompt.ids:
            return Prompt(prompt.id, prompt.text, prompt.answer, tuple(self.tok.prompt_ids(prompt.text)))
        if max(prompt.ids) >= self.vocab:
            raise TaskError(f"prompt {prompt.id!r} holds token id {max(prompt.ids)}, the model has {self.vocab}")
        return prompt

    def _sample(self, prompts: list[list[int]], seed: int) -> list[list[Completion]]:
        s = self.sampling
        return self.engine.generate(
            prompts,
            samples=s.group,
            max_new_tokens=s.max_new_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            seed=seed,
        )

    def _emulate_slowdown(self, elapsed: float) -> None:
        if self.rollout.slowdown > 1:  # emulated slower hardware: documented, not hidden
            time.sleep(elapsed * (self.rollout.slowdown - 1))

    def _generate(self, batch: list[tuple[Lease, Prompt]]) -> None:
        applied = self.up.applied
        assert applied is not None
        t0 = time.perf_counter()
        with self.up.lock.read():  # a batch runs on one whole version
            outs = self._sample(
                [list(p.ids) for _, p in batch], seed=zlib.crc32(f"{self.wid}|{batch[0][0].job}".encode())
            )
        self._emulate_slowdown(time.perf_counter() - t0)
        tokens = self.submit_all(batch, outs, applied)
        if tokens is not None:
            tau = self.throughputs.report(self.wid, tokens, time.perf_counter() - t0, beta=self.rollout.beta)
            self.metrics.batch(results=len(batch), tokens=tokens, tau=tau)

    def submit_all(
        self, batch: Sequence[tuple[Lease, Prompt]], outs: list[list[Completion]], applied: Applied
    ) -> int | None:
        """Score and submit each job's completions; the tokens submitted, or None when the actor stopped
        while they were scored: the jobs not submitted are given back (the trainer leases them again)."""
        tokens = 0
        for i, ((lease, prompt), comps) in enumerate(zip(batch, outs, strict=True)):
            if not self._submit(lease, prompt, comps, applied):
                log.warning(
                    "actor %s: stopping while its rewards were scored; giving back %d leases", self.wid, len(batch) - i
                )
                for unscored, _ in batch[i:]:
                    self.give_back(unscored)
                return None
            tokens += sum(len(c.token_ids) for c in comps)
        return tokens

    def _submit(self, lease: Lease, prompt: Prompt, comps: list[Completion], applied: Applied) -> bool:
        """Score one job's completions and submit the result; False, submitting nothing, when the
        reward process died because the actor is stopping (a crashed reward is no reward)."""
        scored = self.rewards.score_group(prompt.text, [self.tok.decode(c.token_ids) for c in comps], prompt.answer)
        if scored is None:
            return False
        values, failures = scored
        rows = [(c.token_ids, c.logprobs, c.finish_reason, r) for c, r in zip(comps, values, strict=True)]
        # weights_digest: verified when these weights were applied
        data = payloads.encode(rows, failures=failures, weights_digest=applied.weights_digest)
        self.outbox.submit(lease, applied.version, applied.version_hash, data)
        self.renewer.done(lease)  # renewed until now: the trainer has a whole lease to admit it
        return True
