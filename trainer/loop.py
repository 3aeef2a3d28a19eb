"""The GRPO trainer: warm start, publish, post leased jobs, admit results, train, repeat.

One-step asynchrony: the jobs of step t+2 are posted (tagged with version t) as soon as
version t is published, so actors generate them while step t+1 trains on rollouts of
version t-1. Jobs are leased to eligible actors (alive, holding the latest version or the
one before) in proportion to their throughput EMAs; expired or orphaned leases are
re-leased with a new fencing token. Every prompt of a step is admitted exactly once.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from aurora_store.bucket.run import Run, open_run
from aurora_store.coord.coordinator import Coordinator, RegionAnnouncer
from aurora_store.coord.jobs import JobBoard, OpenJob, Result, now_ms
from aurora_store.coord.schedule import effective, split
from aurora_store.errors import StoreError
from aurora_store.rl.models import build_model, tiny_config
from aurora_store.rl.tasks import Prompt, load_task
from aurora_store.rl.tokenizers import EOS, CharTokenizer
from trainer.config import TrainerConfig
from trainer.distributed import Dist
from trainer.grpo import GRPOConfig, Sample, advantages, loss, sft_loss
from trainer.sharded import ShardedPublisher
from trainer.state import load_state, save_state, saved_versions

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


class Trainer:
    def __init__(self, cfg: TrainerConfig, *, on_step: Callable[[StepReport], None] | None = None) -> None:
        self.cfg = cfg
        self.task = load_task(cfg.data.task)
        self.tok = CharTokenizer()
        self.coord = Coordinator(cfg.redis, cfg.run_id)
        self.board = JobBoard(self.coord)
        self.run: Run = open_run(cfg.store, storage_options=cfg.storage_options, full_every=cfg.publish.full_every)
        self.run.announcer = RegionAnnouncer(self.coord, cfg.region)
        self.on_step = on_step
        self.grpo = GRPOConfig(clip=cfg.optim.clip, kl_coef=cfg.optim.kl_coef, temperature=cfg.sampling.temperature)
        self.dist = Dist()
        self.reference: torch.nn.Module | None = None
        self.rng = random.Random(cfg.seed)
        self.tag = uuid.uuid4().hex[:8]
        self.published: dict[int, str] = {}
        self.pending: dict[str, tuple[int, Prompt]] = {}
        """Jobs waiting for a lease: job id -> (step, prompt)."""
        self.step_jobs: dict[int, dict[str, Prompt]] = defaultdict(dict)
        """Each step's jobs and their prompts (this trainer posted them: no need to ask Redis)."""
        self.admitted: dict[int, dict[str, Result]] = defaultdict(dict)
        self.dropped: Counter[str] = Counter()
        self.stolen = 0
        self._after = "0-0"
        self._last_sweep = 0.0
        self._warned = time.monotonic()  # warn after 30 s without an eligible actor, not at once

    # ------------------------------------------------------------ start

    def _model_config(self) -> dict[str, Any]:
        return tiny_config(self.tok.vocab_size, hidden=self.cfg.model.hidden, layers=self.cfg.model.layers)

    def start(self) -> int:
        """Build or restore the model on every rank; returns the version the policy is at."""
        latest = self.dist.broadcast(self.run.latest() if self.dist.main else None)
        config = self._model_config() if latest is None else json.loads(self.run.files.get("config.json"))
        self.model = self.dist.shard(build_model(config, seed=self.cfg.seed))
        self.publisher = ShardedPublisher(self.run, self.model)
        if latest is not None:
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=self.cfg.optim.lr, betas=(0.9, 0.99))
            saved = [v for v in saved_versions(self.run) if v <= latest]
            if not saved:
                raise StoreError(f"{self.run.uri}: version {latest} is published but no trainer state was saved")
            load_state(self.run, saved[-1], self.model, self.opt, self.rng)
            if saved[-1] != latest:
                log.warning(
                    "resuming from the state of version %d; versions %d..%d were published from state that was "
                    "not saved, so version %d continues from version %d's optimizer state",
                    saved[-1],
                    saved[-1] + 1,
                    latest,
                    latest + 1,
                    saved[-1],
                )
            self._load_reference(config)
            if self.dist.main:
                for v in range(max(0, latest - 2), latest + 1):
                    self.published[v] = self.run.manifest(v).version_hash
                # a predecessor's jobs: their results are not ours
                self.board.forget([j.job for j in self.board.open_jobs()])
                self._after = self.board.last_result_id()
            return int(latest)
        self._warm_start()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=self.cfg.optim.lr, betas=(0.9, 0.99))
        if self.dist.main:
            self.run.files.put("config.json", json.dumps(config, indent=1).encode())
            self.run.files.put("tokenizer.json", self.tok.to_json())
            self.run.files.put("task.json", json.dumps({"task": self.cfg.data.task}).encode())
        self.dist.barrier()
        info = self.publisher.publish(step=0, kind="full", meta={"task": self.cfg.data.task})
        self.published[0] = info.version_hash
        save_state(self.run, 0, self.model, self.opt, self.rng, write=self.dist.main)
        self._load_reference(config)
        return 0

    def _load_reference(self, config: dict[str, Any]) -> None:
        """The frozen KL reference: version 0 exactly as published (BF16 weights, computed in FP32)."""
        if self.cfg.optim.kl_coef <= 0:
            return
        ref = build_model(config, seed=self.cfg.seed)
        weights = self.run.materialize(0)
        with torch.no_grad():
            for n, p in ref.named_parameters():
                p.copy_(weights[n].float())
        self.reference = self.dist.shard(ref.eval().requires_grad_(False))

    def _warm_start(self) -> None:
        """A short supervised phase so the policy's first rewards are not all zero."""
        opt = torch.optim.AdamW(self.model.parameters(), lr=self.cfg.optim.sft_lr)
        rng = random.Random(self.cfg.seed + 1)
        for _ in range(self.cfg.optim.sft_steps):
            demos = self.task.demos(rng, self.cfg.optim.sft_batch)
            prompts = [self.tok.encode(p) for p, _ in demos]
            answers = [[*self.tok.encode(a, bos=False), EOS] for _, a in demos]
            opt.zero_grad()
            sft_loss(self.model, prompts, answers).backward()
            opt.step()

    # ------------------------------------------------------------ jobs

    def _eligible(self) -> dict[str, float]:
        """Actors that may get work now, with their split weights."""
        latest = max(self.published)
        taus, probation = self.board.throughputs()
        ok = {}
        for wid, doc in self.coord.workers().items():
            if doc.get("role") == "actor" and doc.get("version") in (latest, latest - 1):
                ok[wid] = taus.get(wid)
        return effective(ok, probation, self.cfg.schedule.alpha)

    def post(self, step: int) -> None:
        prompts = self.task.prompts(random.Random(f"{self.cfg.seed}:{step}"), self.cfg.rollout.prompts)
        for i, p in enumerate(prompts):
            job = f"{self.tag}:{step}:{i}"
            self.step_jobs[step][job] = p
            self.pending[job] = (step, p)
        self._assign(turn=step)

    def _assign(self, *, turn: int) -> None:
        if not self.pending:
            return
        weights = self._eligible()
        if not weights:
            if time.monotonic() - self._warned > 30:
                self._warned = time.monotonic()
                log.warning(
                    "%d prompts wait for an actor holding version %d or %d",
                    len(self.pending),
                    max(self.published),
                    max(self.published) - 1,
                )
            return
        version = max(self.published)
        shares = split(len(self.pending), weights, turn=turn)
        todo, self.pending = self.pending, {}
        it = iter(todo.items())
        for actor, n in shares.items():
            for _ in range(n):
                job, (step, prompt) = next(it)
                self.board.lease(
                    job, actor, version=version, lease_s=self.cfg.schedule.lease_s, step=step, prompt=prompt.to_dict()
                )

    def _sweep(self) -> None:
        """Re-lease jobs whose lease expired or whose actor is gone; place pending prompts; let idle
        actors take over half of the not-yet-started jobs of the actor with the most of them."""
        alive = set(self.coord.workers())
        now = now_ms()
        jobs = self.board.open_jobs()
        for j in jobs:
            if j.job in self.pending or j.job not in self.step_jobs.get(j.step, ()):
                continue
            if j.deadline_ms < now or j.actor not in alive:
                self.pending[j.job] = (j.step, self.step_jobs[j.step][j.job])
                self.dropped["lease_lost"] += 1
        self._assign(turn=int(now // 1000))
        if self.cfg.schedule.steal:
            self._rebalance([j for j in jobs if j.job not in self.pending and j.actor in alive])

    def _rebalance(self, jobs: list[OpenJob]) -> None:
        busy = {j.actor for j in jobs}
        untaken: dict[str, list[OpenJob]] = defaultdict(list)
        for j in jobs:
            if not j.taken and j.deadline_ms > 0:
                untaken[j.actor].append(j)
        version = max(self.published)
        for thief in sorted(set(self._eligible()) - busy):
            if not untaken:
                return
            donor = max(sorted(untaken), key=lambda a: len(untaken[a]))
            n = (len(untaken[donor]) + 1) // 2
            moved, untaken[donor] = untaken[donor][-n:], untaken[donor][:-n]
            if not untaken[donor]:
                del untaken[donor]
            for j in moved:
                if self.board.lease(j.job, thief, version=version, lease_s=self.cfg.schedule.lease_s):
                    self.stolen += 1

    def collect(self, step: int) -> list[Result]:
        """Block until every prompt of ``step`` has one admitted result."""
        while len(self.admitted[step]) < len(self.step_jobs[step]):
            for res in self.board.results(self._after, block_ms=int(self.cfg.schedule.sweep_s * 1000)):
                self._after = res.id
                self._consider(res)
            if time.monotonic() - self._last_sweep >= self.cfg.schedule.sweep_s:
                self._last_sweep = time.monotonic()
                self._sweep()
        for old in [s for s in self.step_jobs if s < step - 2]:  # long trained: late results are unknown jobs
            del self.step_jobs[old]
        return list(self.admitted.pop(step).values())

    def _consider(self, res: Result) -> None:
        step = next((s for s, jobs in self.step_jobs.items() if res.job in jobs), None)
        if step is None:
            self.dropped["unknown_job"] += 1
            return
        why = self._check_payload(res)
        if why is None:
            why = self.board.admit(res, self.published)
        if why == "ok":
            self.admitted[step][res.job] = res
            return
        self.dropped[why] += 1
        if why in ("malformed", "wrong_version", "wrong_version_hash", "bad_payload"):
            # the holder produced something unusable: lease the prompt again now
            self.pending[res.job] = (step, self.step_jobs[step][res.job])

    def _check_payload(self, res: Result) -> str | None:
        comps = res.payload.get("completions")
        if not isinstance(comps, list) or len(comps) != self.cfg.sampling.group:
            return "bad_payload"
        vocab = self.tok.vocab_size
        for c in comps:
            if not isinstance(c, dict):
                return "bad_payload"
            toks, lps, r = c.get("tokens"), c.get("logprobs"), c.get("reward")
            if not (isinstance(toks, list) and isinstance(lps, list) and len(toks) == len(lps) >= 1):
                return "bad_payload"
            too_long = len(toks) > self.cfg.sampling.max_new_tokens
            if too_long or not all(isinstance(t, int) and 0 <= t < vocab for t in toks):
                return "bad_payload"
            if not all(isinstance(x, (int, float)) and math.isfinite(x) and x <= 0 for x in lps):
                return "bad_payload"
            if not isinstance(r, (int, float)) or not math.isfinite(r):
                return "bad_payload"
        return None

    # ------------------------------------------------------------ training

    def _batch(self, step: int, results: list[Result]) -> dict[str, Any]:
        """A step's training batch as plain JSON (rank 0 broadcasts it under torchrun)."""
        rows: list[list[Any]] = []
        adv: list[float] = []
        for res in results:
            ids = self.tok.encode(self.step_jobs[step][res.job].text)
            comps = res.payload["completions"]
            rs = [float(c["reward"]) for c in comps]
            adv += advantages(rs)
            rows += [[ids, c["tokens"], c["logprobs"], float(c["reward"])] for c in comps]
        return {"rows": rows, "adv": adv}

    def train_step(self, batch: dict[str, Any]) -> tuple[float, float]:
        """One optimizer step on ``batch``; each rank takes its slice (data parallel)."""
        samples = [Sample(tuple(p), tuple(t), tuple(lp), r) for p, t, lp, r in batch["rows"]]
        adv = batch["adv"]
        t0 = time.perf_counter()
        if any(a != 0 for a in adv):  # every rank decides alike: the batch is the same everywhere
            w, r = self.dist.world, self.dist.rank
            tokens = sum(len(s.token_ids) for s in samples)
            value, _ = loss(self.model, samples[r::w], adv[r::w], self.grpo, self.reference, normalizer=tokens / w)
            self.opt.zero_grad()
            value.backward()
            self.opt.step()
        reward = sum(s.reward for s in samples) / max(len(samples), 1)
        return reward, time.perf_counter() - t0

    def train(self) -> int:
        """Run to ``cfg.steps``; returns the last published version. Collective under torchrun."""
        main = self.dist.main
        at = self.start()
        if main:
            self.post(at + 1)
            self.post(at + 2)
        full_bytes = sum(p.numel() * 2 for p in self.model.parameters())
        for step in range(at + 1, self.cfg.steps + 1):
            t0 = time.perf_counter()
            results = self.collect(step) if main else []
            batch = self.dist.broadcast(self._batch(step, results) if main else None)
            wait = time.perf_counter() - t0
            reward, train_s = self.train_step(batch)
            t1 = time.perf_counter()
            info = self.publisher.publish(step=step)
            published_ms = now_ms()
            publish_s = time.perf_counter() - t1
            self.published[info.version] = info.version_hash
            if step % self.cfg.publish.state_every == 0 or step == self.cfg.steps:
                save_state(self.run, step, self.model, self.opt, self.rng, write=main)
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
                dict(self.dropped),
                self.stolen,
            )
            self.coord.note("steps", **asdict(rep))
            if self.on_step is not None:
                self.on_step(rep)
        return self.cfg.steps
