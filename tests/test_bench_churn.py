"""Fast checks of the four-regions world's pure parts and its churn-aware step loop: the seeded churn schedule,
the price table's lines, and `run_steps` with preemptions and joins on instant weights (no servers)."""

from __future__ import annotations

import threading

import pytest

from bench.e2e import world as e2e_world
from bench.e2e.loop import Churn, Instant, Timing, VersionBox, Weights, run_steps
from bench.emulation import egress, links
from bench.fleet import churn
from bench.fleet.churn import Event


def test_churn_schedule_is_seeded_and_keeps_a_region() -> None:
    fleet = {f"r{i}/a{j}": f"r{i}" for i in range(4) for j in range(2)}
    a = churn.schedule(fleet, 1, 40, 0.5, seed=3)
    assert a == churn.schedule(fleet, 1, 40, 0.5, seed=3) and a != churn.schedule(fleet, 1, 40, 0.5, seed=4)
    live = dict(fleet)
    for e in a:
        if e.kind == "preempt":
            del live[e.actor]
        else:
            live[e.actor] = e.region
        assert {r for r in live.values()} == {f"r{i}" for i in range(4)}
    with pytest.raises(ValueError, match="churn rate"):
        churn.schedule(fleet, 1, 10, 1.5, seed=0)


def test_egress_lines() -> None:
    us, eu = links.site("home"), links.site("eu-west")
    assert egress.rate(us, eu) == (0.02, "aws inter-region")
    assert egress.rate(eu, links.site("gcp-eu"))[0] == egress.PRICES_PER_GB["aws"]["internet"]
    assert e2e_world.QUICK.total_steps < e2e_world.DEFAULT.total_steps
    assert links.depth_order("tree").index("eu-west") < links.depth_order("tree").index("gcp-eu")
    assert [h.source for h in links.hops_for("star")] == [links.HOME] * 4


def test_the_loop_drops_a_preempted_actor_and_takes_a_joiner_from_the_next_step() -> None:
    box = VersionBox()
    weights: dict[str, Weights] = {f"r/a{i}": Instant(box) for i in range(3)}
    timing = Timing(generation_s=0.05, training_s=0.01, warmup_steps=1, timed_steps=4)
    events = [Event(3, "preempt", "r/a1", "r"), Event(3, "join", "r/j1", "r")]
    joined = threading.Event()

    def join(actor: str, region: str) -> Weights:
        joined.set()
        return Instant(box)

    def publish(step: int) -> dict[str, int]:
        box.publish(step)
        return {"version": step}

    out = run_steps(weights, publish, timing, churn=Churn(events, join))
    assert joined.is_set()
    by_step = {s["step"]: set(s["stalls"]) for s in out["steps"]}
    assert all("r/a1" not in actors for step, actors in by_step.items() if step >= 3)
    first = next(c["first_step"] for c in out["churn"] if c["kind"] == "join")
    assert first == 4  # the trainer waited for step 3 when it joined
    assert all("r/j1" in by_step[s] for s in range(first, timing.total_steps + 1))
    assert by_step[5] == {"r/a0", "r/a2", "r/j1"}
    assert out["staleness_max"] <= timing.async_level
