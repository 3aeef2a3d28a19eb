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
from aurora_store.bucket.run import Run, open_run
from aurora_store.coord.coordinator import Coordinator, RegionAnnouncer
from aurora_store.coord.errors import CoordinationError
from aurora_store.coord.jobs import JobBoard
from aurora_store.coord.lease import now_ms
from aurora_store.errors import ConfigError, StoreError
from aurora_store.rl.data import DataError, PromptPool, read_records
from aurora_store.rl.tasks import PromptSource, TaskPrompts, load_task
from trainer import policy as policies
from trainer.config import TrainerConfig
from trainer.dispatch import Admitted, Dispatcher
from trainer.distributed import Dist
from trainer.grpo import GRPOConfig, Sample, advantages, sft_loss
from trainer.metrics import TrainerMetrics
from trainer.publication import ModelPublisher, artefact_for
from trainer.rollout_policy import RolloutPolicy
from trainer.state import load_state, save_state, saved_versions
from trainer.step import StepStats, optimizer_step

log = logging.getLogger("aurora.trainer")


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


def _stderr(xs: list[float]) -> float:
    """The standard error of the mean of ``xs`` (0 for fewer than two)."""
    if len(xs) < 2:
        return 0.0
    return statistics.stdev(xs) / math.sqrt(len(xs))


