"""The GRPO trainer: start or resume, publish, post leased jobs, admit results, train, repeat.

One-step asynchrony: the jobs of step t+2 are posted (tagged with version t) as soon as
version t is published, so actors generate them while step t+1 trains on rollouts of
version t-1. Prompts come from a data set (:class:`~aurora_store.rl.data.PromptPool`, in an
order fixed by the seed) or a built-in task; a step's prompts are a function of the step, so a
restarted trainer continues exactly where its steps stopped. Jobs, leases and admission are
:class:`~trainer.dispatch.Dispatcher`'s; the policy and what the run records of it,
:mod:`trainer.policy`'s; one optimizer step, :mod:`trainer.step`'s.
"""

from __future__ import annotations

import logging
import math
import random
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.bucket.plan import VersionInfo
from aurora_store.bucket.run import Run, open_run
from aurora_store.coord.coordinator import Coordinator, RegionAnnouncer
from aurora_store.coord.errors import CoordinationError
from aurora_store.coord.jobs import JobBoard
from aurora_store.coord.lease import now_ms
from aurora_store.errors import (
    DAMAGE,
    ConfigError,
    CorruptError,
    KeyHistoryError,
    MissingError,
    StoreError,
    UnauthenticatedError,
    UnreachableError,
)
from aurora_store.format.keys import manifest_key
from aurora_store.format.manifest import Rollback
from aurora_store.rl.data import DataError, PromptPool, read_records
from aurora_store.rl.errors import ModelError
from aurora_store.rl.tasks import PromptSource, TaskPrompts, load_task
from trainer import policy as policies
from trainer.config import TrainerConfig
from trainer.dispatch import Admitted, Dispatcher
from trainer.distributed import Dist
from trainer.grpo import GRPOConfig, Sample, advantages, sft_loss
from trainer.identity import ResultGate
from trainer.lag import summarize, version_lags
from trainer.metrics import TrainerMetrics
from trainer.publication import ModelPublisher, artefact_for
from trainer.rollout_policy import RolloutPolicy
from trainer.state import StateWriter, resume_state
from trainer.step import StepStats, optimizer_step

log = logging.getLogger("aurora.trainer")

BUCKET_WAIT_S = 600.0
"""How long a starting trainer waits for a bucket whose endpoint does not answer (a storage outage, a
network cut) before it exits; a bucket that answers with an error (bad credentials, no such bucket, a
damaged latest version) stops it at once."""


@dataclass(slots=True)
class StepReport:
    step: int
    version: int
    reward_mean: float
    delta_bytes: int
    full_bytes: int
    density: float
    publish_s: float
    train_s: float
    wait_s: float
    published_ms: int
    """When the trainer had published the version: its manifest follows once its state is saved, so
    the time from here until actors apply it includes that wait."""
    admitted: int
    shares: dict[str, int]
    dropped: dict[str, int]
    stolen: int
    kind: str = "delta"
    """The published version's kind."""
    stats: dict[str, float] = field(default_factory=dict)
    """The optimizer step's :class:`~trainer.step.StepStats` (KL, entropy, clip fraction, lengths, ...)."""
    reward_failures: dict[str, int] = field(default_factory=dict)
    """Reward calls that failed on the actors so far (scored 0), by kind."""
    skipped_prompts: int = 0
    """Prompts of the data set dropped at load for being too long."""
    reward_stderr: float = 0.0
    """The standard error of the step's mean reward (over its completions)."""
    changed: int = 0
    """Elements the published version changed (a delta's; 0 for a full)."""
    rolls_back_to: dict[str, Any] | None = None
    """Set when the version continues from an older state than its parent's: ``{version, abandons}``."""
    state_s: float = 0.0
    """Seconds the training thread spent on saving trainer states during the step (capturing one and
    waiting for the writer's copy before the update); the writing itself overlaps the next step."""
    version_lag: dict[str, int] = field(default_factory=dict)
    """The step's admitted results' version lag (:mod:`trainer.lag`): ``p50``, ``p99``, ``max``, ``results``."""


