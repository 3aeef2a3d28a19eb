"""Coordination at fleet scale: one Redis and one trainer against 8 to 1024 actors.

For each row ``ACTORSxGROUPSxTOKENS`` a fresh ``redis-server`` is started and a tiny run is
published to a local bucket; a real trainer :class:`~trainer.dispatch.Dispatcher` posts each
step's ``GROUPS`` prompts as leased jobs, sweeps and admits; ``ACTORS`` real actor
:class:`~actor.worker.Actor` loops (threads of this process, :mod:`bench.fleet.actors`) take
them, "generate" at once ``group`` completions of ``TOKENS`` tokens each and submit results as
the worker builds them. Measured per row:

- ``sweep``: one trainer sweep with every actor registered and the step's jobs open (before the
  actors start taking them): round trips and seconds, against its interval (``sweep_s``);
- ``steps``: per step, the round trips every client made (counted in the client library: a
  pipeline is one), the commands Redis ran (``INFO``, script-internal ones included), Redis CPU
  seconds (``INFO cpu``), bytes in and out of Redis (``INFO stats``), Redis memory after it, and the
  trainer's wall time from posting to the last admission;
- ``idle``: round trips per second per actor while every actor waits for work, and Redis CPU per actor
  (Redis's own background work, its cron and a cluster's bus, measured for 3 s before any client
  connects, subtracted; the figure with it is kept beside it);
- ``admission``: the trainer's decoding and checking of results read from Redis, in completion
  tokens per second (CPU of one thread; no Redis in the timing).

``--idle-actors N`` adds N idle actors to every row (:class:`bench.fleet.actors.Listeners`): what an idle
actor runs against Redis, its listener and its beat on one connection, one thread each; a real actor's
whole loop is six threads, and 10,000 of them on two cores starve on the interpreter lock. So
``--rows 16x16x64 --idle-actors 9984`` measures 10,000 actors on one Redis (on two cores; there, 256 working
actors running a large step beside 9,744 idle ones were starved of CPU until their heartbeats lapsed).

Projections: Redis CPU as a fraction of one core at one step per 30 s (the step's CPU plus the
idle actors' CPU over the rest of the 30 s), and bytes through Redis per completion token.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from aurora_store.config.options import option, positive
from bench.output import Output, overridden

ROWS = "8x64x256,256x512x4096,1024x512x4096,1024x512x16384"


@dataclass(frozen=True, slots=True)
class Config:
    rows: str = ROWS
    """``ACTORSxGROUPSxTOKENS`` rows, comma-separated."""
    steps: int = 2
    group: int = 8
    vocab: int = 32000
    idle_s: float = 15.0
    sweep_s: float = 0.25
    step_period_s: float = 30.0
    """The step period the Redis CPU projection assumes."""
    procs: int = 0
    """Processes the actors run in (0: one per 128 actors)."""
    seed: int = 0
    cluster: int = 0
    """Masters of a Redis Cluster to run on (0: one redis-server)."""
    idle_actors: int = 0
    """Idle actors added to every row (:class:`bench.fleet.actors.Listeners`: the idle actor's own loop)."""
    idle_procs: int = 0
    """Processes the idle actors run in (0: one per 2,500)."""


_DEFAULT = Config()


@dataclass(kw_only=True, slots=True)
class Flags(Output):
    """The command line of ``aurora bench coord``."""

    rows: str = _DEFAULT.rows
    """ACTORSxGROUPSxTOKENS,..."""
    steps: int = field(default=_DEFAULT.steps, metadata=option(parse=positive))
    """Steps per row."""
    group: int = field(default=_DEFAULT.group, metadata=option(parse=positive))
    """Completions per prompt."""
    vocab: int = field(default=_DEFAULT.vocab, metadata=option(parse=positive))
    """Vocabulary size of the token ids."""
    idle_s: float = _DEFAULT.idle_s
    """Seconds the idle fleet is measured."""
    sweep_s: float = _DEFAULT.sweep_s
    """The trainer's sweep interval."""
    step_period_s: float = _DEFAULT.step_period_s
    """Step period of the CPU projection."""
    procs: int = _DEFAULT.procs
    """Processes the actors run in (0: one per 128)."""
    seed: int = _DEFAULT.seed
    """Seeds the completions."""
    cluster: int = _DEFAULT.cluster
    """Run on a Redis Cluster of this many masters (0: one redis-server)."""
    idle_actors: int = _DEFAULT.idle_actors
    """Idle actors added to every row beside its ACTORS: each the idle actor's own loop (its listener and
    beat, one thread and one connection), registered without a version so the trainer leases it nothing."""
    idle_procs: int = _DEFAULT.idle_procs
    """Processes the idle actors run in (0: one per 2,500)."""


class Probe:
    """Redis's own counters (``INFO``) of each server (a cluster's masters), summed, each server's CPU
    kept too (``cpu_s@i``); read by clients of its own."""

    def __init__(self, ports: list[int]) -> None:
        import redis

        self.rs = [redis.Redis(port=p, decode_responses=True) for p in ports]

    def read(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for i, r in enumerate(self.rs):
            info = r.info("all")
            calls = sum(float(v["calls"]) for k, v in info.items() if k.startswith("cmdstat_") and isinstance(v, dict))
            cpu = float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
            mine = {
                "commands": float(info["total_commands_processed"]),
                "calls": calls,  # by command, the commands scripts ran included
                "cpu_s": cpu,
                "bytes": float(info["total_net_input_bytes"]) + float(info["total_net_output_bytes"]),
                "memory": float(info["used_memory"]),
                "clients": float(info["connected_clients"]),
                "connections_opened": float(info["total_connections_received"]),
            }
            for k, v in mine.items():
                out[k] = out.get(k, 0.0) + v
            out[f"cpu_s@{i}"] = cpu
        return out

    def close(self) -> None:
        for r in self.rs:
            r.close()


def _delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: b[k] - a[k] for k in a if k not in ("memory", "clients")}


def _split(delta: dict[str, float], background: dict[str, float] | None = None) -> dict[str, Any]:
    """How a measured span's Redis CPU split over the servers (less each one's ``background`` CPU over
    the span, if given): each one's share, and the largest over an even share."""
    less = background or {}
    parts = [max(v - less.get(k, 0.0), 0.0) for k, v in sorted(delta.items()) if k.startswith("cpu_s@")]
    total = sum(parts)
    if len(parts) < 2 or total <= 0:  # one server, or nothing measured above the background: even
        return {"shares": [round(1 / len(parts), 3)] * len(parts) if parts else [], "max_over_even": 1.0}
    return {
        "shares": [round(p / total, 3) for p in parts],
        "max_over_even": round(max(parts) / (total / len(parts)), 3),
    }


def _rows(spec: str) -> list[tuple[int, int, int]]:
    out = []
    for part in spec.split(","):
        bits = part.strip().lower().split("x")
        if len(bits) != 3 or not all(b.isdigit() and int(b) > 0 for b in bits):
            raise SystemExit(f"aurora bench coord: a row is ACTORSxGROUPSxTOKENS, got {part!r}")
        out.append((int(bits[0]), int(bits[1]), int(bits[2])))
    return out


def measure(cfg: Config) -> dict[str, Any]:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a connection or two per actor
    from bench.fleet.actors import RoundTrips

    trips = RoundTrips()
    try:
        rows = [_row(cfg, *row, trips) for row in _rows(cfg.rows)]
    finally:
        trips.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    clients = (
        "actors: real Actor loops, threads of one process, or of --procs processes (one per 128 actors by default);"
        " --idle-actors: the idle actor's own loop (its listener and beat, one thread each), in --idle-procs"
        " processes (one per 2,500), registered without a version, so leased nothing"
    )
    return {"bench": "coord", "config": asdict(cfg), "clients": clients, "rows": rows}


def _row(cfg: Config, actors: int, groups: int, tokens: int, trips: Any) -> dict[str, Any]:
    import logging

    import torch

    import aurora_store
    from aurora_store.coord.coordinator import Coordinator
    from aurora_store.coord.jobs import JobBoard
    from aurora_store.rl.sampling import SamplingConfig
    from aurora_store.rl.tasks import Prompt
    from aurora_store.testing.redis_cluster import RedisCluster
    from aurora_store.testing.redis_server import RedisServer
    from bench.fleet.actors import Fleet, Procs
    from trainer.config import ScheduleConfig
    from trainer.dispatch import Dispatcher

    logging.getLogger("aurora").setLevel(logging.ERROR)
    root = tempfile.mkdtemp(prefix="aurora-bench-coord-")
    store = f"file://{root}/run"
    run = aurora_store.open_run(store)
    info = run.publish({"w": torch.zeros(64, dtype=torch.bfloat16)})
    run_id = "bench"
    server: Any = RedisCluster(masters=cfg.cluster) if cfg.cluster else RedisServer()
    with server.start():
        masters = server.primaries() if cfg.cluster else [server]
        probe = Probe([m.port for m in masters])
        import resource

        room = max(
            10_000, min(2 * (actors + cfg.idle_actors) + 100, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 64)
        )
        for r in probe.rs:  # room for every actor's connections, as far as the server's file limit allows
            r.config_set("maxclients", room)
        # Redis's own background work (its cron; a cluster's bus), measured before any client: not the actors'
        b0, q0 = probe.read(), time.perf_counter()
        time.sleep(3.0)
        quiet_span, quiet_s = _delta(b0, probe.read()), time.perf_counter() - q0
        background = quiet_span["cpu_s"] / quiet_s
        per_node_background = {k: v / quiet_s for k, v in quiet_span.items() if "@" in k}
        coord = Coordinator(server.url, run_id)
        board = JobBoard(coord)
        sampling = SamplingConfig(group=cfg.group, max_new_tokens=tokens)
        d = Dispatcher(
            coord,
            board,
            schedule=ScheduleConfig(sweep_s=cfg.sweep_s, lease_s=600.0),
            sampling=sampling,
            vocab_size=cfg.vocab,
            tag="bench",
            stores={"home": run.store},
        )
        d.published_version(0, info.version_hash, info.weights_digest)

        def prompts(step: int) -> list[Prompt]:
            return [Prompt(f"p{step}-{i}", "q", "a", (1, 2, 3)) for i in range(groups)]

        t0 = time.perf_counter()
        spec: dict[str, Any] = {"store": store, "redis": server.url, "run_id": run_id, "tokens": tokens}
        spec["group"] = cfg.group
        spec["vocab"] = cfg.vocab
        idle_fleet: Any = None
        if cfg.idle_actors:
            idle_n = cfg.idle_procs or -(-cfg.idle_actors // 2500)
            idle_fleet = Procs(cfg.idle_actors, idle_n, workdir=root, listeners=True, **spec)
        idle_built_s = time.perf_counter() - t0
        nprocs = cfg.procs or -(-actors // 128)
        fleet: Any = Fleet(actors, **spec) if nprocs <= 1 else Procs(actors, nprocs, workdir=root, **spec)
        built_s = time.perf_counter() - t0 - idle_built_s
        procs = isinstance(fleet, Procs)
        working, actors = actors, actors + cfg.idle_actors  # the per-actor figures are over the whole fleet

        def fleet_trips() -> int:
            """The working actors' round trips so far, as their processes count them (asked first, before a
            span's Redis counters are read: a process of thousands of threads may take a while to answer).
            The idle actors' are Redis's count of commands (``commands_per_actor_s``)."""
            return int(fleet.trips()) if procs else 0

        # one sweep, with every actor registered and the step's jobs open
        n0 = trips.now()
        d.post(1, prompts(1))
        post_trips = trips.now() - n0 - 1
        sweeps = []
        for _ in range(3):
            a, n0, s0 = probe.read(), trips.now(), time.perf_counter()
            d.leases.sweep()
            sweeps.append((time.perf_counter() - s0, trips.now() - n0 - 1, _delta(a, probe.read())["commands"] - 1))
        sweep_s = statistics.median(s for s, _, _ in sweeps)

        if not procs:
            fleet.start()
        d.start()  # as the trainer does: sweeps, reads and admits on a thread of its own
        steps = []
        for step in range(1, cfg.steps + 1):
            f0 = fleet_trips()
            a, n0, s0 = probe.read(), trips.now(), time.perf_counter()
            if step > 1:
                d.post(step, prompts(step))
            results = d.collect(step)
            wall = time.perf_counter() - s0
            b = probe.read()
            delta = _delta(a, b)
            done_tokens = sum(r.rollouts.n_tokens for r in results)
            steps.append(
                {
                    "step": step,
                    "round_trips": trips.now() - n0 - 2 + fleet_trips() - f0,
                    "redis_commands": delta["commands"] - 2,
                    "redis_cpu_s": round(delta["cpu_s"], 4),
                    "redis_cpu_split": _split(delta),
                    "bytes": int(delta["bytes"]),
                    "memory_after": int(b["memory"]),
                    "collect_s": round(wall, 4),
                    "tokens": done_tokens,
                    "admitted": len(results),
                }
            )

        # idle: every actor waits for work (the trainer's own sweeps and reads are not the actors')
        d.stop()
        quiet = []  # a sweep of the whole fleet at rest: what each one costs, alive and registered
        for _ in range(5):
            n0, s0 = trips.now(), time.perf_counter()
            d.leases.sweep()
            quiet.append((time.perf_counter() - s0, trips.now() - n0 - 1))
        time.sleep(1.0)
        f0, t_f0 = fleet_trips(), time.perf_counter()
        a, n0, s0 = probe.read(), trips.now(), time.perf_counter()
        time.sleep(cfg.idle_s)
        idle_wall = time.perf_counter() - s0
        idle_end = probe.read()
        idle = _delta(a, idle_end)
        made = fleet_trips() - f0 if procs else trips.now() - n0 - 1
        idle_trips = made / (time.perf_counter() - t_f0 if procs else idle_wall) / working
        idle_cpu = max(idle["cpu_s"] / idle_wall - background, 0.0) / actors
        fleet.stop()
        if idle_fleet is not None:
            idle_fleet.stop()
        local = Fleet(1, first=working, **spec) if procs else fleet  # an Actor to encode and submit with
        admission = _admission(d, board, local, cfg, tokens)
        d.close()
        admission["during_steps_tokens_per_cpu_s"] = round(d.payloads.tokens / max(d.payloads.cpu_s, 1e-9))
        coord.close()
        probe.close()
    last = steps[-1]
    step_cpu = last["redis_cpu_s"]
    rest = max(cfg.step_period_s - last["collect_s"], 0.0)
    idle_split = _split(idle, {k: v * idle_wall for k, v in per_node_background.items()})
    # each server's CPU over one step period: its share of the step's, and of the idle fleet's for the rest
    per_period = {
        f"cpu_s@{i}": a * step_cpu + b * idle_cpu * actors * rest
        for i, (a, b) in enumerate(zip(last["redis_cpu_split"]["shares"], idle_split["shares"], strict=True))
    }
    return {
        "actors": actors,
        "working_actors": working,
        "idle_actors": cfg.idle_actors,
        "idle_actors_built_s": round(idle_built_s, 2),
        "groups": groups,
        "tokens": tokens,
        "fleet_built_s": round(built_s, 2),
        "processes": nprocs,
        "redis": f"a Redis Cluster of {cfg.cluster} masters" if cfg.cluster else "one redis-server",
        "post_round_trips": post_trips,
        "sweep": {
            "round_trips": sweeps[1][1],
            "redis_commands": sweeps[1][2],
            "seconds": round(sweep_s, 5),
            "fraction_of_interval": round(sweep_s / cfg.sweep_s, 4),
            "at_rest_round_trips": quiet[2][1],
            "at_rest_seconds": round(statistics.median(q for q, _ in quiet), 5),
            "at_rest_fraction_of_interval": round(statistics.median(q for q, _ in quiet) / cfg.sweep_s, 4),
        },
        "steps": steps,
        "idle": {
            "round_trips": int(made),
            "seconds": round(idle_wall, 3),
            "round_trips_per_actor_s": round(idle_trips, 3),
            "round_trips_counted_for": "the working actors" if cfg.idle_actors else "every actor",
            "redis_cpu_per_actor_s": idle_cpu,
            "redis_cpu_per_actor_s_with_background": idle["cpu_s"] / idle_wall / actors,
            "redis_background_cpu_per_s": round(background, 6),
            "redis_commands_per_s": round(idle["commands"] / idle_wall, 1),
            "commands_per_actor_s": round(idle["calls"] / idle_wall / actors, 3),
            "connections_per_actor": round(idle_end["clients"] / actors, 2),
            "connections_opened_per_actor_s": round(idle["connections_opened"] / idle_wall / actors, 3),
            "redis_cpu_split": idle_split,
        },
        "admission": admission,
        "bytes_per_token": round(last["bytes"] / max(last["tokens"], 1), 3),
        "redis_core_fraction_at_period": round((step_cpu + idle_cpu * actors * rest) / cfg.step_period_s, 4),
        "redis_cpu_split_at_period": _split(per_period),
        "memory_growth_per_step": (steps[-1]["memory_after"] - steps[0]["memory_after"]) / max(len(steps) - 1, 1),
        "projected_actors": _projection(step_cpu, idle_cpu, idle_end["clients"] / actors, cfg.step_period_s),
    }


def _projection(step_cpu: float, idle_cpu: float, conns: float, period: float) -> dict[str, int | None]:
    """How many actors one Redis core serves at one step per ``period``: the step's own Redis CPU
    is fixed by the work (groups x tokens), each actor adds its idle cost; and the connections
    they hold against Redis's default ``maxclients`` of 10,000."""
    out: dict[str, int | None] = {}
    for name, share in (("at_10pct_core", 0.10), ("at_50pct_core", 0.50)):
        left = share * period - step_cpu
        out[name] = int(left / (idle_cpu * period)) if idle_cpu > 0 and left > 0 else None
    out["by_default_maxclients"] = int(10_000 / conns) if conns > 0 else None
    return out


def _admission(d: Any, board: Any, fleet: Any, cfg: Config, tokens: int) -> dict[str, Any]:
    """Decode and check results as the trainer does (:class:`trainer.admission.Payloads`), on results
    the actor's own code encoded and submitted (inline or by reference, as it chooses): thread CPU
    of the decoding and checking, fetches from the bucket excluded."""
    from aurora_store.coord.lease import Lease
    from aurora_store.format import results as payloads

    w = fleet.workers[0]
    applied = w.up.applied
    comp = w.engine.completion
    n = 64
    lease = Lease("bench:1:0", 1, 1, 0, 0, {})
    rows = [(comp.token_ids, comp.logprobs, "length", 0.0)] * cfg.group
    t0 = time.process_time()
    data = payloads.encode(rows, failures={}, weights_digest=applied.weights_digest)
    encode_s = time.process_time() - t0
    after = board.results.last_id()
    for _ in range(n):
        w.outbox.submit(lease, applied.version, applied.version_hash, data)
    got: list[Any] = []
    while len(got) < n:
        got += board.results.read(got[-1].id if got else after, block_ms=100)
    cpu0, tok0 = d.payloads.cpu_s, d.payloads.tokens
    decoded = d.payloads.decode_all(got)
    cpu = d.payloads.cpu_s - cpu0
    ok = sum(r is not None and why is None for r, why in decoded)
    return {
        "results": n,
        "admitted": ok,
        "payload_bytes": len(data),
        "by_reference": sum(r.ref is not None for r in got),
        "encode_tokens_per_s": round(cfg.group * tokens / max(encode_s, 1e-9)),
        "tokens_per_s": round((d.payloads.tokens - tok0) / max(cpu, 1e-9)),
        "bytes_per_token_in_redis": round(sum(len(r.inline or b"") for r in got) / (n * cfg.group * tokens), 3),
    }


def run(args: Flags) -> int:
    out = measure(overridden(_DEFAULT, args))
    if args.json:
        print(json.dumps(out))
        return 0
    for r in out["rows"]:
        s = r["steps"][-1]
        print(
            f"{r['actors']:5d} actors {r['groups']:4d} groups {r['tokens']:6d} tokens: "
            f"{s['round_trips']} round trips/step, {s['bytes'] / 1e6:.1f} MB, collect {s['collect_s']:.2f} s, "
            f"sweep {r['sweep']['round_trips']} trips {r['sweep']['seconds'] * 1000:.1f} ms, "
            f"idle {r['idle']['round_trips_per_actor_s']:.2f}/actor/s, admission "
            f"{r['admission']['tokens_per_s'] / 1e6:.1f}M tokens/s, Redis {r['redis_core_fraction_at_period']:.1%} "
            "of a core"
        )
    return 0
