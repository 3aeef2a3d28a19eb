"""Each host installs what its role runs: a relay needs neither torch nor transformers, and proves it
by copying and verifying a whole run in a process whose import system refuses them."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import aurora_store
from aurora_store.bucket.audit import audit
from aurora_store.format.signing import generate_keypair
from tests.helpers import bits_equal, state_dict, step

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "safetensors", "fakeredis", "lupa", "pyarrow")

NO_TORCH = """
import importlib.abc, sys

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError(f"{{name}} is not installed on a relay host")
        return None

sys.meta_path.insert(0, Refuse())
from aurora_store import cli
status = cli.main(sys.argv[1:])
print(json.dumps({{"loaded": sorted(m for m in {blocked!r} if m in sys.modules)}}), file=sys.stderr)
sys.exit(status)
"""


def _pyproject() -> dict:  # type: ignore[type-arg]
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_the_core_and_the_relay_extra_bring_nothing_heavy() -> None:
    project = _pyproject()["project"]
    names = {dep.split(">")[0].split("=")[0].split("[")[0].strip() for dep in project["dependencies"]}
    relay = set(project["optional-dependencies"]["relay"])
    assert not names & set(HEAVY), f"the core pulls in {names & set(HEAVY)}"
    assert not relay, "the relay runs on the core"
    for role in ("trainer", "actor"):
        deps = " ".join(project["optional-dependencies"][role])
        assert "torch" in deps and "transformers" in deps


def test_relay_copies_and_verifies_a_run_without_torch(tmp_path: Path) -> None:
    private, public = generate_keypair()
    (tmp_path / "k.key").write_bytes(private)
    (tmp_path / "k.pub").write_bytes(public)
    home, eu = f"file://{tmp_path}/home/run", f"file://{tmp_path}/eu/run"
    run = aurora_store.open_run(home, signing_key=str(tmp_path / "k.key"), full_every=3)
    run.files.put("config.json", b'{"model_type": "tiny"}')
    sd = state_dict()
    states = [sd]
    run.publish(sd)
    for i in range(1, 5):
        states.append(step(states[-1], i))
        run.publish(states[-1])
    blocker = NO_TORCH.format(blocked=set(HEAVY))
    argv = ["relay", "--once", "--source", home, "--dest", eu, "--dest-region", "eu", "--verify-key"]
    proc = subprocess.run(
        [sys.executable, "-c", "import json\n" + blocker, *argv, str(tmp_path / "k.pub")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["copied_versions"] == [0, 1, 2, 3, 4]
    assert json.loads(proc.stderr.strip().splitlines()[-1]) == {"loaded": []}
    copy = aurora_store.open_run(eu, verify_key=str(tmp_path / "k.pub"))
    assert copy.versions() == [0, 1, 2, 3, 4] and audit(copy).ok
    assert copy.files.get("config.json") == b'{"model_type": "tiny"}'
    assert all(bits_equal(copy.materialize(v), states[v]) for v in range(5))


def test_the_benchmarks_are_a_distribution_of_their_own() -> None:
    """Issue 35: the product's wheel ships no bench; bench/pyproject.toml names every package bench/
    holds (a new group cannot be left out of it) and registers `aurora bench`."""
    product = _pyproject()
    assert not any(p.startswith("bench") for p in product["tool"]["setuptools"]["packages"]["find"]["include"])
    assert "bench" not in product["project"]["entry-points"]["aurora.commands"]
    bench = tomllib.loads((REPO / "bench" / "pyproject.toml").read_text())
    packages = {
        "bench" + ("." + ".".join(d.relative_to(REPO / "bench").parts) if d != REPO / "bench" else "")
        for d in [REPO / "bench", *(p.parent for p in (REPO / "bench").glob("*/__init__.py"))]
    }
    assert set(bench["tool"]["setuptools"]["packages"]) == packages
    assert bench["project"]["entry-points"]["aurora.commands"] == {"bench": "bench.cli:register"}


WITHOUT_BENCH = """
import importlib.metadata, sys
every = importlib.metadata.entry_points
importlib.metadata.entry_points = lambda **kw: [e for e in every(**kw) if e.name != "bench"]
from aurora_store import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def test_aurora_bench_says_how_to_get_the_benchmarks_where_they_are_not_installed() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", WITHOUT_BENCH, "bench", "codec", "--quick"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert "benchmarks are not installed here" in proc.stderr and "pip install -e ./bench" in proc.stderr
