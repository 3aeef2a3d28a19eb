"""What ``aurora demo``'s live table shows: what the trainer is doing before its first step, and each
row's version per region as it was when the row appeared (against a real redis-server)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from aurora_store.cli import CommandError
from aurora_store.coord.coordinator import Coordinator
from trainer.demo import REGIONS, _Notices, _Progress, _shown, workdir
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


def test_warnings_go_under_the_table_once_each(redis_server: Any) -> None:
    progress = _Progress(Coordinator(redis_server.url, "demo-notices"), steps=3, actors=1)
    log = logging.getLogger("trainer.leasing")
    with _Notices.under(progress):
        logging.getLogger("trainer.identity").warning("no --fleet-key: results are not authenticated")
        for n in (128, 128, 96):
            log.warning("%d prompts wait for an actor holding %s", n, "version 0")
        caption = str(progress.render([]).caption)
    assert caption.splitlines() == [
        "! no --fleet-key: results are not authenticated",
        "! 96 prompts wait for an actor holding version 0 (3 times)",  # the newest text, counted
    ]
    log.warning("after the table: not collected")
    assert "after the table" not in str(progress.render([]).caption)
    assert progress.notices is not None and not any(h is progress.notices for h in logging.getLogger().handlers)


def test_the_summary_table_shows_apply_times_as_text_not_a_dict() -> None:
    apply_s = {"ap": {"p50": 2.5, "p95": 4.0, "versions": 250}, "eu": {"p50": 1.25, "p95": 3.0, "versions": 249}}
    assert (
        _shown(apply_s) == "ap: 2.5 s median, 4 s p95 over 250 versions; eu: 1.25 s median, 3 s p95 over 249 versions"
    )
    assert _shown({}) == "none" and _shown({"timeout": 3, "format": 1}) == "timeout: 3, format: 1"
    assert (_shown(True), _shown(None), _shown(0.5)) == ("yes", "-", 0.5)


def test_a_demo_goes_to_a_new_findable_directory_and_never_into_an_earlier_ones_buckets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    first, second = workdir(None), workdir(None)
    assert first.parent == second.parent == tmp_path / "aurora-demo" and first != second
    assert first.is_dir() and second.is_dir()
    given = workdir(str(tmp_path / "mine"))
    assert given == tmp_path / "mine" and given.is_dir()
    (given / "buckets" / "home").mkdir(parents=True)
    with pytest.raises(CommandError, match="already holds a demo's buckets"):
        workdir(str(given))
