"""An actor whose batch Redis fails under (a submit refused, a failover mid-batch): the batch's leases go
back to the trainer, never renewed on for a result that will not come. A real ``actor.worker.Actor`` loop
(the benchmark's instant engine in place of a model) on a real redis-server."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import torch

import aurora_store
from aurora_store.coord.jobs import JobBoard
from aurora_store.rl.tasks import Prompt
from aurora_store.testing.processes import wait_for


def test_a_batch_whose_submit_fails_gives_its_leases_back(tmp_path: Path, redis_server: Any) -> None:
    """The results stream is a key of another type (anyone who can write Redis may do it; a failover that
    refuses the write looks the same to the actor): every submit of the batch fails. The actor gives the
    leases it still holds back, so the trainer leases the jobs again at once, and its renewer holds none."""
    from bench.fleet.actors import Fleet

    store = f"file://{tmp_path}/run"
    aurora_store.open_run(store).publish({"w": torch.zeros(64, dtype=torch.bfloat16)})
    run_id = f"r-{uuid.uuid4().hex[:6]}"
    fleet = Fleet(1, store=store, redis=redis_server.url, run_id=run_id, tokens=8, group=2, vocab=32000)
    (actor,) = fleet.workers
    board = JobBoard(actor.coord)
    board.r.set(board.results.key, "not a stream")
    prompts = [Prompt(f"p{i}", f"{i}+1=", str(i + 1)).to_dict() for i in range(3)]
    jobs = board.post(1, 0, prompts, {actor.wid: 3}, lease_s=600, tag="t")
    fleet.start()
    try:

        def given_back() -> bool:
            return {job for job, deadline in board.expired_leases(2**62) if deadline == 0} == set(jobs)

        wait_for(given_back, "the batch's three leases given back", 60)
        assert actor.renewer.held == [], "nothing left to renew"
    finally:
        fleet.stop()
