"""The modules a version's publish and an actor's stage call walk through, and the longest modules
and classes: the shape of the code on the paths every version takes, measured, not guessed.

A *walk* traces one call with ``sys.setprofile``: every call into a module of the product
(``aurora_store``, ``actor``, ``trainer``) at most ``--depth`` calls below the entry is a stay in
that module (a *room*; calls in a row in one room are one stay). Reported per walk:

- ``stays``: stays along the walk; ``rooms``: distinct modules entered;
- ``returns``: stays in a room already left before (a concept split across rooms that call back
  and forth);
- ``climbs``: a call from a lower layer into a higher one (``format``/``codec`` < ``storage`` <
  ``bucket``/``coord``/``rl`` < the roles), which the layering forbids as imports but a callback can
  still do at run time.

The walks: ``publish``, :meth:`aurora_store.bucket.publisher.Publisher.publish` of a delta (one
process, a local run; ~1% of a few BF16 tensors changed); ``stage``,
:meth:`actor.updater.Updater.stage` of an actor at version 0 staging version 2 (two deltas) into
torch live weights. Alongside, from the source (``ast``): the longest modules of the product and
its largest classes (lines, public methods).
"""

from __future__ import annotations

import ast
import json
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from aurora_store.config.options import option, positive
from bench.output import Output, emit

ROOTS = ("aurora_store", "actor", "trainer")
"""The product's packages: the rooms a walk counts (the relay's publish and stage paths run none)."""

LAYERS = {"format": 0, "codec": 0, "storage": 1, "bucket": 2, "coord": 2, "rl": 2}
"""The library's layers by subpackage; the roles (``actor``, ``trainer``) are above them all (3), and
the library's top-level modules (``tensors``, ``device``, ...) sit with ``storage`` (1)."""

REPO = Path(__file__).resolve().parents[2]


@dataclass(kw_only=True, slots=True)
class Flags(Output):
    """The command line of ``aurora bench walk``."""

    depth: int = field(default=3, metadata=option(parse=positive))
    """How many calls below the entry a walk counts."""
    top: int = field(default=5, metadata=option(parse=positive))
    """How many of the longest modules and the largest classes to list."""
    tensors: int = field(default=4, metadata=option(parse=positive))
    """BF16 tensors of 256 x 256 in the published weights."""
    seed: int = 0
    """Seeds the weights and the changes."""


def layer(module: str) -> int:
    """``module``'s layer: 0 for the format and the codecs, up to 3 for a role."""
    parts = module.split(".")
    if parts[0] != "aurora_store":
        return 3
    return LAYERS.get(parts[1], 1) if len(parts) > 1 else 1


def walk(
    fn: Callable[[], Any],
    entry: str,
    depth: int,
    roots: tuple[str, ...] = ROOTS,
    layer_of: Callable[[str], int] = layer,
) -> dict[str, Any]:
    """Run ``fn`` and trace the call whose qualified name is ``entry`` (see the module's docstring):
    rooms are the modules under ``roots``, ranked by ``layer_of``."""
    seq: list[str] = []
    below = [0]  # calls open below the entry, 0 outside it

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            module = frame.f_globals.get("__name__", "")
            ours = module.startswith(roots)
            if below[0] == 0:
                if ours and frame.f_code.co_qualname == entry:
                    below[0] = 1
                    seq.append(module)
                return
            below[0] += 1
            if ours and below[0] <= depth + 1:
                seq.append(module)
        elif event == "return" and below[0]:
            below[0] -= 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    stays = [m for i, m in enumerate(seq) if i == 0 or seq[i - 1] != m]
    seen: set[str] = set()
    returns = climbs = 0
    for i, m in enumerate(stays):
        returns += m in seen
        climbs += i > 0 and layer_of(m) > layer_of(stays[i - 1])
        seen.add(m)
    return {
        "stays": len(stays),
        "rooms": len(seen),
        "returns": returns,
        "climbs": climbs,
        "path": [m.removeprefix("aurora_store.") for m in stays],
    }


def _weights(flags: Flags) -> tuple[dict[str, Any], Callable[[], None]]:
    import torch

    g = torch.Generator().manual_seed(flags.seed)
    w = {f"layer{i}.weight": torch.randn(256, 256, generator=g).to(torch.bfloat16) for i in range(flags.tensors)}

    def step() -> None:  # ~1% of each tensor's elements move a little, as an optimizer step does
        for v in w.values():
            at = torch.randint(0, v.numel(), (v.numel() // 100,), generator=g)
            v.view(-1)[at] += (torch.randn(at.numel(), generator=g) * 0.01).to(torch.bfloat16)

    return w, step


def walks(flags: Flags) -> dict[str, Any]:
    """The publish walk and the stage walk, on a local run in a new directory."""
    import aurora_store
    from actor.updater import Updater

    with tempfile.TemporaryDirectory(prefix="aurora-walk-") as tmp:
        run = aurora_store.open_run(f"file://{tmp}/run")
        w, step = _weights(flags)
        run.publish(w, step=0)
        step()
        run.publish(w, step=1)
        step()
        out = {"publish": walk(lambda: run.publish(w, step=2), "Publisher.publish", flags.depth)}
        up = Updater(aurora_store.open_run(f"file://{tmp}/run"), region="home")
        up.bootstrap(0)
        out["stage"] = walk(lambda: up.stage(2), "Updater.stage", flags.depth)
        return out


def shape(top: int, root: Path = REPO) -> dict[str, Any]:
    """The ``top`` longest modules of the product and its largest classes (lines, public methods)."""
    modules, classes = [], []
    for package in (*ROOTS, "relay"):
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            text = path.read_text()
            modules.append((text.count("\n"), rel))
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.ClassDef):
                    public = [
                        f
                        for f in node.body
                        if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef) and not f.name.startswith("_")
                    ]
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    classes.append((lines, len(public), f"{rel}:{node.name}"))
    modules.sort(reverse=True)
    classes.sort(reverse=True)
    return {
        "longest_modules": [{"module": m, "lines": n} for n, m in modules[:top]],
        "largest_classes": [{"class": c, "lines": n, "public_methods": p} for n, p, c in classes[:top]],
    }


def measure(flags: Flags) -> dict[str, Any]:
    return {"depth": flags.depth, **walks(flags), **shape(flags.top)}


def run(flags: Flags) -> int:
    def render(r: dict[str, Any]) -> None:
        for name in ("publish", "stage"):
            w = r[name]
            print(
                f"{name}: {w['stays']} stays in {w['rooms']} modules, {w['returns']} returns to a module left "
                f"before, {w['climbs']} climbs up a layer ({r['depth']} calls deep)"
            )
        print(json.dumps({k: r[k] for k in ("longest_modules", "largest_classes")}, indent=1))

    return emit(measure(flags), flags, render)
