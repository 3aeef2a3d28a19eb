"""``aurora bench walk``: the walks it traces are the real calls, counted as its docstring says."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from aurora_store.errors import AuroraError
from bench.structure import walk

REPO = Path(__file__).resolve().parents[1]


def test_layers_put_the_format_below_the_store_below_the_roles() -> None:
    assert walk.layer("aurora_store.format.manifest") == walk.layer("aurora_store.codec.classed") == 0
    assert walk.layer("aurora_store.tensors") == walk.layer("aurora_store.storage.base") == 1
    assert walk.layer("aurora_store.bucket.reader") == walk.layer("aurora_store.coord.jobs") == 2
    assert walk.layer("actor.updater") == walk.layer("trainer.loop") == 3


MODULES = {
    "top": "from walkpkg import low, mid\n\ndef entry():\n    mid.f()\n    low.g()\n    mid.f()\n    helper()\n\n"
    "def helper():\n    mid.up()\n",
    "mid": "from walkpkg import low, top\n\ndef f():\n    low.g()\n\ndef up():\n    top.leaf()\n",
    "low": "def g():\n    return 1\n",
}


def test_a_walk_counts_stays_returns_and_climbs_as_documented(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A package of three layers (low < mid < top) with a known call tree, traced exactly."""
    pkg = tmp_path / "walkpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name, text in MODULES.items():
        (pkg / f"{name}.py").write_text(text + ("\ndef leaf():\n    return 0\n" if name == "top" else ""))
    monkeypatch.syspath_prepend(str(tmp_path))
    from walkpkg import top

    ranks = {"walkpkg.low": 0, "walkpkg.mid": 1, "walkpkg.top": 2}
    got = walk.walk(top.entry, "entry", depth=3, roots=("walkpkg",), layer_of=ranks.__getitem__)
    # entry(top) > f(mid) > g(low) | g(low), one stay with the last | f(mid) > g(low)
    # | helper(top) > up(mid) > leaf(top)
    assert got["path"] == ["walkpkg." + m for m in ("top", "mid", "low", "mid", "low", "top", "mid", "top")]
    assert (got["stays"], got["rooms"], got["returns"], got["climbs"]) == (
        8,
        3,
        5,
        3,
    )  # climbs: low>mid, low>top, mid>top
    shallow = walk.walk(top.entry, "entry", depth=1, roots=("walkpkg",), layer_of=ranks.__getitem__)
    assert shallow["path"] == ["walkpkg." + m for m in ("top", "mid", "low", "mid", "top")]
    outside = walk.walk(top.entry, "nothing.here", depth=3, roots=("walkpkg",), layer_of=ranks.__getitem__)
    assert outside == {"stays": 0, "rooms": 0, "returns": 0, "climbs": 0, "path": []}


def test_the_publish_and_stage_walks_start_where_they_say_and_count_consistently() -> None:
    r = walk.measure(walk.Flags(depth=3, top=3, tensors=2))
    for name, first in (("publish", "bucket.publisher"), ("stage", "actor.updater")):
        w = r[name]
        assert w["path"][0] == first
        assert w["stays"] == len(w["path"]) and w["rooms"] == len(set(w["path"]))
        assert w["returns"] == w["stays"] - w["rooms"], "every stay past a room's first is a return"
        assert all(a != b for a, b in zip(w["path"], w["path"][1:], strict=False)), "a stay is one room"
    assert "bucket.delta_part" in r["publish"]["path"] and "bucket.commit" in r["publish"]["path"]
    assert "bucket.catchup" in r["stage"]["path"]
    deeper = walk.measure(walk.Flags(depth=5, top=3, tensors=2))
    assert deeper["stage"]["stays"] > r["stage"]["stays"], "deeper walks see more"
    mods, classes = r["longest_modules"], r["largest_classes"]
    assert len(mods) == len(classes) == 3
    assert [m["lines"] for m in mods] == sorted((m["lines"] for m in mods), reverse=True)
    lines = (REPO / mods[0]["module"]).read_text().count("\n")
    assert mods[0]["lines"] == lines


def test_the_command_prints_one_json_object_and_refuses_a_depth_of_zero() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "aurora_store.cli", "bench", "walk", "--json", "--tensors", "1", "--top", "2"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    doc = json.loads(out.stdout)
    assert set(doc) == {"depth", "publish", "stage", "longest_modules", "largest_classes"}
    bad = subprocess.run(
        [sys.executable, "-m", "aurora_store.cli", "bench", "walk", "--depth", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "--depth" in bad.stderr and "Traceback" not in bad.stderr


def test_a_walk_that_raises_stops_tracing() -> None:
    def boom() -> None:
        raise AuroraError("no")

    with pytest.raises(AuroraError):
        walk.walk(boom, "boom", depth=3)
    assert sys.getprofile() is None
