"""The transfer benchmark, end to end on a tiny model: its JSON, bit-exact actors, one delta per region."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bench.transfer import transfer
from bench.transfer.transfer import MIB, MODES, Config

pytestmark = pytest.mark.slow

TINY = Config(
    layers=1,
    vocab=256,
    versions=1,
    rtts_s=(0.01, 0.02),
    bandwidth_bps=10e9,
    loss=0.0,
    actors=1,
    connections=16,
    part_bytes=256 * 1024,
    full_part_bytes=1 * MIB,
    segment_bytes=256 * 1024,
    shard_bytes=4 * MIB,
    fetch_bytes=1 * MIB,
    fetch_object_bytes=256 * 1024,
)
HTTP_SLACK = 64 * 1024
"""Bytes a link may carry per version beyond the delta and its manifest (headers, listings)."""


@pytest.fixture(scope="module")
def result() -> dict[str, Any]:
    return transfer.measure(TINY)


def test_json_shape(result: dict[str, Any]) -> None:
    out = json.loads(json.dumps(result))  # plain JSON, nothing else
    assert out["bench"] == "transfer" and out["emulated"] is True
    assert [link["rtt_s"] for link in out["links"]] == list(TINY.rtts_s)
    assert all(link["emulated"] is True and "model" in link for link in out["links"])
    regions = out["regions"]
    assert len(regions) == 2
    for key in ("delta_bytes", "full_bytes", "cross_region_bytes_per_version_per_region", "per_region", "publish"):
        assert key in out
    assert set(out["time_to_apply_s"]) == set(MODES)
    assert out["full_vs_delta_time_after_first"] is None  # one timed version: no second one to time
    assert set(out["fetch_link_fraction"]) >= {"1", "N", "connections"}
    assert out["fetch_link_fraction"]["connections"] == TINY.connections
    assert set(out["publish"]) >= {"extract_s", "upload_s", "publish_s", "vs_max", "vs_sum"}
    assert set(out["targets"]) == {"one_delta_per_region", "fetch_N_ge_0.85", "delta_vs_full_ge_20x"}
    assert all(isinstance(v, bool) for v in out["targets"].values())
    assert out["peak_rss_mb"]["bench"] > 0
    for mode in MODES:
        m = out["modes"][mode]
        assert [v["version"] for v in m["versions"]] == [1]
        assert m["versions"][0]["kind"] == ("full" if mode == "full_relay" else "delta")
        assert set(out["per_region"][mode]) == set(regions)
        assert out["time_to_apply_s"][mode] == max(out["per_region"][mode].values()) > 0
        split = out["time_split_s"][mode]  # the slowest region's time, cut into its three legs
        assert split["region"] in regions and min(split["publish"], split["actors"]) > 0
        assert split["publish"] + split["until_region_commit"] + split["actors"] == pytest.approx(
            out["time_to_apply_s"][mode]
        )


def test_every_actor_ends_bit_exact(result: dict[str, Any]) -> None:
    for mode in MODES:
        final = result["modes"][mode]["final"]
        assert len(final) == len(TINY.rtts_s) * TINY.actors
        for actor in final:
            assert actor["version"] == TINY.versions
            assert actor["weights_digest"] == actor["manifest_digest"] == actor["live_digest"]
            assert actor["bit_exact"] is True
    assert result["bit_exact"] is True


def test_one_delta_crosses_each_link(result: dict[str, Any]) -> None:
    delta = result["modes"]["delta_relay"]
    payload = delta["payload_bytes"]
    overhead = 2 * delta["manifest_bytes"] + HTTP_SLACK  # a relay reads the manifest twice
    cross = result["cross_region_bytes_per_version_per_region"]
    assert payload == result["delta_bytes"] > 0
    for region in result["regions"]:
        assert payload <= cross["delta_relay"][region] < 2 * payload + overhead
        # without relays every actor pulls its own copy across the link
        assert cross["delta_direct"][region] >= TINY.actors * payload
        assert cross["full_relay"][region] >= result["full_bytes"]
