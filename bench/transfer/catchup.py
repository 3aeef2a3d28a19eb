"""Catch-up: what a lagging actor fetches to reach the latest version from K versions behind.

A publisher writes the reference trace (``bench.codec.trace``: a Qwen3-shaped model under Adam, BF16) to a
local bucket as the trainer would (``kind="auto"``: a full version every ``--full-every``, or sooner
when the delta chain since the last full would cost more than a full copy). For each K an
:class:`actor.updater.Updater` holding version t - K asks ``route(t)`` for its path to t, for every
target t it can reach in the run; the bench reports, for the last version, the bytes of the chain as
published (every version from the applied one on: a full version stands in the chain in place of its
delta, the format stores no delta for it), the bytes of the latest full in the window plus the
deltas after it, the Updater's choice and its ratio to the cheaper of the two, then stages and
applies that path (digest-checked) and times it. Over every target, the worst ratio.

A second run of the same trace published as deltas only says what the chain would cost if every
version also had a delta (labelled: such a chain cannot be fetched from the first run), so the
report shows whether a long chain costs more than a full.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from aurora_store.config.options import option, positive
from bench.output import Output, comma_list, overridden

TARGET = 1.05
"""The Updater's choice may cost at most this much more than the cheaper option."""


@dataclass(frozen=True, slots=True)
class Config:
    layers: int = 2
    """Decoder layers of the Qwen3-0.6B-shaped trace (0: the embedding and final norm only)."""
    vocab: int = 16384
    """Embedding rows."""
    ks: tuple[int, ...] = (1, 10, 50)
    """How many versions behind the lagging actor is."""
    versions: int = 55
    """Versions published after version 0 (at least the largest K). The last is the headline target:
    55 with fulls every 20 puts no full within 10 versions of it and two within 50."""
    full_every: int = 20
    """The publisher's full-version period (``RunConfig.full_every``)."""
    first_step: int = 3
    """Trace step published as version 0."""
    seed: int = 0


DEFAULT = Config()
QUICK = Config(layers=0, vocab=2048, versions=52, full_every=12)
"""A few seconds: the embedding of a 2048-token vocabulary (2M BF16 weights), 52 versions."""
PRESETS = {"default": DEFAULT, "--quick": QUICK}


def positive_list(text: str) -> tuple[int, ...]:
    """An argparse type: comma-separated integers >= 1."""
    return tuple(positive(t) for t in comma_list(text))


@dataclass(kw_only=True, slots=True)
class Flags(Output):
    """The command line of ``aurora bench catchup``."""

    quick: bool = False
    """The small preset (``QUICK``) instead of the default."""
    layers: int | None = None
    """Decoder layers (default: the preset's)."""
    vocab: int | None = field(default=None, metadata=option(parse=positive))
    """Embedding rows (default: the preset's)."""
    ks: tuple[int, ...] | None = field(default=None, metadata=option(parse=positive_list))
    """Comma-separated lags K (default: the preset's)."""
    versions: int | None = field(default=None, metadata=option(parse=positive))
    """Versions after version 0 (default: the preset's)."""
    full_every: int | None = field(default=None, metadata=option(parse=positive))
    """A full version every this many (default: the preset's)."""
    seed: int = 0
    """Trace seed."""


def config_from(args: Flags) -> Config:
    return overridden(QUICK if args.quick else DEFAULT, args)


