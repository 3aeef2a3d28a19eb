"""What ``aurora demo``'s live table shows: what the trainer is doing before its first step, and each
row's version per region as it was when the row appeared (against a real redis-server)."""

from __future__ import annotations

from typing import Any

from aurora_store.coord.coordinator import Coordinator
from trainer.demo import REGIONS, _Progress
from trainer.loop import StepReport


def report(step: int) -> StepReport:
    return StepReport(
        step=step, version=step, reward_mean=0.5, delta_bytes=1000, full_bytes=100_000, density=0.01,
        publish_s=0.1, train_s=0.1, wait_s=0.0, published_ms=0, admitted=8, shares={}, dropped={}, stolen=0,
    )  # fmt: skip


def cells(table: Any, column: str) -> list[str]:
    col = next(c for c in table.columns if c.header == column)
    return [str(x) for x in col._cells]


def test_the_table_says_what_happens_before_the_first_step_and_keeps_each_rows_regions(redis_server: Any) -> None:
    coord = Coordinator(redis_server.url, "demo-progress")
    progress = _Progress(coord, steps=3, actors=2)
    assert "starting the trainer" in str(progress.render([]).title)
    progress.phase = ("supervised warm start", 37, 100)
    assert "supervised warm start: 37/100 steps before version 0" in str(progress.render([]).title)

    reports = [report(1)]
    for region in REGIONS:
        coord.regions.commit(region, 1, "a" * 64, "delta")
    progress.render(reports)
    reports.append(report(2))
    coord.regions.commit(REGIONS[0], 2, "b" * 64, "delta")  # home has version 2, the others still 1
    table = progress.render(reports)
    assert cells(table, "/".join(REGIONS)) == ["1/1/1", "2/1/1"]  # the first row keeps what it showed
    assert "steps before version 0" not in str(table.title)