def _stderr(xs: list[float]) -> float:
    """The standard error of the mean of ``xs`` (0 for fewer than two)."""
    if len(xs) < 2:
        return 0.0
    return statistics.stdev(xs) / math.sqrt(len(xs))


class Trainer:
    def __init__(
        self,
        cfg: TrainerConfig,
        *,
        on_step: Callable[[StepReport], None] | None = None,
        on_phase: Callable[[str, int, int], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.coord = Coordinator(cfg.redis, cfg.run_id)
        self.board = JobBoard(self.coord)
        self.run: Run = open_run(
            cfg.store,
            storage_options=cfg.storage_options,
            full_every=cfg.publish.full_every,
            codec=cfg.publish.codec,
            signing_key=cfg.publish.signing_key,
        )
        if cfg.publish.rotate_signing_key is not None:  # the first version published is the rotation
            self.run.signing.rotate_to(cfg.publish.rotate_signing_key)
        self.run.announcer = RegionAnnouncer(self.coord, cfg.region)
        self.metrics = TrainerMetrics(cfg.region)
        """This trainer's Prometheus metrics (served by ``aurora train --metrics-port``)."""
        self.metrics.watch(self.coord)
        self.run.store.meter = self.metrics.m.meter(cfg.region)
        self.run.publisher.on_refused = self.metrics.m.rejected  # a parent's chain that fails verification
        self.on_step = on_step
        self.on_phase = on_phase
        """Told ``(what, done, total)`` as the work before the first RL step goes on (the warm start)."""
        self.grpo = GRPOConfig(
            clip=cfg.optim.clip,
            kl_coef=cfg.optim.kl_coef,
            temperature=cfg.sampling.temperature,
            norm=cfg.optim.loss_norm,
            correction=cfg.optim.rollout_correction,
            correction_cap=cfg.optim.rollout_correction_cap,
        )
        self.dist = Dist()
        self.device = policies.device_for(cfg, policies.local_rank())
        self.reference: torch.nn.Module | None = None
        self.rollout: RolloutPolicy | None = None
        """The weights of the rollouts' version, with a rollout correction on."""
        self.weights_version = 0
        """The version whose weights the policy holds (after a resume, the saved state's)."""
        self.rollback: Rollback | None = None
        """Set after a resume from an older state than the latest version's, for the next version to record."""
        self.origin: str | None = None
        """The run's origin (version 0's hash), which every saved state is bound to."""
        self.states = StateWriter(self.run, write=self.dist.main)
        """Saves the state of committed versions off the training thread."""
        self.metrics.watch_states(self.states.cost)
        self.rng = random.Random(cfg.seed)
        self.tag = uuid.uuid4().hex[:8]
        self._admissions = open(cfg.admissions_log, "a", encoding="utf-8") if cfg.admissions_log else None  # noqa: SIM115

    # ------------------------------------------------------------ start

    def start(self) -> int:
        """Build or restore the policy on every rank; returns the version it is at."""
        try:
            return self._start()
        finally:
            policy = getattr(self, "policy", None)  # not there when start failed before building it
            if policy is not None:
                policy.base = None  # a resumed LoRA run's base, read once for the frozen copies

    def _start(self) -> int:
        if self.dist.main:
            self._until_reachable(self._check_bucket)
        latest = self.dist.broadcast(self.run.latest() if self.dist.main else None)
        recorded = policies.recorded_spec(self.run) if latest is not None else None
        if latest is not None:
            policies.check_kind(self.run, recorded, self.cfg)
            self.policy = policies.resumed_policy(self.run, recorded, self.cfg)
        else:
            self.policy = policies.new_policy(self.cfg)
            if policies.lora_settings(self.cfg) is not None:
                # the built-in model's warm start is its only pretraining: it trains the base the adapter
                # then adapts, frozen (a data set's model has none: its base is the model as given)
                self._warm_start(self.policy.model.to(self.device))
                policies.adapt(self.run, self.policy, self.cfg, write=self.dist.main)
                assert self.policy.lora is not None
                first = self.dist.broadcast(self.policy.lora.base_digest)
                if first != self.policy.lora.base_digest:
                    raise ModelError(
                        f"the ranks warm-started different bases ({first} on rank 0, {self.policy.lora.base_digest} "
                        "here): the warm start is not deterministic on this device; start with --sft-steps 0"
                    )
        spec = policies.run_spec(self.cfg, self.policy)
        policies.check_resume(self.run, recorded, spec)
        self.source = self._prompt_source()
        self.dispatch = Dispatcher(
            self.coord,
            self.board,
            schedule=self.cfg.schedule,
            sampling=self.cfg.sampling,
            vocab_size=self.policy.vocab_size,
            tag=self.tag,
            admissions=self._admissions,
            stores=self._result_stores(),
            identity=ResultGate.of(self.cfg.fleet_key, self.cfg.run_id, revoked=self.cfg.revoked_actors),
            signer=lambda: self.run.signing_key,  # after a key rotation, the new key
        )
        self.dispatch.on_lost = self._announce_again
        self.metrics.watch_dispatch(self.dispatch)
        model = self.policy.model.to(self.device)
        if self.cfg.model.gradient_checkpointing:
            model.gradient_checkpointing_enable()  # type: ignore[operator]
        self.model = self.dist.shard(model)
        self.artefact = artefact_for(spec.artefact)
        self.publisher = ModelPublisher(self.run, self.model, artefact=self.artefact)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=self.cfg.optim.lr, betas=(0.9, 0.99))
        if self.grpo.correction != "none":
            copy = policies.frozen_copy(self.policy, self.device, self.run)
            # a sharded copy cannot take a state dict
            load = policies.version_loader(self.policy, self.run, copy) if self.dist.world == 1 else None
            frozen = self.dist.shard(copy)
            self.rollout = RolloutPolicy(frozen, published=self.artefact.dtype, load=load)
        if latest is not None:
            self._resume(int(latest), recorded is None, spec)
            return int(latest)
        if self.policy.lora is None:  # a LoRA run's warm start trained its base, before the adapter
            self._warm_start(self.model)
        if self.dist.main:
            policies.record(self.run, self.policy, spec)
        self.dist.barrier()
        meta = {"source": self._source_name(), "trainer": self.tag}
        defer = self.dist.world == 1  # committed once its state is saved, as every version is (see commit)
        info = self.publisher.publish(step=0, kind="full", meta=meta, defer=defer)
        log.info("trainer %s starts a new run at version 0", self.tag)
        self.dispatch.published_version(0, info.version_hash, info.weights_digest)
        self.origin = info.version_hash
        self._save_state(0, info.version_hash, then=self.publisher.commit_deferred if defer else None)
        self.states.flush()  # version 0 is committed before anything reads it (the KL reference)
        self.metrics.published(0)
        self._load_reference()
        return 0

    def _check_bucket(self) -> None:
        """What a trainer makes sure of in its bucket before it builds on it (reads, and idempotent)."""
        self.run.store.sweep_temporaries()  # what a killed predecessor left half-written
        self._check_latest()
        if self.run.latest() is not None or self.cfg.publish.rotate_signing_key is not None:
            self.run.publisher.planner.check_signer()  # the trainer's keys can sign the next version, or why not

    @staticmethod
    def _until_reachable(fn: Callable[[], None], wait_s: float = BUCKET_WAIT_S) -> None:
        """Run ``fn`` again, with backoff and each try logged, while the bucket's endpoint does not answer,
        for up to ``wait_s``: a supervisor restarting a trainer into an outage then finds it waiting, not
        dead. Any other error is raised at once."""
        deadline, pause = time.monotonic() + wait_s, 0.5
        while True:
            try:
                return fn()
            except UnreachableError as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise UnreachableError(f"{exc}; waited {wait_s:.0f} s for it to answer", url=exc.url) from None
                pause = min(pause, left)
                log.warning(
                    "the run's bucket does not answer (%s); trying again in %.1f s, for %.0f s more", exc, pause, left
                )
                time.sleep(pause)
                pause = min(2 * pause, 15.0)

    def _check_latest(self) -> None:
        """The run's latest version verifies, or the trainer stops before anything, saying how to repair
        the bucket: a trainer never builds on a version it cannot verify, and that version's name is
        taken (objects are create-only), so there is no safe way on until someone repairs it. Where the
        version before it does not verify either, the keys are what is wrong: the start goes on to say so."""
        latest = self.run.latest()
        if latest is None:
            return
        try:
            self.run.manifest(latest)
        except KeyHistoryError as exc:  # an older rotation's manifest: nothing after it verifies
            raise KeyHistoryError(
                f"{exc}. No version signed after it verifies from this bucket, so a trainer cannot go on. If "
                f"that version was committed, copy its verified manifest from a region that holds it (`aurora "
                f"audit REGION_URI` says which do) over {exc.url}; then start the trainer again",
                url=exc.url,
            ) from None
        except (UnauthenticatedError, CorruptError) as exc:
            if latest == 0 or not self._verifies(latest - 1):
                return
            url = exc.url or self.run.store.url(manifest_key(latest))
            raise type(exc)(
                f"{exc}. The run's latest version, {latest}, does not verify, and a trainer builds only on verified "
                f"versions. If it was committed, copy its verified manifest from a region that holds it (`aurora audit "
                f"REGION_URI` says which do) over {url}; if it was never published by this run (planted), delete it. "
                "Then start the trainer again",
                url=url,
            ) from None

    def _verifies(self, version: int) -> bool:
        try:
            self.run.manifest(version)
        except StoreError:
            return False
        return True

    def _save_state(self, version: int, version_hash: str, *, then: Callable[[], object] | None = None) -> None:
        """Start saving the state of ``version`` off the training thread; ``then`` runs once it is saved."""
        extra = self._state_extra(version)
        sharded = self.dist.world > 1
        self.states.save(
            version, version_hash, self.origin, self.model, self.opt, self.rng, extra, sharded=sharded, then=then
        )

    def _why_rolled_back(self, state: int, latest: int, refused: dict[int, str]) -> str:
        """What a restart found of the states of versions ``state`` + 1 to ``latest``: refused ones (why),
        ones --state-every skipped, and ones missing (never saved, or deleted)."""
        every = self.cfg.publish.state_every
        said = [f"version {v}'s refused ({why})" for v, why in sorted(refused.items())]
        due = [v for v in range(state + 1, latest + 1) if v not in refused and v % every == 0]
        if len(due) < latest - state - len(refused):
            said.append(f"the others not due (--state-every {every})")
        if due:
            said.append(f"version(s) {', '.join(map(str, due))} missing: not saved, or deleted")
        return "; ".join(said)

    def _result_stores(self) -> dict[str, ObjectStore]:
        """Where actors put result payloads too large for Redis: each region's bucket (run prefix)."""
        stores = {self.cfg.region: self.run.store}
        for region, where in self.cfg.result_regions.items():
            if not isinstance(where, dict) or not isinstance(where.get("uri"), str):
                raise ConfigError(f"--result-regions: region {region!r} needs {{'uri': ..., 'storage_options': ...}}")
            stores[region] = ObjectStore(where["uri"], where.get("storage_options") or {})
        return stores

    def _announce_again(self) -> None:
        """Redis lost its state: the home region's version is set again from the bucket (relays and
        actors learn of it from there)."""
        self.coord.regions.rebuild(self.cfg.region, self.run.reader)

    def _resume(self, latest: int, unrecorded: bool, spec: Any) -> None:
        newest = self.run.manifest(latest)
        self.origin = newest.lineage.origin if newest.lineage is not None else None
        trust = self.cfg.publish.trust_unsigned_state
        resumed = resume_state(self.run, latest, self.model, self.opt, self.rng, trust_unsigned=trust)
        state = resumed.state
        self.weights_version = state.version
        data = state.extra.get("data")
        if isinstance(data, dict) and "fingerprint" in data and data != self.source.position(state.version, self._n()):
            raise DataError(
                f"{self.run.uri}: the run was trained on another data set or order ({data}); give the same --data, "
                "--data-format and --seed to resume it"
            )
        log.info(
            "trainer %s resumes from the state of version %d; latest committed version %d",
            self.tag,
            state.version,
            latest,
        )
        if state.version != latest:
            self.rollback = Rollback.of(state.version, self.run.manifest(state.version).version_hash, latest)
            log.warning(
                "the newest usable trainer state is version %d's: version %d will continue from version %d's "
                "weights and optimizer state and record that it abandons versions %d..%d (their states: %s)",
                state.version,
                latest + 1,
                state.version,
                state.version + 1,
                latest,
                self._why_rolled_back(state.version, latest, resumed.refused),
            )
        self._load_reference()
        if self.dist.main:
            if unrecorded:  # a run an earlier trainer started: it gains its aurora_run.json now
                self.run.files.put(policies.RUN_SPEC, spec.to_bytes())
            for v in range(max(0, latest - 2), latest + 1):
                try:  # results of the last versions' jobs may still come in; gc may have retired the older ones
                    m = newest if v == latest else self.run.manifest(v)
                except MissingError:
                    continue
                except DAMAGE as exc:  # forged or replayed since: never built on, nothing of it admitted
                    self._refused(exc, f"results of version {v}'s jobs will not be admitted")
                    continue
                self.dispatch.published_version(v, m.version_hash, m.weights_digest)
            self.dispatch.forget_predecessor()
        self.metrics.published(latest)

    def _refused(self, exc: BaseException, consequence: str) -> None:
        """Say loudly that an object of the run failed verification (log, and
        ``aurora_artifacts_rejected_total{role="trainer"}`` for the alert) and what the trainer does
        instead; the run goes on."""
        self.metrics.m.rejected(exc)
        log.error(
            "%s: it failed verification (damaged, forged or replayed) and is not used: %s. `aurora audit %s` "
            "names every such object; copy the good one from a region that holds it",
            exc,
            consequence,
            self.run.uri,
        )

    def _prompt_source(self) -> PromptSource:
        d = self.cfg.data
        if d.data is None:
            return TaskPrompts(load_task(d.task), self.policy.tokenizer.prompt_ids, seed=self.cfg.seed)
        records = read_records(
            d.data, data_format=d.data_format, prompt_field=d.prompt_field, answer_field=d.answer_field
        )
        pool = PromptPool(
            records, self.policy.tokenizer.prompt_ids, max_prompt_tokens=d.max_prompt_tokens, seed=self.cfg.seed
        )
        log.info(
            "%s: %d prompts, %d skipped as longer than %d tokens",
            d.data,
            len(pool.prompts),
            pool.skipped,
            d.max_prompt_tokens,
        )
        return pool

    def _source_name(self) -> str:
        return self.cfg.data.data or f"task:{self.cfg.data.task}"

    def _n(self) -> int:
        return self.cfg.rollout.prompts

    def _state_extra(self, step: int) -> dict[str, Any]:
        return {"data": self.source.position(step, self._n())}

    def _load_reference(self) -> None:
        if self.cfg.optim.kl_coef > 0:
            self.reference = self.dist.shard(policies.reference_model(self.policy, self.run, self.device))

    def _warm_start(self, model: torch.nn.Module) -> None:
        """A short supervised phase of ``model`` on the task's demonstrations, so the first rewards are
        not all zero (built-in tasks have demonstrations; a data set has none and starts from the model
        as it is)."""
        if self.cfg.data.data is not None or self.cfg.optim.sft_steps <= 0:
            return
        task, tok = load_task(self.cfg.data.task), self.policy.tokenizer
        opt = torch.optim.AdamW(model.parameters(), lr=self.cfg.optim.sft_lr)
        rng = random.Random(self.cfg.seed + 1)
        total = self.cfg.optim.sft_steps
        for i in range(total):
            if self.on_phase is not None:
                self.on_phase("supervised warm start", i, total)
            demos = task.demos(rng, self.cfg.optim.sft_batch)
            opt.zero_grad()
            sft_loss(model, [tok.prompt_ids(p) for p, _ in demos], [tok.completion_ids(a) for _, a in demos]).backward()
            opt.step()
        if self.on_phase is not None:
            self.on_phase("supervised warm start", total, total)

    # ------------------------------------------------------------ training

    def post(self, step: int) -> None:
        self.dispatch.post(step, self.source.for_step(step, self._n()))

    def _batch(self, step: int, results: list[Admitted]) -> dict[str, Any]:
        """A step's training batch as plain JSON (rank 0 broadcasts it under torchrun)."""
        rows: list[list[Any]] = []
        adv: list[float] = []
        versions = {res.result.version for res in results}
        for res in results:
            ids = list(self.dispatch.leases.step_jobs[step][res.job].ids)
            got = res.rollouts
            rewards = got.rewards.tolist()
            adv += advantages(rewards)
            for i, reward in enumerate(rewards):
                toks, lps = got.completion(i)
                rows.append([ids, toks.tolist(), lps.tolist(), reward])
        return {"rows": rows, "adv": adv, "version": versions.pop() if len(versions) == 1 else None}

    def train_step(self, step: int, batch: dict[str, Any]) -> tuple[float, float, StepStats]:
        """One optimizer step on ``batch`` (the same on every rank); returns the mean reward, seconds and stats."""
        samples = [Sample(tuple(p), tuple(t), tuple(lp), r) for p, t, lp, r in batch["rows"]]
        t0 = time.perf_counter()
        o = self.cfg.optim
        rollout, current = self.rollout, self.weights_version
        rollout_model = None
        version = batch["version"]
        if rollout is not None and version is not None and rollout.switch_to(version, self.model, current):
            rollout_model = rollout.model
        grpo = self.grpo
        if rollout_model is None and grpo.correction != "none":  # no copy holds the rollouts' weights
            if batch["version"] is None:
                log.warning("step %d: rollouts of several versions: trained without the rollout correction", step)
            grpo = replace(grpo, correction="none")
        stats = optimizer_step(
            self.model,
            self.opt,
            samples,
            batch["adv"],
            grpo,
            step=step,
            base_lr=o.lr,
            warmup_steps=o.warmup_steps,
            max_grad_norm=o.max_grad_norm,
            micro_batch_tokens=o.micro_batch_tokens,
            rank=self.dist.rank,
            world=self.dist.world,
            reference=self.reference,
            all_reduce=self.dist.sum_floats if self.dist.world > 1 else None,
            rollout_model=rollout_model,
            before_update=lambda: self._before_update(rollout, current),
        )
        self.weights_version = step
        reward = sum(s.reward for s in samples) / max(len(samples), 1)
        return reward, time.perf_counter() - t0, stats

    def _before_update(self, rollout: RolloutPolicy | None, current: int) -> None:
        """What must happen before the optimizer moves the weights: the last version's state is copied,
        and the rollout copy takes the weights it needs."""
        self.states.before_update()
        if rollout is not None:
            rollout.take(self.model, current)

    def commit(self, step: int) -> VersionInfo:
        """Publish the weights of ``step`` as the next version (recording a pending rollback) and, when
        its state is due, save that state off the training thread. Collective under torchrun.

        A single-process trainer commits such a version only once its state is saved (the writer
        thread writes the manifest after it), so every committed version has its state and a kill at
        any moment resumes exactly; the version's objects are uploaded here, and the state's name is
        bound to the version's hash, which is known before the commit. Sharded ranks commit first and
        save after: a kill between the two resumes from the state before, and the next version
        records that rollback."""
        self.states.flush()  # the previous version is committed (its commit's failure is raised here)
        due = step % self.cfg.publish.state_every == 0 or step == self.cfg.steps
        defer = due and self.dist.world == 1
        info = self.publisher.publish(step=step, meta={"trainer": self.tag}, rolls_back_to=self.rollback, defer=defer)
        if self.rollback is not None:
            self.metrics.rolled_back(len(self.rollback.abandons))
            self.rollback = None
        self.dispatch.published_version(info.version, info.version_hash, info.weights_digest)
        if due:
            self._save_state(info.version, info.version_hash, then=self.publisher.commit_deferred if defer else None)
        return info

    def train(self) -> int:
        """Run to ``cfg.steps``; returns the last published version. Collective under torchrun."""
        main = self.dist.main
        if self.cfg.metrics_port:  # every rank its own port: --metrics-port plus its local rank
            self.metrics.m.serve(self.cfg.metrics_port + policies.local_rank(), self.cfg.metrics_addr)
        at = self.start()
        if main:
            self.dispatch.start()  # sweeps, reads and admits on a thread of its own from now on
            self.post(at + 1)
            self.post(at + 2)
        full_bytes = self.artefact.full_bytes(self.model)
        for step in range(at + 1, self.cfg.steps + 1):
            t0 = time.perf_counter()
            state_before = self.states.cost.training_thread_s
            results = self.dispatch.collect(step) if main else []
            lag = summarize(version_lags((r.result.version for r in results), self.dispatch.leases.latest or 0))
            batch = self.dist.broadcast(self._batch(step, results) if main else None)
            wait = time.perf_counter() - t0
            reward, train_s, stats = self.train_step(step, batch)
            t1 = time.perf_counter()
            back = self.rollback
            info = self.commit(step)
            published_ms = now_ms()
            publish_s = time.perf_counter() - t1
            self.metrics.step(
                version=info.version,
                publish_s=publish_s,
                train_s=train_s,
                wait_s=wait,
                mismatch={"abs": stats.mismatch_abs, "kl": stats.mismatch_kl, "corrected": stats.corrected_frac},
                lag=lag if main else None,
            )
            if not main:
                continue
            if step + 2 <= self.cfg.steps:
                self.post(step + 2)
            rep = StepReport(
                step,
                info.version,
                reward,
                info.bytes,
                full_bytes,
                info.density,
                publish_s,
                train_s,
                wait,
                published_ms,
                len(results),
                dict(Counter(r.actor for r in results)),
                dict(self.dispatch.dropped),
                self.dispatch.leases.stolen,
                kind=info.kind,
                stats=asdict(stats),
                reward_failures=dict(self.dispatch.reward_failures),
                skipped_prompts=self.source.skipped,
                reward_stderr=_stderr([row[3] for row in batch["rows"]]),
                changed=info.changed if info.kind == "delta" else 0,
                rolls_back_to=None if back is None else {"version": back.version, "abandons": list(back.abandons)},
                state_s=self.states.cost.training_thread_s - state_before,
                version_lag=asdict(lag),
            )
            try:
                self.coord.note("steps", **asdict(rep))
            except CoordinationError as exc:  # telemetry: the step stands
                log.warning("step %d: could not record its report in Redis: %s", step, exc)
            if self.on_step is not None:
                self.on_step(rep)
        self.states.flush()
        if main:
            self.dispatch.close()
        return self.cfg.steps

    def close(self) -> None:
        """Release what the trainer holds: the dispatcher's thread and payload pool, the admissions
        log, the run's store pool, Redis connections and the process group. Idempotent."""
        dispatch = getattr(self, "dispatch", None)
        if dispatch is not None:
            dispatch.close()
        self.states.close()
        if self._admissions is not None:
            self._admissions.close()
            self._admissions = None
        self.run.close()
        self.coord.close()
        self.dist.close()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