def measure(cfg: Config) -> dict[str, Any]:
    import aurora_store
    from actor.updater import Updater
    from bench.codec.workload import make_workload

    if not cfg.ks or min(cfg.ks) < 1 or max(cfg.ks) > cfg.versions:
        raise ValueError(f"every K must be in [1, versions={cfg.versions}], got {list(cfg.ks)}")
    started = time.perf_counter()
    work = make_workload(cfg.layers, cfg.vocab, cfg.seed, cfg.first_step, cfg.versions, lambda: None)
    root = tempfile.mkdtemp(prefix="aurora-bench-catchup-")
    run = aurora_store.open_run(f"file://{root}/run", full_every=cfg.full_every)
    deltas = aurora_store.open_run(f"file://{root}/deltas-only")
    versions = work.versions()
    try:
        for v, words in versions:
            run.publish_words(work.specs, words, kind="full" if v == 0 else "auto", step=work.steps[v])
            deltas.publish_words(work.specs, words, kind="full" if v == 0 else "delta", step=work.steps[v])
    finally:
        versions.close()
    manifests = [run.reader.manifest(v) for v in range(cfg.versions + 1)]
    only = [deltas.reader.manifest(v).stats.bytes for v in range(cfg.versions + 1)]
    size = [m.stats.bytes for m in manifests]
    fulls = [m.version for m in manifests if m.kind == "full"]

    def options(applied: int, target: int) -> dict[str, Any]:
        window = range(applied + 1, target + 1)
        full = max((f for f in fulls if applied < f <= target), default=None)
        chain = sum(size[v] for v in window)
        via_full = None if full is None else sum(size[v] for v in range(full, target + 1))
        return {"chain_bytes": chain, "latest_full": full, "full_plus_chain_bytes": via_full}

    def choice(u: Updater, target: int, opt: dict[str, Any]) -> dict[str, Any]:
        path = u.route(target)
        took = "full+chain" if path[0].kind == "full" else "chain"
        fetched = sum(m.stats.bytes for m in path)
        cheaper = min(b for b in (opt["chain_bytes"], opt["full_plus_chain_bytes"]) if b is not None)
        return {"choice": took, "choice_bytes": fetched, "ratio_to_cheaper": fetched / cheaper}

    per_k: dict[str, Any] = {}
    for k in cfg.ks:
        u = Updater(aurora_store.open_run(f"file://{root}/run"), region="bench")
        u.bootstrap(0)
        sweep = []
        for target in range(k, cfg.versions + 1):
            applied = target - k
            if u.applied is not None and u.applied.version < applied:
                u.stage(applied)
                u.apply()
            sweep.append(choice(u, target, options(applied, target)))
        last = cfg.versions
        opt = options(last - k, last)
        head = {"target": last, "applied": last - k, **opt, **sweep[-1]}
        head["deltas_only_chain_bytes"] = sum(only[last - k + 1 : last + 1])
        t = time.perf_counter()
        staged = u.stage(last)
        u.apply()
        head["stage_apply_s"] = time.perf_counter() - t
        assert staged is not None and u.applied is not None
        head["digest_matches"] = u.applied.weights_digest == manifests[last].weights_digest
        worst = max(sweep, key=lambda r: r["ratio_to_cheaper"])
        per_k[str(k)] = {
            **head,
            "sweep": {
                "targets": len(sweep),
                "worst_ratio_to_cheaper": worst["ratio_to_cheaper"],
                "choices": {c: sum(r["choice"] == c for r in sweep) for c in ("chain", "full+chain")},
            },
        }
    changed = [sum(int(p.size) for p, _, _ in d.values()) for d in work.diffs]
    elements = sum(int(np.prod(s.shape)) for s in work.specs)
    first_ten = min(10, len(work.diffs))
    union = sum(
        int(np.unique(np.concatenate([d[n][0] for d in work.diffs[:first_ten] if n in d])).size)
        for n in {n for d in work.diffs[:first_ten] for n in d}
    )
    worst_all = max(r["sweep"]["worst_ratio_to_cheaper"] for r in per_k.values())
    return {
        "bench": "catchup",
        "config": asdict(cfg),
        "params": elements,
        "full_bytes": work.full_bytes,
        "full_versions": fulls,
        "changed_fraction_per_version_mean": float(np.mean(changed)) / elements,
        "changed_fraction_over_first_ten": union / elements,
        "delta_bytes_mean": float(np.mean([s for m, s in zip(manifests, size, strict=True) if m.kind == "delta"])),
        "ks": per_k,
        "worst_ratio_to_cheaper": worst_all,
        "target": {"ratio_to_cheaper_le": TARGET, "met": worst_all <= TARGET},
        "notes": [
            "chain_bytes counts every version after the applied one as published: a full version has no delta "
            "in this format, so a chain through it fetches the full version",
            "deltas_only_chain_bytes: the same trace published as deltas only (another run), what the chain "
            "would cost if every version also had a delta; not fetchable from this run",
            "route() reads every manifest between the applied version and the target",
        ],
        "seconds": time.perf_counter() - started,
    }


def run(args: Flags) -> int:
    out = measure(config_from(args))
    if args.json:
        print(json.dumps(out))
        return 0 if out["target"]["met"] else 1
    mb = 1 / 1e6
    print(
        f"catchup: {out['params']} weights, full {out['full_bytes'] * mb:.1f} MB, deltas "
        f"{out['delta_bytes_mean'] * mb:.2f} MB on average, fulls at {out['full_versions']}; "
        f"{out['changed_fraction_over_first_ten']:.1%} of weights change over ten versions"
    )
    for k, r in out["ks"].items():
        via = "-" if r["full_plus_chain_bytes"] is None else f"{r['full_plus_chain_bytes'] * mb:.2f}"
        print(
            f"K={k:>3}: chain {r['chain_bytes'] * mb:.2f} MB, full+chain {via} MB (deltas only "
            f"{r['deltas_only_chain_bytes'] * mb:.2f} MB); took {r['choice']} {r['choice_bytes'] * mb:.2f} MB, "
            f"{r['ratio_to_cheaper']:.3f}x the cheaper (worst over {r['sweep']['targets']} targets "
            f"{r['sweep']['worst_ratio_to_cheaper']:.3f}x); staged and applied in {r['stage_apply_s']:.2f} s"
        )
    print(f"target: choice <= {TARGET}x the cheaper: {'met' if out['target']['met'] else 'MISSED'}")
    return 0 if out["target"]["met"] else 1
