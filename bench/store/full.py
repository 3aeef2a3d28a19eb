"""``aurora bench full``: publishing and materializing a full version against safetensors itself.

The same BF16 state dict (Qwen3-0.6B-shaped, N(0, 0.02) weights) is, in one run and on the same
disk: published full to a ``file://`` run (safetensors shards, SHA-256 of every object, the
weights digest, the manifest), and saved with ``safetensors.torch.save_file``; then materialized
from the run (every shard fetched, SHA-256 and size checked, parsed, the weights digest
recomputed and compared), and read back as any verifying reader must read a safetensors file
(every byte read and SHA-256'd, then parsed). Each pair runs in a fresh process, so its peak
memory is its own; the ratios are the targets. Times are the best of a few repetitions.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from aurora_store.config.options import option, positive
from bench.output import Output, emit, overridden

TARGETS = {"publish_vs_safetensors_save": 2.0, "materialize_vs_safetensors_read": 2.0}


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    layers: int = 1
    vocab: int = 65536
    """Embedding rows (Qwen3's is 151936); with one layer, about 190 MB of BF16."""
    repeats: int = 5
    shard_bytes: int = 256 << 20
    seed: int = 0


QUICK = Config(layers=1, vocab=8192, repeats=2)
PRESETS = {"default": Config(), "--quick": QUICK}
"""What ``--help`` says the preset flags default to."""


def _tensors(cfg: Config) -> dict[str, Any]:
    import torch

    from bench.codec import trace

    g = torch.Generator().manual_seed(cfg.seed)
    out = {}
    for name, shape in trace.parameter_shapes(trace.Shape(layers=cfg.layers, vocab=cfg.vocab)).items():
        t = torch.ones(shape) if name.endswith("norm.weight") else torch.randn(shape, generator=g) * 0.02
        out[name] = t.to(torch.bfloat16)
    return out


def _memory_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _peak_above(fn: Any) -> float:
    """MB of memory ``fn`` held at its peak above what the process held before it (Linux: the
    high-water mark is reset first; elsewhere, NaN)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _memory_mb("VmRSS")
    except OSError:
        fn()
        return float("nan")
    fn()
    return _memory_mb("VmHWM") - before


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _best(fn: Any, repeats: int, reset: Any = None) -> float:
    best = float("inf")
    for _ in range(repeats):
        if reset is not None:
            reset()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def phase(kind: str, cfg: Config, work: str) -> dict[str, Any]:
    """One measurement in this process: ``publish`` or ``materialize`` (ours and the baseline)."""
    import hashlib

    import numpy as np
    from safetensors.torch import load, save_file

    import aurora_store
    from aurora_store.tensors import to_words

    tensors = _tensors(cfg)
    model_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    st_path = os.path.join(work, "model.safetensors")
    out: dict[str, Any] = {"model_bytes": model_bytes}
    if kind == "publish":
        specs, words = to_words(tensors)

        def ours() -> None:
            aurora_store.open_run(f"file://{work}/run", shard_bytes=cfg.shard_bytes).publish_words(
                specs, words, kind="full"
            )

        def theirs() -> None:
            save_file(tensors, st_path)
            with open(st_path, "rb+") as f:  # our objects are fsynced; so is the baseline
                os.fsync(f.fileno())

        # each repetition writes new files, as a publish does (removing the last ones is not timed)
        clear = lambda: shutil.rmtree(os.path.join(work, "run"), ignore_errors=True)  # noqa: E731
        out["ours_s"] = _best(ours, cfg.repeats, clear)
        out["safetensors_s"] = _best(theirs, cfg.repeats, lambda: _remove(st_path))
        clear()
        out["ours_peak_mb"] = _peak_above(ours)
        out["safetensors_peak_mb"] = _peak_above(theirs)
    else:
        run = aurora_store.open_run(f"file://{work}/run")

        def ours() -> None:
            aurora_store.open_run(f"file://{work}/run").materialize_words(0)

        def theirs() -> None:
            with open(st_path, "rb") as f:
                data = f.read()
            hashlib.sha256(data).hexdigest()
            load(data)

        if run.versions() != [0]:
            raise RuntimeError(f"the publish phase left versions {run.versions()}, expected [0]")
        got = run.materialize_words(0).words
        _, words = to_words(tensors)
        out["bit_exact"] = got.keys() == words.keys() and all(np.array_equal(got[k], words[k]) for k in words)
        if not out["bit_exact"]:
            raise RuntimeError("the materialized version differs from the tensors published")
        out["shards"] = len(run.reader.manifest(0).segments)
        out["ours_s"] = _best(ours, cfg.repeats)
        out["safetensors_s"] = _best(theirs, cfg.repeats)
        out["ours_peak_mb"] = _peak_above(ours)
        out["safetensors_peak_mb"] = _peak_above(theirs)
    return out


def measure(cfg: Config) -> dict[str, Any]:
    work = tempfile.mkdtemp(prefix="aurora-bench-full-")
    try:
        phases = {}
        for kind in ("publish", "materialize"):
            code = "import json, sys; from bench.store import full; print(json.dumps(full._phase_main()))"
            proc = subprocess.run(
                [sys.executable, "-c", code, kind, json.dumps(asdict(cfg)), work],
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                raise RuntimeError(f"bench full {kind} failed:\n{proc.stderr[-3000:]}")
            phases[kind] = json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    mb = phases["publish"]["model_bytes"] / 1e6
    pub, mat = phases["publish"], phases["materialize"]
    ratios = {
        "publish_vs_safetensors_save": pub["ours_s"] / pub["safetensors_s"],
        "materialize_vs_safetensors_read": mat["ours_s"] / mat["safetensors_s"],
    }
    return {
        "bench": "full",
        "config": asdict(cfg),
        "model_mb": mb,
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "publish": {**pub, "ours_mb_s": mb / pub["ours_s"], "safetensors_mb_s": mb / pub["safetensors_s"]},
        "materialize": {**mat, "ours_mb_s": mb / mat["ours_s"], "safetensors_mb_s": mb / mat["safetensors_s"]},
        "ratios": ratios,
        "targets": {k: {"max": v, "met": ratios[k] <= v} for k, v in TARGETS.items()},
        "note": "the baseline of materialize reads every byte of the safetensors file and SHA-256s it, then parses "
        "it; ours also checks every object's size and SHA-256 and recomputes the weights digest. *_peak_mb: memory "
        "held at the peak above the tensors a phase starts with; a publish keeps its shards as the baseline the "
        "next delta is taken against, so ours holds one copy of the model; a materialize returns the weights",
    }


def _phase_main() -> dict[str, Any]:
    kind, raw, work = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    return phase(kind, Config(**raw), work)


def render(result: dict[str, Any], console: Console) -> None:
    table = Table(
        title=f"full version of {result['model_mb']:.0f} MB ({result['cpus']} cores)",
        caption="st: safetensors; MB: memory held at the peak beyond the tensors",
    )
    for col in ("", "ours s", "st s", "ratio", "target", "ours MB", "st MB"):
        table.add_column(col, justify="right")
    for kind, key in (("publish", "publish_vs_safetensors_save"), ("materialize", "materialize_vs_safetensors_read")):
        p = result[kind]
        t = result["targets"][key]
        table.add_row(
            kind,
            f"{p['ours_s']:.3f}",
            f"{p['safetensors_s']:.3f}",
            f"{result['ratios'][key]:.2f}",
            f"<={t['max']} {'met' if t['met'] else 'MISSED'}",
            f"{p['ours_peak_mb']:.0f}",
            f"{p['safetensors_peak_mb']:.0f}",
        )
    console.print(table)


@dataclass(kw_only=True, slots=True)
class Flags(Output):
    """The command line of ``aurora bench full``."""

    quick: bool = False
    """The small preset (``QUICK``: a smaller vocab, about 24 MB, fewer repeats)."""
    layers: int | None = field(default=None, metadata=option(parse=positive))
    """Decoder layers (default: the preset's)."""
    vocab: int | None = field(default=None, metadata=option(parse=positive))
    """Embedding rows (default: the preset's)."""
    repeats: int | None = field(default=None, metadata=option(parse=positive))
    """Best of this many runs (default: the preset's)."""
    shard_bytes: int | None = field(default=None, metadata=option(parse=positive))
    """Bytes per safetensors shard (default: the preset's)."""
    seed: int = Config().seed
    """Seed of the weights."""


def run(args: Flags) -> int:
    cfg = overridden(QUICK if args.quick else Config(), args)
    return emit(measure(cfg), args, lambda r: render(r, Console()))
