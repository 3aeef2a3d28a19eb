"""``aurora bench transfer``: time from a trainer's step to the weights applied in every region, over emulated WANs.

Home and three regions each run an S3 server (moto) on loopback; every cross-region read goes through
a `bench.emulation.wan.WanProxy` link (its own process) in front of home's server; Redis is a real server where
installed (`bench.emulation.world.bench_redis`).
On the same reference trace, three modes: deltas through relays (cut-through), full versions through
relays, and deltas read by every actor straight from home. Also: fetch throughput over one link with
1 vs N connections, bytes that cross each link per version, and the cut-through publish check
(publish time against max and sum of extraction and upload). Emulation, not a WAN: the JSON says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from aurora_store.config.options import option, positive
from bench.codec.workload import Workload, make_workload
from bench.emulation.wan import describe
from bench.emulation.world import MIB, MODES, Config, World, cpus, own_peak_rss_mb, redis_kind
from bench.output import Output, comma_list, emit, overridden
from bench.transfer.modes import fetch_throughput, mean, publish_check, run_mode

TARGETS = {"link_bytes_per_delta": 1.1, "fetch_fraction": 0.85, "delta_vs_full": 20.0}

FULL = Config()
QUICK = Config(layers=2, vocab=16384, versions=2, fetch_bytes=64 * MIB, full_part_bytes=2 * MIB, part_bytes=MIB // 8)
"""A full quick version is ~100 MB in a few shards: 2 MiB parts keep enough of them in flight to fill a link.
A quick delta is one ~0.8 MB segment: in the default 1 MiB parts it would cross each link as one GET on one
connection (Mathis-capped: ~9.5 Mbit/s at 150 ms and 1e-4 loss, 0.7 s for the delta), where a full-size delta
(~10 MB, three segments) spreads over a dozen; 128 KiB parts keep the quick delta spread as the full one is."""
PRESETS = {"default": FULL, "--quick": QUICK}
"""What ``--help`` says the preset flags default to."""


def measure(cfg: Config, progress: bool = False) -> dict[str, Any]:
    """Run the whole benchmark in-process and return its JSON-ready result."""
    from bench.codec import trace

    unknown = set(cfg.modes) - set(MODES)
    if unknown:
        raise ValueError(f"unknown modes {sorted(unknown)}; known: {list(MODES)}")
    started = time.perf_counter()
    steps = max(cfg.versions, 2)  # the publish check needs two deltas
    console = Console(stderr=True)
    with (
        Progress(console=console, disable=not (progress and console.is_terminal), transient=True) as bar,
        contextlib.ExitStack() as stack,
    ):
        task = bar.add_task("trace", total=cfg.first_step + steps + 1 + len(cfg.modes) * (cfg.versions + 1) + 2)

        def tick(what: str | None = None) -> None:
            bar.update(task, advance=1, description=what)

        work = make_workload(cfg.layers, cfg.vocab, cfg.seed, cfg.first_step, steps, tick)
        bar.update(task, description="starting S3 servers, WAN links, Redis")
        world = World(cfg, stack)
        modes = {mode: run_mode(mode, world, work, cfg, tick) for mode in cfg.modes}
        world.reset()
        tick("fetch: 1 vs N connections")
        fetch = fetch_throughput(world, cfg)
        tick("publish: cut-through check")
        publish = publish_check(world, work, cfg)
        servers = {"home": world.home.peak_rss_mb(), **{r.name: r.server.peak_rss_mb() for r in world.regions}}
        proxies = {r.name: r.proxy.peak_rss_mb() for r in world.regions}
        links = [{"region": r.name, "link_to": "home", **describe(r.link)} for r in world.regions]
    shape = trace.Shape(layers=cfg.layers, vocab=trace.QWEN3_0_6B.vocab if cfg.vocab is None else cfg.vocab)
    result = {
        "bench": "transfer",
        "emulated": True,
        "emulation": "one machine, loopback only: an S3 server (moto) per region; each region reads home through "
        "a userspace WAN proxy (bench.emulation.wan) in its own process; relays write and actors read their own "
        "region's "
        "server directly (no emulation inside a region); Redis: "
        f"{redis_kind(world.redis)}; all on "
        f"{cpus()} CPU cores shared by every process",
        "model": "Qwen3-0.6B"
        if shape == trace.QWEN3_0_6B
        else f"Qwen3-0.6B-shaped ({cfg.layers} layers, vocab {shape.vocab})",
        "params": trace.parameter_count(cfg.layers, shape.vocab),
        "trace_steps": {"version_0": work.steps[0], "timed": work.steps[1 : cfg.versions + 1]},
        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(cfg).items()},
        "links": links,
        "regions": [r["region"] for r in links],
        "actors_per_region": cfg.actors,
        "full_bytes": work.full_bytes,
        "modes": modes,
        "fetch_link_fraction": fetch,
        "publish": publish,
        "peak_rss_mb": {"bench": own_peak_rss_mb(), "s3_servers": servers, "wan_proxies": proxies},
        "seconds": time.perf_counter() - started,
        "limits": _limits(cfg, work),
    }
    return summarize(result)


def _limits(cfg: Config, work: Workload) -> list[str]:
    """What, besides the emulated links, shapes these numbers."""
    largest = max(s.numel * s.width for s in work.specs)
    return [
        f"{cpus()} CPU cores run everything: {len(cfg.rtts_s) + 1} moto servers, {len(cfg.rtts_s)} proxies, and "
        f"in this process the trainer, {len(cfg.rtts_s)} relays and {len(cfg.rtts_s) * cfg.actors} actors as "
        "threads under one GIL; each version's cpu_busy_cores near the core count means the mode is CPU-bound",
        "moto (a Python server) costs a few ms of CPU per request and reads a whole object to serve any range "
        f"of it, one request at a time per object; the largest object is {largest / 1e6:.0f} MB (the embedding, "
        "a tensor the store never splits); fetch_link_fraction.same_requests_1_byte_no_link_s shows the "
        "request cost with no link",
        "moto closes every connection after one response, where S3 clients keep theirs alive: links charge "
        f"{cfg.connect_rtts} round trips per new connection",
        "the WAN proxy models delay, jitter, shared bandwidth and the Mathis per-connection cap, not real loss, "
        "retransmission or slow start",
        "version 0 reaches every region and actor untimed, around the links; only timed versions cross them",
        "relays copy announced objects one at a time, so full_relay's trainer commits without announcing its "
        "shards and relays copy each full version after its commit with all their connections",
        "full_relay actors drop their weights and load the new full version (no second staged copy), and "
        "verify it with an O(model) digest; delta actors stage and verify O(changed)",
    ]


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers (slowest region, per version, mean over timed versions) and the targets."""
    modes = result["modes"]
    times = {m: modes[m]["time_to_apply_s"] if m in modes else None for m in MODES}
    delta = modes.get("delta_relay") or modes.get("delta_direct")
    delta_bytes = delta["payload_bytes"] if delta else None
    cross = {m: modes[m]["link_bytes_per_version"] for m in MODES if m in modes}
    per_delta = None
    if "delta_relay" in modes and delta_bytes:
        overhead = modes["delta_relay"]["manifest_bytes"]
        per_delta = max(b / (delta_bytes + overhead) for b in cross["delta_relay"].values())
    fetch = result["fetch_link_fraction"]
    full_over_delta = (
        times["full_relay"] / times["delta_relay"] if times["full_relay"] and times["delta_relay"] else None
    )
    result |= {
        "delta_bytes": delta_bytes,
        "cross_region_bytes_per_version_per_region": {
            **cross,
            "delta_payload_bytes": delta_bytes,
            "link_bytes_per_delta_delta_relay": per_delta,
            "note": "bytes delivered down each link (home -> region) around each timed version, HTTP included; "
            "delta_relay should be about one delta (plus its manifest, which a relay reads twice), "
            "delta_direct about actors_per_region deltas",
        },
        "time_to_apply_s": times,
        "per_region": {m: modes[m]["per_region_s"] for m in modes},
        "time_split_s": {m: _split(modes[m]) for m in modes},
        "full_vs_delta_time": full_over_delta,
        "full_vs_delta_time_after_first": _after_first(modes),
        "full_vs_delta_bytes": result["full_bytes"] / delta_bytes if delta_bytes else None,
        "bit_exact": all(m["bit_exact"] for m in modes.values()),
    }
    result["targets"] = {
        "one_delta_per_region": per_delta is not None and per_delta <= TARGETS["link_bytes_per_delta"],
        "fetch_N_ge_0.85": fetch["N"] is not None and fetch["N"] >= TARGETS["fetch_fraction"],
        "delta_vs_full_ge_20x": full_over_delta is not None and full_over_delta >= TARGETS["delta_vs_full"],
    }
    result["target_definitions"] = {
        "one_delta_per_region": "max over regions of delta_relay link bytes per version / (delta payload + manifest) "
        f"<= {TARGETS['link_bytes_per_delta']}",
        "fetch_N_ge_0.85": f"N-connection fetch through the first link >= {TARGETS['fetch_fraction']} of its bandwidth",
        "delta_vs_full_ge_20x": "time_to_apply_s full_relay / delta_relay (slowest region, mean per version) "
        f">= {TARGETS['delta_vs_full']}",
    }
    return result


