"""Retention: a run's storage with `aurora gc` every few versions, against the same run never collected.

A publisher writes ``--versions`` versions of ``--elements`` BF16 weights (``--density`` of them
changed a step, a full version every ``--full-every``) to a local bucket; every ``--gc-every``
versions gc runs with ``--keep-last``/``--keep-fulls``, while a simulated live actor holds the
version ``--actor-lag`` behind the latest (what Redis would say). Reported: bytes in the bucket
after each gc (bounded, whatever the run's length) against the bytes the run published in all
(what it holds without gc), the time of a plan and of an apply, and an audit of what is left.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from aurora_store.config.options import option, positive
from bench.output import Output, overridden


@dataclass(frozen=True, slots=True)
class Config:
    versions: int = 100
    elements: int = 4 << 20
    density: float = 0.01
    full_every: int = 10
    gc_every: int = 10
    keep_last: int = 10
    keep_fulls: int = 2
    actor_lag: int = 5
    seed: int = 0


_DEFAULT = Config()


@dataclass(kw_only=True, slots=True)
class Flags(Output):
    """The command line of ``aurora bench retention``."""

    versions: int = field(default=_DEFAULT.versions, metadata=option(parse=positive))
    """Versions to publish."""
    elements: int = field(default=_DEFAULT.elements, metadata=option(parse=positive))
    """BF16 elements of the model."""
    density: float = _DEFAULT.density
    """Fraction of elements changed a step."""
    full_every: int = field(default=_DEFAULT.full_every, metadata=option(parse=positive))
    """A full version every this many."""
    gc_every: int = field(default=_DEFAULT.gc_every, metadata=option(parse=positive))
    """Run gc after every this many versions."""
    keep_last: int = field(default=_DEFAULT.keep_last, metadata=option(parse=positive))
    """gc --keep-last."""
    keep_fulls: int = field(default=_DEFAULT.keep_fulls, metadata=option(parse=positive))
    """gc --keep-fulls."""
    actor_lag: int = _DEFAULT.actor_lag
    """A live actor holds the latest version minus this."""
    seed: int = _DEFAULT.seed
    """Seeds the weights and which elements change."""


def measure(cfg: Config) -> dict[str, Any]:
    import torch

    import aurora_store
    from aurora_store.bucket import gc
    from aurora_store.bucket.audit import audit

    root = tempfile.mkdtemp(prefix="aurora-bench-retention-")
    run = aurora_store.open_run(f"file://{root}/run", full_every=cfg.full_every)
    g = torch.Generator().manual_seed(cfg.seed)
    w = {"w": torch.randn(cfg.elements, generator=g).to(torch.bfloat16)}
    changed = max(1, int(cfg.elements * cfg.density))
    published = 0
    after_gc: list[int] = []
    plan_s: list[float] = []
    apply_s: list[float] = []
    retired = 0
    for _ in range(cfg.versions):
        info = run.publish(w)
        published += info.bytes
        idx = torch.randperm(cfg.elements, generator=g)[:changed]
        w["w"][idx] += 0.5
        if (info.version + 1) % cfg.gc_every == 0:
            holds = {"actor a1 in eu": max(0, info.version - cfg.actor_lag)}
            t = time.perf_counter()
            plan = gc.plan(run, gc.RetentionPolicy(keep_last=cfg.keep_last, keep_fulls=cfg.keep_fulls, holds=holds))
            plan_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            gc.apply(run, plan)
            apply_s.append(time.perf_counter() - t)
            retired += len(plan.retire)
            after_gc.append(_bytes(root))
    t = time.perf_counter()
    result = audit(aurora_store.open_run(f"file://{root}/run"))
    audit_s = time.perf_counter() - t
    held = _bytes(root)
    return {
        "bench": "retention",
        "config": asdict(cfg),
        "published_bytes": published,
        "bytes_after_each_gc": after_gc,
        "bytes_at_end": held,
        "max_bytes_after_gc": max(after_gc, default=held),
        "ratio_held_vs_published": held / published,
        "versions_kept": len(run.versions()),
        "versions_retired": retired,
        "plan_s_mean": sum(plan_s) / len(plan_s) if plan_s else None,
        "apply_s_mean": sum(apply_s) / len(apply_s) if apply_s else None,
        "audit_ok": result.ok,
        "audit_retired": result.retired,
        "audit_s": audit_s,
    }


def _bytes(root: str) -> int:
    total = 0
    for directory, _dirs, names in os.walk(root):
        total += sum(os.path.getsize(os.path.join(directory, n)) for n in names)
    return total


def run(args: Flags) -> int:
    out = measure(overridden(_DEFAULT, args))
    if args.json:
        print(json.dumps(out))
        return 0
    mb = 1 / (1 << 20)
    print(f"published {out['published_bytes'] * mb:.1f} MiB in {out['config']['versions']} versions")
    print(f"held after each gc: {', '.join(f'{b * mb:.1f}' for b in out['bytes_after_each_gc'])} MiB")
    print(
        f"at the end {out['bytes_at_end'] * mb:.1f} MiB ({out['ratio_held_vs_published']:.1%} of published), "
        f"{out['versions_kept']} versions kept, {out['versions_retired']} retired; audit "
        f"{'ok' if out['audit_ok'] else 'FAILED'}"
    )
    return 0 if out["audit_ok"] else 1