class Trainer:
    def __init__(self, cfg: TrainerConfig, *, on_step: Callable[[StepReport], None] | None = None) -> None:
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
            self.run.publisher.rotate_to(cfg.publish.rotate_signing_key)
        self.run.announcer = RegionAnnouncer(self.coord, cfg.region)
        self.metrics = TrainerMetrics(cfg.region)
        """This trainer's Prometheus metrics (served by ``aurora train --metrics-port``)."""
        self.metrics.watch(self.coord)
        self.run.store.meter = self.metrics.m.meter(cfg.region)
        self.on_step = on_step
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
        self.rng = random.Random(cfg.seed)
        self.tag = uuid.uuid4().hex[:8]
        self._admissions = open(cfg.admissions_log, "a", encoding="utf-8") if cfg.admissions_log else None  # noqa: SIM115

    # ------------------------------------------------------------ start

    def start(self) -> int:
        """Build or restore the policy on every rank; returns the version it is at."""
        if self.dist.main:
            self.run.store.sweep_temporaries()  # what a killed predecessor left half-written
            if self.run.latest() is not None or self.cfg.publish.rotate_signing_key is not None:
                self.run.publisher.check_signer()  # this trainer's keys can sign the run's next version, or say why not
        latest = self.dist.broadcast(self.run.latest() if self.dist.main else None)
        recorded = policies.recorded_spec(self.run) if latest is not None else None
        self.policy = (
            policies.new_policy(self.cfg) if latest is None else policies.resumed_policy(self.run, recorded, self.cfg)
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
            frozen = self.dist.shard(policies.frozen_copy(self.policy, self.device))
            load = self.run.materialize if self.dist.world == 1 else None  # a sharded copy cannot take a state dict
            self.rollout = RolloutPolicy(frozen, published=self.artefact.dtype, load=load)
        if latest is not None:
            self._resume(int(latest), recorded is None, spec)
            return int(latest)
        self._warm_start()
        if self.dist.main:
            policies.record(self.run, self.policy, spec)
        self.dist.barrier()
        info = self.publisher.publish(step=0, kind="full", meta={"source": self._source_name(), "trainer": self.tag})
        self.dispatch.published_version(0, info.version_hash, info.weights_digest)
        self.metrics.published(0)
        save_state(self.run, 0, self.model, self.opt, self.rng, self._state_extra(0), write=self.dist.main)
        self._load_reference()
        return 0

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
        saved = [v for v in saved_versions(self.run) if v <= latest]
        if not saved:
            raise StoreError(f"{self.run.uri}: version {latest} is published but no trainer state was saved")
        state = load_state(self.run, saved[-1], self.model, self.opt, self.rng)
        self.weights_version = saved[-1]
        data = state.extra.get("data")
        if isinstance(data, dict) and "fingerprint" in data and data != self.source.position(saved[-1], self._n()):
            raise DataError(
                f"{self.run.uri}: the run was trained on another data set or order ({data}); give the same --data, "
                "--data-format and --seed to resume it"
            )
        if saved[-1] != latest:
            log.warning(
                "resuming from the state of version %d; versions %d..%d were published from state that was "
                "not saved, so version %d continues from version %d's weights and optimizer state (the "
                "steps between are lost; save the state more often with --state-every)",
                saved[-1],
                saved[-1] + 1,
                latest,
                latest + 1,
                saved[-1],
            )
        self._load_reference()
        if self.dist.main:
            if unrecorded:  # a run an earlier trainer started: it gains its aurora_run.json now
                self.run.files.put(policies.RUN_SPEC, spec.to_bytes())
            for v in range(max(0, latest - 2), latest + 1):
                m = self.run.manifest(v)
                self.dispatch.published_version(v, m.version_hash, m.weights_digest)
            self.dispatch.forget_predecessor()
        self.metrics.published(latest)

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

    def _warm_start(self) -> None:
        """A short supervised phase on the task's demonstrations, so the first rewards are not all zero
        (built-in tasks have demonstrations; a data set has none and starts from the model as it is)."""
        if self.cfg.data.data is not None or self.cfg.optim.sft_steps <= 0:
            return
        task, tok = load_task(self.cfg.data.task), self.policy.tokenizer
        opt = torch.optim.AdamW(self.model.parameters(), lr=self.cfg.optim.sft_lr)
        rng = random.Random(self.cfg.seed + 1)
        for _ in range(self.cfg.optim.sft_steps):
            demos = task.demos(rng, self.cfg.optim.sft_batch)
            opt.zero_grad()
            sft_loss(
                self.model, [tok.prompt_ids(p) for p, _ in demos], [tok.completion_ids(a) for _, a in demos]
            ).backward()
            opt.step()

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
        rollout, held = self.rollout, self.weights_version
        rollout_model = None
        if rollout is not None and batch["version"] is not None and rollout.hold(batch["version"], self.model, held):
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
            before_update=(lambda: rollout.take(self.model, held)) if rollout is not None else None,
        )
        self.weights_version = step
        reward = sum(s.reward for s in samples) / max(len(samples), 1)
        return reward, time.perf_counter() - t0, stats

    def train(self) -> int:
        """Run to ``cfg.steps``; returns the last published version. Collective under torchrun."""
        main = self.dist.main
        if self.cfg.metrics_port:  # every rank its own port: --metrics-port plus its local rank
            self.metrics.m.serve(self.cfg.metrics_port + policies.local_rank())
        at = self.start()
        if main:
            self.dispatch.start()  # sweeps, reads and admits on a thread of its own from now on
            self.post(at + 1)
            self.post(at + 2)
        full_bytes = self.artefact.full_bytes(self.model)
        for step in range(at + 1, self.cfg.steps + 1):
            t0 = time.perf_counter()
            results = self.dispatch.collect(step) if main else []
            batch = self.dist.broadcast(self._batch(step, results) if main else None)
            wait = time.perf_counter() - t0
            reward, train_s, stats = self.train_step(step, batch)
            t1 = time.perf_counter()
            info = self.publisher.publish(step=step, meta={"trainer": self.tag})
            published_ms = now_ms()
            publish_s = time.perf_counter() - t1
            self.dispatch.published_version(info.version, info.version_hash, info.weights_digest)
            self.metrics.step(
                version=info.version,
                publish_s=publish_s,
                train_s=train_s,
                wait_s=wait,
                mismatch={"abs": stats.mismatch_abs, "kl": stats.mismatch_kl, "corrected": stats.corrected_frac},
            )
            # after the commit: a state saved first would be immutable and ahead of the chain, and the
            # step a restarted trainer redoes could never save its own (a kill between the two resumes
            # from the state before, which the warning in _resume says)
            if step % self.cfg.publish.state_every == 0 or step == self.cfg.steps:
                save_state(self.run, step, self.model, self.opt, self.rng, self._state_extra(step), write=main)
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
            )
            try:
                self.coord.note("steps", **asdict(rep))
            except CoordinationError as exc:  # telemetry: the step stands
                log.warning("step %d: could not record its report in Redis: %s", step, exc)
            if self.on_step is not None:
                self.on_step(rep)
        if main:
            self.dispatch.close()
        return self.cfg.steps

    def close(self) -> None:
        """Release what the trainer holds: the dispatcher's thread and payload pool, the admissions
        log, the run's store pool, Redis connections and the process group. Idempotent."""
        dispatch = getattr(self, "dispatch", None)
        if dispatch is not None:
            dispatch.close()
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