def _after_first(modes: dict[str, Any]) -> float | None:
    """full_vs_delta_time over the timed versions after the first: the first delta of a run is its
    actors' first delta decode in their process and their first reaction to a region's commit (one-time
    costs of 0.2-0.6 s in the quick run), which later versions do not pay."""
    if "full_relay" not in modes or "delta_relay" not in modes:
        return None
    full, delta = (mean([r["slowest_s"] for r in modes[m]["versions"][1:]]) for m in ("full_relay", "delta_relay"))
    return full / delta if full is not None and delta else None


def _split(mode: dict[str, Any]) -> dict[str, Any]:
    """Where a version's time to apply goes in the mode's slowest region (means over timed versions)."""
    per, seen = mode["per_region_s"], mode["region_has_it_s"]
    region = max(per, key=per.get)
    publish = mode["publish_s"]
    return {
        "region": region,
        "publish": publish,
        "until_region_commit": seen[region] - publish,
        "actors": per[region] - seen[region],
        "what": "publish: the trainer's extract, upload and commit at home; until_region_commit: from home's "
        "commit until the region's commit event (relay modes: the relay's last copies and its manifest read "
        "across the link, its commit there; direct: the event alone); actors: the slowest actor's fetch "
        "(direct: across the link), verification, decode, staging and apply",
    }


