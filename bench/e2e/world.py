"""``aurora bench e2e --world four-regions``: step time, link bytes and egress dollars in a four-region world
with a 0.25 Gbps region, a region across clouds (``gs://``), a relay tree and spot churn.

The world is `bench.emulation.regions` (link table: `bench.emulation.links`), the modes
`bench.e2e.regions`, the churn schedule `bench.fleet.churn` and the price table
`bench.emulation.egress`. Generation and training are stand-ins of fixed duration
(given, not calibrated: every mode meets the same G); every byte of weights really moves. The JSON reports,
per mode and per region, step time against ideal, stalls, time from publish to the last actor of each
region applied (p50/p95), bytes down each link per step and their dollars per 1,000 steps, a projection to
an 8B-parameter model at 1% density, the targets, and what the 2 shared cores bound.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.codec.workload import make_workload
from bench.e2e import regions as e2e_regions
from bench.e2e.loop import Timing
from bench.e2e.regions import MODES, Sizes
from bench.emulation import egress, links
from bench.emulation.world import MIB, cpus, own_peak_rss_mb, redis_kind
from bench.fleet import churn


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    layers: int = 3
    vocab: int | None = 16384
    seed: int = 0
    first_step: int = 3
    warmup_steps: int = 2
    steps: int = 8
    async_level: int = 1
    actors: int = 3
    """Actors per region at the start (churn replaces the ones it takes)."""
    generation_s: float = 3.0
    """One batch's generation stand-in (given: every mode meets the same window)."""
    training_frac: float = 0.2
    churn_rate: float = 0.1
    """Fraction of the fleet preempted per 10 steps (and as many joining)."""
    connections: int = 64
    part_bytes: int = 1 * MIB
    full_part_bytes: int = 16 * MIB
    segment_bytes: int = 4 * MIB
    shard_bytes: int = 16 * MIB
    modes: tuple[str, ...] = MODES
    verify_live: bool = True
    timeout_s: float = 1800.0

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.steps


DEFAULT = Config()
"""~64M parameters (128 MB BF16, deltas ~1.3 MB), 3 actors in each of 4 regions, 8 timed steps per mode: sized
so that the five modes run in about 10 minutes on 2 shared cores."""
QUICK = Config(layers=1, vocab=1024, warmup_steps=1, steps=3, actors=2, generation_s=1.0, full_part_bytes=2 * MIB)
"""One layer, vocab 1024 (~17M parameters), 2 actors per region, 3 timed steps: a check that it all runs."""
PRESETS = {"default": DEFAULT, "--quick": QUICK}


def measure(cfg: Config, progress: bool = False) -> dict[str, Any]:
    from bench.codec import trace
    from bench.emulation.regions import Regions

    unknown = set(cfg.modes) - set(MODES)
    if unknown or "ideal" not in cfg.modes:
        raise ValueError(f"modes must include ideal and be among {list(MODES)}, got {list(cfg.modes)}")
    started = time.perf_counter()
    timing = Timing(
        generation_s=cfg.generation_s,
        training_s=cfg.training_frac * cfg.generation_s,
        warmup_steps=cfg.warmup_steps,
        timed_steps=cfg.steps,
        async_level=cfg.async_level,
        step_timeout_s=cfg.timeout_s,
    )
    fleet = e2e_regions.fleet(cfg.actors)
    events = churn.schedule(fleet, 1, cfg.total_steps, cfg.churn_rate, cfg.seed)
    sizes = Sizes(
        connections=cfg.connections,
        part_bytes=cfg.part_bytes,
        full_part_bytes=cfg.full_part_bytes,
        segment_bytes=cfg.segment_bytes,
        shard_bytes=cfg.shard_bytes,
        verify_live=cfg.verify_live,
        timeout_s=cfg.timeout_s,
    )
    console = Console(stderr=True)
    with (
        Progress(console=console, disable=not (progress and console.is_terminal), transient=True) as bar,
        contextlib.ExitStack() as stack,
    ):
        task = bar.add_task("trace", total=None)

        def tick(what: str | None = None) -> None:
            bar.update(task, advance=1, description=what)

        work = make_workload(cfg.layers, cfg.vocab, cfg.seed, cfg.first_step, cfg.total_steps, tick)
        t_trace = time.perf_counter()
        worlds: list[Regions] = []

        def world() -> Regions:
            worlds.append(Regions(stack, cfg.seed))
            return worlds[0]

        raw = e2e_regions.run_all(cfg.modes, world, work, sizes, cfg.actors, timing, events, tick)
        rss: dict[str, Any] = {"bench": own_peak_rss_mb()}
        if worlds:
            rss["servers"] = {n: b.peak_rss_mb() for n, b in worlds[0].sites.items()}
    shape = trace.Shape(layers=cfg.layers, vocab=trace.QWEN3_0_6B.vocab if cfg.vocab is None else cfg.vocab)
    result: dict[str, Any] = {
        "bench": "e2e",
        "world": "four-regions",
        "emulated": True,
        "note": "emulation with stand-ins: generation and training are sleeps of fixed durations; every byte of "
        "weights moves over loopback through userspace WAN proxies (one process per link) to per-region bucket "
        f"servers (moto for s3://, fake-gcs-server for gs://), and all processes share {cpus()} CPU cores",
        "redis": redis_kind(worlds[0].redis) if worlds else None,
        "model": f"Qwen3-0.6B-shaped ({cfg.layers} layers, vocab {shape.vocab})",
        "params": trace.parameter_count(cfg.layers, shape.vocab),
        "model_bytes": work.full_bytes,
        "sites": [dataclasses.asdict(s) for s in links.SITES],
        "links": links.table(),
        "tree_sources": links.TREE_SOURCES,
        "actors_per_region": cfg.actors,
        "generation_s": timing.generation_s,
        "training_s": timing.training_s,
        "churn": churn.describe(events, len(fleet), cfg.total_steps, cfg.churn_rate, cfg.seed),
        "prices": egress.table(),
        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(cfg).items()},
        "peak_rss_mb": rss,
        "phase_seconds": {"trace": t_trace - started, "modes": time.perf_counter() - t_trace},
    }
    from bench.e2e.world_report import summarize

    out = summarize(result, raw, timing)
    out["seconds"] = time.perf_counter() - started
    return out


def render(result: dict[str, Any], console: Console) -> None:
    table = Table(
        title=f"e2e four-regions: {result['model']}, {result['actors_per_region']} actors per region, churn "
        f"{result['churn']['preempted']} preempted / {result['churn']['joined']} joined (emulated WANs, stand-ins)",
        caption=f"generation {result['generation_s']:.2f} s, training {result['training_s']:.2f} s per step",
    )
    for col in ("mode", "step s", "vs ideal", "slowest region", "p95 applied s", "GB/1k steps", "$ / 1k steps"):
        table.add_column(col, justify="right")
    for mode, m in result["modes"].items():
        regions = m.get("regions", {})
        slow = max(regions, key=lambda r: regions[r]["applied_s"]["p95"] or 0, default=None) if regions else None
        table.add_row(
            mode,
            f"{m['step_time_s']:.2f}",
            f"{m['vs_ideal']:.3f}",
            slow or "-",
            "-" if slow is None else f"{regions[slow]['applied_s']['p95']:.2f}",
            f"{m.get('link_bytes_per_step_total', 0) * 1000 / 1e9:.2f}",
            f"{m.get('usd_per_1000_steps', 0):.2f}",
        )
    console.print(table)
    for name, t in result["targets"].items():
        console.print(f"  {'[green]met[/]' if t.get('met') else '[red]missed[/]'}  {name}: {t['definition']}")
