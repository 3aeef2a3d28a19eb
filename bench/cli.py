"""``aurora bench NAME``: registered through the ``aurora.commands`` entry point, like the roles.

Each benchmark is a module (:data:`BENCHMARKS`) with a ``Flags`` dataclass (its command line, derived by
:func:`aurora_store.config.options.add_options` as the roles' are), ``run(flags)``, and ``PRESETS`` when
some flags default to a preset's values (``--help`` shows them). It is imported only when it runs,
so ``aurora --help`` stays fast. Every benchmark prints one JSON object with ``--json`` and a table
otherwise.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

BENCHMARKS = {
    "codec": (
        "bench.codec.codec",
        "size and speed of the sparse BF16 codec; see --help",
    ),
    "transfer": (
        "bench.transfer.transfer",
        "time to apply a version in every region over emulated WANs; see --help",
    ),
    "schedule": (
        "bench.fleet.schedule",
        "step makespan of the EMA batch split vs uniform and ideal; see --help",
    ),
    "e2e": (
        "bench.e2e.e2e",
        "RL step time with deltas+relays vs full broadcast vs no transfer, over emulated WANs; see --help",
    ),
    "full": (
        "bench.store.full",
        "publish and materialize a full version against safetensors' own save and verified read; see --help",
    ),
    "chaos": (
        "bench.chaos.chaos",
        "the whole system as real processes under a seeded schedule of faults; invariants checked; see --help",
    ),
    "fuzz": (
        "bench.fuzz.fuzz",
        "every parser of outside bytes under mutated inputs: crashes, hangs, peak memory; see --help",
    ),
    "retention": (
        "bench.store.retention",
        "a run's storage with aurora gc every few versions against the same run never collected; see --help",
    ),
    "engine": (
        "bench.codec.engine",
        "pause to apply a ~1%% delta on a real vLLM engine vs its full reload and a restart; see --help",
    ),
    "state": (
        "bench.store.state",
        "what saving the trainer state of every version costs the training thread; see --help",
    ),
    "identity": (
        "bench.fleet.identity",
        "actor identities: sign and check microseconds per result, admission signed vs unsigned; see --help",
    ),
    "recipe": (
        "bench.recipe",
        "whether aurora demo's recipe learns: reward rise, verified versions, delta sizes; see --help",
    ),
    "catchup": (
        "bench.transfer.catchup",
        "a lagging actor's path to the latest version: delta chain vs latest full plus chain; see --help",
    ),
    "coord": (
        "bench.fleet.coord",
        "one Redis and one trainer against 8..1024 actors: round trips, Redis CPU, bytes, memory; see --help",
    ),
    "dispatch": (
        "bench.fleet.dispatch",
        "the trainer's dispatch against Redis writers: fake and hung actors, forged results; see --help",
    ),
    "quant": (
        "bench.codec.quant",
        "FP8 and INT8 rollout weights vs BF16 on one Adam trace: words and scales changed, delta bytes; see --help",
    ),
    "walk": (
        "bench.structure.walk",
        "the modules a publish and an actor's stage call walk through; the longest modules and classes; see --help",
    ),
}
"""Each benchmark's module (grouped by concern: bench/chaos, bench/fuzz, bench/e2e, ...) and what it
measures, as ``aurora bench --help`` lists it."""


def register(sub: Any) -> None:
    p = sub.add_parser("bench", help="benchmarks (print JSON with --json)")
    names = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for name, (_, about) in BENCHMARKS.items():
        names.add_parser(name, add_help=False, help=about).set_defaults(handler=main, parses_rest=True)


def main(args: argparse.Namespace) -> int:
    """Import the benchmark's module, parse the rest of the command line (``args.rest``) into its
    ``Flags``, and run it."""
    from aurora_store.config.options import build
    from bench.output import parser_for

    module = importlib.import_module(BENCHMARKS[args.bench][0])
    parser = parser_for(args.bench, module.Flags, module.__doc__, getattr(module, "PRESETS", None))
    return int(module.run(build(module.Flags, parser.parse_args(args.rest))) or 0)
