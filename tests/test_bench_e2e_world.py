"""``aurora bench e2e --world four-regions --quick`` through the CLI: five modes over the link table (a 0.25 Gbps
region, a gs:// region on fake-gcs-server, a relay tree), the same seeded churn in every mode, per-link bytes
and dollars from the price table, per-region publish-to-applied percentiles, the projection and the targets."""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

import pytest

from aurora_store import cli
from bench.e2e.regions import MODES
from bench.emulation import egress, links

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("gcsfs")
    from aurora_store.testing.gcs import GcsUnavailable, fake_gcs_binary

    try:
        fake_gcs_binary()
    except GcsUnavailable as exc:
        pytest.skip(str(exc))
    chart = tmp_path_factory.mktemp("chart") / "e2e.html"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        argv = ["bench", "e2e", "--world", "four-regions", "--quick", "--json", "--chart", str(chart)]
        assert cli.main(argv) == 0
    parsed: dict[str, Any] = json.loads(out.getvalue())  # one JSON object on stdout, nothing else
    parsed["_chart"] = chart.read_text()
    return parsed


def test_world_and_modes(result: dict[str, Any]) -> None:
    assert result["world"] == "four-regions" and result["emulated"] is True
    assert list(result["modes"]) == list(MODES)
    bws = sorted(link["bandwidth_bps"] for link in result["links"] if link["star"])
    assert bws[0] == 0.25e9 and all(1e9 <= b <= 10e9 for b in bws[1:])
    assert any(s["scheme"] == "gs" for s in result["sites"])
    assert result["bit_exact"] is True
    for mode in MODES[1:]:
        assert result["modes"][mode]["final"], mode
        for actor in result["modes"][mode]["final"]:
            assert actor["weights_digest"] == actor["manifest_digest"] == actor["live_digest"]


def test_tree_against_star_and_direct(result: dict[str, Any]) -> None:
    ours, star, direct = (result["modes"][m]["links"] for m in ("ours", "star", "direct"))
    assert "eu-west->gcp-eu" in ours and "home->gcp-eu" not in ours  # the tree feeds gcp-eu from eu-west
    assert "home->gcp-eu" in star and "eu-west->gcp-eu" not in star
    # without relays every actor of a region pulls its own copy across the link
    actors = result["actors_per_region"]
    assert direct["home->ap-south"]["bytes_down"] > (actors - 0.5) * star["home->ap-south"]["bytes_down"]
    full = result["modes"]["full"]["links"]["home->ap-south"]["bytes_down"]
    assert full > 20 * star["home->ap-south"]["bytes_down"]


def test_churn_is_the_same_in_every_mode(result: dict[str, Any]) -> None:
    events = result["churn"]["events"]
    assert {e["kind"] for e in events} == {"preempt", "join"}
    for mode, m in result["modes"].items():
        assert [(c["kind"], c["actor"]) for c in m["churn"] if c["kind"] == "preempt"] == [
            (e["kind"], e["actor"]) for e in events if e["kind"] == "preempt"
        ], mode
        joins = [c for c in m["churn"] if c["kind"] == "join"]
        assert joins and all(c["first_step"] > c["step"] for c in joins), mode
    gone = {e["actor"] for e in events if e["kind"] == "preempt"}
    assert not gone & {a["actor"] for a in result["modes"]["ours"]["final"]}  # a preempted actor is gone


def test_dollars_and_projection(result: dict[str, Any]) -> None:
    assert result["prices"]["source"]["checked"] is False and "list prices" in result["prices"]["source"]["note"]
    for mode in ("ours", "full"):
        for name, lk in result["modes"][mode]["links"].items():
            source, dest = name.split("->")
            rate, _ = egress.rate(links.site(source), links.site(dest))
            assert lk["usd_per_1000_steps"] == pytest.approx(lk["bytes_per_step"] * 1000 / egress.GB * rate)
    assert result["modes"]["full"]["usd_per_1000_steps"] > 20 * result["modes"]["ours"]["usd_per_1000_steps"]
    proj = result["projection_8b"]
    assert "projection" in proj["label"] and proj["params"] == 8e9
    assert proj["delta_bytes_per_version"] == pytest.approx(8e7 * proj["bytes_per_changed_element"])


def test_reports_and_targets(result: dict[str, Any]) -> None:
    for region, r in result["modes"]["ours"]["regions"].items():
        assert r["staged_s"]["p50"] is not None and r["staged_s"]["p95"] >= r["staged_s"]["p50"] > 0, region
    assert set(result["targets"]) == {"ours_vs_ideal", "full_vs_ideal", "tree_bytes_per_version"}
    assert all(isinstance(t["met"], bool) for t in result["targets"].values())
    assert result["modes"]["full"]["vs_ideal"] > result["modes"]["ours"]["vs_ideal"]
    assert result["slowest_region"]["region"] in {r.name for r in links.regions()}
    excess = result["modes"]["ours"]["excess_over_ideal_s"]
    assert excess["total"] == pytest.approx(result["modes"]["ours"]["step_time_s"] - result["step_time_s"]["ideal"])
    assert excess["sync_path_s"]["p95"] >= excess["sync_path_s"]["p50"] > 0 and excess["budget_s"] > 0
    assert len(result["bounds"]["load_average_1_5_15"]) == 3
    for mode in MODES[1:]:
        b = result["bounds"][mode]
        assert b["link_alone_sync_s"] > 0 and b["link_alone_vs_ideal"] >= 1
    assert "<svg" in result["_chart"] and "ours" in result["_chart"]
