"""The shape of the house, read from the source with ``ast``: layers import downward only, the
format layer does no I/O and holds no torch, a relay never imports torch, roles never import
each other, nothing imports in a circle; and importing the library's light layers stays light."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("aurora_store", "trainer", "actor", "relay", "bench")
ROLES = ("trainer", "actor", "relay")

LAYERS: dict[str, float] = {
    "aurora_store.errors": 0,
    "aurora_store.config.options": 0.5,
    "aurora_store.config": 0.6,
    "aurora_store.redact": 0,
    "aurora_store.localfile": 0,
    "aurora_store.metrics": 0.5,
    "aurora_store.metrics_http": 0.4,  # the server under metrics
    "aurora_store.codec": 1,
    "aurora_store.format": 2,
    "aurora_store.quant": 2.1,  # the trainer's quantizers: pure functions of its weights, on the format's words
    "aurora_store.storage": 2.8,  # backends under bucket's ObjectStore
    "aurora_store.bucket": 3,
    "aurora_store.coord": 3,
    "aurora_store.rl": 3,
    "aurora_store.tensors": 2.5,
    "aurora_store.device": 2.6,  # builds on tensors
    "aurora_store.cli": 4,
    "aurora_store.cli_config": 3.9,
    "aurora_store.cli_gc": 3.9,
    "aurora_store.testing": 4,
}
"""A library module may import (at run time) only modules of a lower layer, or of its own package."""

THIRD_PARTY = {
    "aurora_store.codec": {"numpy", "zstandard", "numba"},  # numba: the classed codec's compiled passes
    "aurora_store.format": {"numpy", "zstandard", "cryptography", "numba"},  # numba: the digest's compiled mixer
    "aurora_store.quant": {"numpy"},
    "aurora_store.coord": {"redis", "fakeredis"},
    "aurora_store.metrics": {"prometheus_client"},
    "aurora_store.metrics_http": {"prometheus_client"},
}
"""Third-party imports these layers may make at all (a format layer with no fsspec, redis or torch)."""


@dataclass(frozen=True, slots=True)
class Import:
    source: str
    target: str
    line: int
    lazy: bool
    """Inside a function: runs when called, not when the module is imported."""
    typing_only: bool
    """Under ``if TYPE_CHECKING:``: never runs."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


MODULES = _modules()


def _resolve(name: str, imported: str | None) -> str:
    """``from name import imported``: the submodule when there is one, else the module itself."""
    if imported is not None and f"{name}.{imported}" in MODULES:
        return f"{name}.{imported}"
    return name


def _imports(module: str, path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: list[Import] = []

    def visit(node: ast.AST, lazy: bool, typing_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, True, typing_only)
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), lazy, True)
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), lazy, typing_only)
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    out.append(Import(module, alias.name, child.lineno, lazy, typing_only))
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                for alias in child.names:
                    target = _resolve(child.module, alias.name)
                    out.append(Import(module, target, child.lineno, lazy, typing_only))
            else:
                visit(child, lazy, typing_only)

    visit(tree, False, False)
    return out


IMPORTS = [imp for module, path in MODULES.items() for imp in _imports(module, path)]


def _top(name: str) -> str:
    return name.split(".", 1)[0]


def _layer_of(module: str) -> str | None:
    return next((prefix for prefix in LAYERS if module == prefix or module.startswith(prefix + ".")), None)


def _where(imp: Import) -> str:
    return f"{MODULES[imp.source].relative_to(REPO)}:{imp.line} imports {imp.target}"


def test_the_scan_sees_the_whole_tree() -> None:
    assert {"aurora_store.format.manifest", "aurora_store.bucket.run", "relay.worker", "trainer.sharded"} <= set(
        MODULES
    )
    assert len(IMPORTS) > 300


def test_library_layers_import_downward_only() -> None:
    bad = []
    for imp in IMPORTS:
        src, dst = _layer_of(imp.source), _layer_of(imp.target)
        if src is None or dst is None or imp.typing_only or src == dst:
            continue
        if LAYERS[dst] >= LAYERS[src]:
            bad.append(_where(imp))
    assert not bad, "a layer imports its own level or above:\n" + "\n".join(bad)