# ---------------------------------------------------------------- CLI


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def render(result: dict[str, Any], console: Console) -> None:
    """The human table: time to apply per mode and region, bytes per link, then the targets."""
    regions = result["regions"]
    table = Table(
        title=f"transfer: {result['model']}, {result['actors_per_region']} actors per region (emulated WAN)",
        caption="seconds from the trainer's step end to applied, slowest actor of the region, mean per version; "
        "MB: bytes down each link per version",
    )
    for col in ("mode", *regions, "slowest", "publish s", *(f"MB {r}" for r in regions)):
        table.add_column(col, justify="right")
    for mode, m in result["modes"].items():
        table.add_row(
            mode,
            *(_fmt(m["per_region_s"].get(r), ".2f") for r in regions),
            _fmt(m["time_to_apply_s"], ".2f"),
            _fmt(m["publish_s"], ".2f"),
            *(_fmt(m["link_bytes_per_version"].get(r, 0) / 1e6, ".1f") for r in regions),
        )
    console.print(table)
    f, p = result["fetch_link_fraction"], result["publish"]
    console.print(
        f"delta {_fmt(result['delta_bytes'] and result['delta_bytes'] / 1e6, '.1f')} MB, full "
        f"{result['full_bytes'] / 1e6:.0f} MB; fetch over {f['link']}: 1 connection {_fmt(f['1'], '.3f')}, "
        f"{f['connections']} connections {_fmt(f['N'], '.3f')} of the link; publish {p['publish_s']:.2f} s "
        f"(extract {p['extract_s']:.2f} s, upload {p['upload_s']:.2f} s: {p['vs_max']:.2f}x max, "
        f"{p['vs_sum']:.2f}x sum); peak RSS {result['peak_rss_mb']['bench']:.0f} MB"
    )
    for name, met in result["targets"].items():
        console.print(f"  {'[green]met[/]' if met else '[red]missed[/]'}  {name}")


@dataclass(kw_only=True, slots=True)
class Flags(Output):
    """The command line of ``aurora bench transfer``."""

    quick: bool = False
    """The small preset (``QUICK``: fewer layers, a smaller vocab, fewer versions) instead of ``FULL``."""
    layers: int | None = field(default=None, metadata=option(parse=positive))
    """Decoder layers (default: the preset's)."""
    vocab: int | None = field(default=None, metadata=option(parse=positive))
    """Embedding rows (default: the preset's; Qwen3's 151936 for ``FULL``)."""
    versions: int | None = field(default=None, metadata=option(parse=positive))
    """Timed versions per mode (default: the preset's)."""
    actors: int | None = field(default=None, metadata=option(parse=positive))
    """Actors per region (default: the preset's)."""
    connections: int | None = field(default=None, metadata=option(parse=positive))
    """Parallel GETs across a link (default: the preset's)."""
    modes: tuple[str, ...] | None = field(default=None, metadata=option(parse=comma_list))
    """Comma-separated subset of the modes (default: the preset's, all of them)."""
    seed: int = 0
    """Trace seed."""


def config_from(args: Flags) -> Config:
    return overridden(QUICK if args.quick else FULL, args)


def run(args: Flags) -> int:
    return emit(measure(config_from(args), progress=True), args, lambda r: render(r, Console()))
