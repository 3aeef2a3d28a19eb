"""The fleet of ``aurora bench coord``: real ``actor.worker.Worker`` loops with an instant engine.

Each actor is the real :class:`actor.worker.Worker` (its Coordinator, JobBoard, Updater, stager and
heartbeat threads, its take/serve/submit loop), built on a tiny published run, with what the
benchmark does not measure replaced: the engine answers at once with fixed completions of
``tokens`` tokens (ids below the vocabulary, float32 log-probabilities), the reward scores 0
without a process, and the tokenizer decodes to nothing. Actors run as threads of the bench
process (one Python process, so the client side is bounded by one interpreter; Redis is a real
``redis-server``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from actor.config import RolloutConfig, SyncConfig, WorkerConfig
from actor.engine import Completion
from actor.updater import Updater
from actor.worker import Worker
from aurora_store.rl.sampling import SamplingConfig


class InstantEngine:
    """Answers every prompt at once with ``samples`` copies of one fixed completion."""

    def __init__(self, tokens: int, vocab: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        ids = rng.integers(0, vocab, tokens).tolist()
        lps = (-rng.exponential(1.0, tokens)).astype(np.float32).astype(np.float64).tolist()
        self.completion = Completion(tuple(ids), tuple(lps), "length")
        self.live: Any = None  # the updater's own tensors hold the weights

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        samples: int,
        max_new_tokens: int,
        temperature: float,
        seed: int,
        top_p: float = 1.0,
    ) -> list[list[Completion]]:
        return [[self.completion] * samples for _ in prompts]

    def applied(self, version: int, version_hash: str) -> None:
        pass


class _Tokenizer:
    def decode(self, ids: Sequence[int]) -> str:
        return ""

    def prompt_ids(self, text: str) -> list[int]:
        return [1, 2, 3]


class _Reward:
    def score(self, prompt: str, completion: str, answer: str) -> tuple[float, str | None]:
        return 0.0, None


@dataclass(frozen=True, slots=True)
class _Spec:
    sampling: SamplingConfig


class Fleet:
    """``n`` actors of one region, started on a run whose version 0 is published at ``store``."""

    def __init__(self, n: int, *, store: str, redis: str, run_id: str, tokens: int, group: int, vocab: int) -> None:
        self.workers: list[Worker] = []
        self.threads: list[threading.Thread] = []
        sampling = SamplingConfig(group=group, max_new_tokens=tokens)
        for i in range(n):
            cfg = WorkerConfig(
                sync=SyncConfig(store=store, region="home", redis=redis, run_id=run_id, worker_id=f"actor-{i:04d}"),
                rollout=RolloutConfig(batch=8),  # the actor's defaults: heartbeat, check interval, inline cap
            )
            w = Worker(cfg)
            w.spec = _Spec(sampling)  # type: ignore[assignment]
            w.tok = _Tokenizer()  # type: ignore[assignment]
            w.rewards = _Reward()  # type: ignore[assignment]
            w.engine = InstantEngine(tokens, vocab, seed=i)
            w.vocab = vocab
            w.up = Updater(w.run, region="home", coord=w.coord, worker_id=w.wid)
            held = w.up.bootstrap()
            w.coord.register("actor", "home", worker_id=w.wid, ttl_s=cfg.rollout.heartbeat_s)
            w.board.report_throughput(w.wid, 1000.0, 1.0, beta=cfg.rollout.beta)  # calibrated: all alike
            w.coord.update_worker(w.wid, version=held.version, version_hash=held.version_hash)
            self.workers.append(w)

    def start(self) -> None:
        for w in self.workers:
            t = threading.Thread(target=w.loop, name=f"bench-{w.wid}", daemon=True)
            t.start()
            self.threads.append(t)

    def stop(self) -> None:
        for w in self.workers:
            w.halt()
        for t in self.threads:
            t.join(timeout=30)
        # connections stay open: a listener blocked in its read ends when the server goes