def test_the_library_never_imports_a_role_or_a_benchmark() -> None:
    bad = [_where(i) for i in IMPORTS if _top(i.source) == "aurora_store" and _top(i.target) in (*ROLES, "bench")]
    assert not bad, "\n".join(bad)


def test_format_and_codec_import_no_io_redis_or_torch() -> None:
    bad = []
    for imp in IMPORTS:
        layer = _layer_of(imp.source)
        allowed = THIRD_PARTY.get(layer or "")
        top = _top(imp.target)
        if allowed is None or top == "aurora_store" or top in sys.stdlib_module_names or imp.typing_only:
            continue
        if top not in allowed:
            bad.append(_where(imp))
    assert not bad, "\n".join(bad)


def test_relay_imports_no_torch() -> None:
    heavy = ("torch", "transformers", "safetensors", "aurora_store.tensors", "aurora_store.device", "aurora_store.rl")
    bad = [_where(i) for i in IMPORTS if _top(i.source) == "relay" and i.target.startswith(heavy)]
    assert not bad, "\n".join(bad)


def test_roles_never_import_each_other() -> None:
    bad = [
        _where(i)
        for i in IMPORTS
        if _top(i.source) in ROLES and _top(i.target) in ROLES and _top(i.target) != _top(i.source)
    ]
    assert not bad, "\n".join(bad)


def test_testing_helpers_are_for_tests_and_benchmarks() -> None:
    bad = [
        _where(i)
        for i in IMPORTS
        if i.target.startswith("aurora_store.testing") and not i.source.startswith(("aurora_store.testing", "bench"))
    ]
    assert not bad, "\n".join(bad)


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (each holds at least one circle),
    found with Tarjan's algorithm, iteratively (no recursion limit on a deep graph)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, nexts = work[-1]
            nxt = next(nexts, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circles() -> None:
    """Every import counts, those inside functions and under ``TYPE_CHECKING`` too: a lazy or type-only
    import that closes a circle still ties the two modules into one (neither reads without the other)."""
    edges: dict[str, set[str]] = defaultdict(set)
    for imp in IMPORTS:
        if imp.target in MODULES and imp.target != imp.source:
            edges[imp.source].add(imp.target)
            edges.setdefault(imp.target, set())
    bad = []
    for component in _circles(edges):
        lines = [_where(i) for i in IMPORTS if i.source in component and i.target in component and i.source != i.target]
        bad.append(" <-> ".join(component) + ":\n  " + "\n  ".join(sorted(set(lines))))
    assert not bad, "modules that import each other (lazily or for types included):\n" + "\n".join(bad)


def test_the_circle_finder_sees_lazy_and_typing_circles() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
    lazy = [i for i in IMPORTS if i.lazy and not i.typing_only]
    typing_only = [i for i in IMPORTS if i.typing_only]
    assert lazy and typing_only  # the scan sees both kinds, so the circle test counts them


@pytest.mark.parametrize(
    ("module", "absent"),
    [
        ("aurora_store", ("fsspec", "zstandard", "cryptography.hazmat", "redis", "numpy", "torch")),
        ("aurora_store.coord.jobs", ("fsspec", "zstandard", "cryptography.hazmat", "torch", "numpy")),
        ("aurora_store.format.manifest_parser", ("fsspec", "redis", "torch")),
        ("aurora_store.cli", ("fsspec", "zstandard", "redis", "torch", "numpy")),
    ],
)
def test_light_layers_import_light(module: str, absent: tuple[str, ...]) -> None:
    """What an import really loads (redis-py itself loads the top-level ``cryptography`` package to
    probe for it; the part AuroraRL uses, ``cryptography.hazmat``, must not come with coordination)."""
    code = f"import sys, {module}; print(sorted(m for m in {absent!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"importing {module} loads {out.stdout.strip()}"
