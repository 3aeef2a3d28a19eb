"""The ``aurora`` CLI as real processes against real ``file://`` runs: ls, replay, audit, keygen, bench.

Damage is planted with the store's test-only ``overwrite``/``delete``; every audit failure must
exit 1 and name the bad object's URL. Attachments are tested in-process.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from aurora_store import ConflictError, MissingError, Run, StoreError, open_run
from aurora_store.format import signing
from aurora_store.format.keys import manifest_key
from aurora_store.format.manifest_parser import parse_manifest
from aurora_store.testing.damage import delete, overwrite
from aurora_store.testing.processes import deadline
from tests.helpers import aurora

REPO = Path(__file__).resolve().parents[1]
FULL_EVERY = 3
VERSIONS = 6
"""Versions 0 and 3 are full, 1, 2, 4 and 5 deltas."""


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bit patterns of a tensor, so NaN payloads and signed zeros compare exactly."""
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def assert_bits_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert (a[k].dtype, a[k].shape) == (b[k].dtype, b[k].shape), k
        assert torch.equal(bits(a[k]), bits(b[k])), k


def first_state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(48, 33, generator=g) * 0.02).to(torch.bfloat16)
    # -0.0, two NaN payloads and a denormal: bits a lossy path would not keep
    special = torch.tensor([0x8000, 0x7FC1, 0xFF81, 0x0001], dtype=torch.int32).to(torch.int16)
    w.view(torch.int16).view(-1)[:4] = special
    return {
        "model.embed.weight": w,
        "model.norm.weight": torch.randn(7, generator=g),
        "buffers.position_ids": torch.arange(11, dtype=torch.int64),
    }


def next_state(sd: dict[str, torch.Tensor], v: int) -> dict[str, torch.Tensor]:
    """A training-like step: a few percent of the bf16 weights move, one fp32 value, sometimes an int."""
    g = torch.Generator().manual_seed(1000 + v)
    out = {k: t.clone() for k, t in sd.items()}
    w = out["model.embed.weight"]
    mask = torch.rand(w.shape, generator=g) < 0.04
    mask.view(-1)[:4] = False
    w[mask] = (w[mask].float() + 0.01).to(torch.bfloat16)
    out["model.norm.weight"][v % 7] += 0.25
    if v % 2:
        out["buffers.position_ids"][v % 11] += 1
    return out


@dataclass
class Published:
    uri: str
    run: Run
    states: list[dict[str, torch.Tensor]]

    def url(self, key: str) -> str:
        return self.run.store.url(key)


def publish(path: Path, *, signing_key: bytes | None = None, versions: int = VERSIONS) -> Published:
    uri = f"file://{path}"
    run = open_run(uri, full_every=FULL_EVERY, signing_key=signing_key)
    states = []
    sd = first_state()
    for v in range(versions):
        if v:
            sd = next_state(sd, v)
        info = run.publish(sd, step=10 * v)
        assert info.version == v and info.kind == ("full" if v % FULL_EVERY == 0 else "delta")
        states.append(sd)
    return Published(uri, run, states)


@pytest.fixture
def pub(tmp_path: Path) -> Published:
    return publish(tmp_path / "run")


# ---------------------------------------------------------------- ls


def test_ls_json_reports_manifest_stats(pub: Published) -> None:
    r = aurora("ls", pub.uri, "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [row["version"] for row in rows] == list(range(VERSIONS))
    assert [row["kind"] for row in rows] == ["full", "delta", "delta", "full", "delta", "delta"]
    for row in rows:
        s = pub.run.manifest(row["version"]).stats
        assert (row["bytes"], row["changed"], row["elements"], row["step"]) == (
            s.bytes,
            s.changed,
            s.elements,
            10 * row["version"],
        )
        assert row["density"] == pytest.approx(s.changed / s.elements)
        assert row["bytes_per_changed"] == pytest.approx(s.bytes / s.changed)
        assert row["ratio"] == pytest.approx(s.full_bytes / s.bytes)
        assert row["created"] == pub.run.manifest(row["version"]).created
    assert rows[0]["density"] == 1.0 and 0 < rows[1]["density"] < 0.1
    assert rows[1]["ratio"] > 3 > rows[0]["ratio"]


@pytest.mark.slow
def test_ls_table_and_errors(pub: Published, tmp_path: Path) -> None:
    r = aurora("ls", pub.uri)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.strip(" │").split(" ")[0].isdigit()]
    assert len(lines) == VERSIONS and "delta" in lines[1] and "full" in lines[3]
    nothing = aurora("ls", f"file://{tmp_path}/nothing", "--json")  # not an empty run: no run at all
    assert nothing.returncode == 1 and "nothing is stored under this URI" in nothing.stderr
    (tmp_path / "empty").mkdir()
    assert aurora("ls", f"file://{tmp_path}/empty", "--json").stdout.strip() == "[]"  # an empty run
    (tmp_path / "other" / "logs").mkdir(parents=True)
    (tmp_path / "other" / "logs" / "a.txt").write_text("not a run")
    other = aurora("ls", f"file://{tmp_path}/other")
    assert other.returncode == 1 and "holds logs but no run" in other.stderr and other.stdout == ""
    bad = aurora("ls", pub.uri, "--storage-options", "[1]")
    assert bad.returncode == 2 and "JSON object" in bad.stderr
    assert aurora("ls").returncode == 2


# ---------------------------------------------------------------- replay


def load_dir(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(out.glob("*.safetensors")):
        part = load_file(f)
        assert not tensors.keys() & part.keys()
        tensors.update(part)
    return tensors


@pytest.mark.slow
@pytest.mark.parametrize("version", [3, 5, None])
def test_replay_is_bit_exact(pub: Published, tmp_path: Path, version: int | None) -> None:
    # attached after these versions were published: not part of them, so never replayed with them
    pub.run.files.put("config.json", b'{"model_type": "toy"}')
    out = tmp_path / "out"
    which = ["--version", str(version)] if version is not None else []  # none: the latest
    r = aurora("replay", pub.uri, *which, "--out", str(out))
    version = version if version is not None else len(pub.states) - 1
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["aurora_replay.json", "model.safetensors"]
    got = load_dir(out)
    assert_bits_equal(got, pub.run.materialize(version))
    assert_bits_equal(got, pub.states[version])
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
    prov = json.loads((out / "aurora_replay.json").read_text())
    m = pub.run.manifest(version)
    assert (prov["version"], prov["version_hash"], prov["weights_digest"], prov["run"]) == (
        version,
        m.version_hash,
        m.weights_digest,
        pub.uri,
    )
    assert prov["files"] == {}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temporary directory left behind"


@pytest.mark.slow
def test_attachments_are_signed_with_the_versions_that_carry_them(tmp_path: Path) -> None:
    priv, pub_key = signing.generate_keypair()
    (tmp_path / "k.pub").write_bytes(pub_key)
    uri = f"file://{tmp_path}/run"
    run = open_run(uri, signing_key=priv)
    run.publish({"w": torch.zeros(4, dtype=torch.bfloat16)})
    run.files.put("config.json", b'{"model_type": "toy"}')
    run.publish({"w": torch.ones(4, dtype=torch.bfloat16)})
    assert [f.key for f in run.manifest(0).files] == []
    assert [f.key for f in run.manifest(1).files] == ["files/config.json"]
    out = tmp_path / "out"
    r = aurora("replay", uri, "--version", "1", "--out", str(out), "--verify-key", str(tmp_path / "k.pub"))
    assert r.returncode == 0, r.stderr
    assert (out / "config.json").read_bytes() == b'{"model_type": "toy"}'
    prov = json.loads((out / "aurora_replay.json").read_text())
    assert prov["files"] == {"config.json": hashlib.sha256(b'{"model_type": "toy"}').hexdigest()}
    # the file is swapped behind the manifest's back: replay and audit refuse it, naming it
    overwrite(run.store, "files/config.json", b'{"model_type": "evil"}')
    r = aurora(
        "replay", uri, "--version", "1", "--out", str(tmp_path / "out2"), "--verify-key", str(tmp_path / "k.pub")
    )
    assert r.returncode == 1 and "files/config.json" in r.stderr, r.stderr
    # the key may come from the environment, as a path or as PEM text
    r = aurora("audit", uri, "--json", env={"AURORA_VERIFY_KEY": pub_key.decode()})
    assert r.returncode == 1
    first = json.loads(r.stdout)["first_error"]
    assert first["version"] == 1 and first["object"].endswith("files/config.json")


@pytest.mark.slow
def test_replay_sharded_index(pub: Published, tmp_path: Path) -> None:
    out = tmp_path / "sharded"
    r = aurora("replay", pub.uri, "--version", "4", "--out", str(out), "--shard-bytes", "100")
    assert r.returncode == 0, r.stderr
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert shards == [f"model-{i:05d}-of-00003.safetensors" for i in (1, 2, 3)]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    expected = pub.states[4]
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in expected.values())
    assert sorted(index["weight_map"]) == sorted(expected) and set(index["weight_map"].values()) == set(shards)
    from safetensors.torch import load_file

    for name, shard in index["weight_map"].items():
        assert name in load_file(out / shard)
    assert_bits_equal(load_dir(out), expected)


@pytest.mark.slow
def test_replay_refuses_non_empty_out_unless_forced(pub: Published, tmp_path: Path) -> None:
    out = tmp_path / "busy"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    r = aurora("replay", pub.uri, "--version", "1", "--out", str(out))
    assert r.returncode == 1 and r.stderr.startswith("aurora: error:") and "not empty" in r.stderr
    assert "Traceback" not in r.stderr and (out / "keep.txt").exists()
    r = aurora("replay", pub.uri, "--version", "1", "--out", str(out), "--force")
    assert r.returncode == 1 and "not a directory replay wrote" in r.stderr, "--force never deletes a user's file"
    assert (out / "keep.txt").read_text() == "mine"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert aurora("replay", pub.uri, "--version", "2", "--out", str(empty)).returncode == 0
    assert aurora("replay", pub.uri, "--version", "1", "--out", str(empty), "--force").returncode == 0
    assert_bits_equal(load_dir(empty), pub.states[1])  # a replay replaced by another
    (empty / "notes.txt").write_text("mine")
    r = aurora("replay", pub.uri, "--version", "2", "--out", str(empty), "--force")
    assert r.returncode == 1 and "notes.txt" in r.stderr and (empty / "notes.txt").exists()
    missing = aurora("replay", pub.uri, "--version", "9", "--out", str(tmp_path / "nine"))
    assert missing.returncode == 1 and "does not exist" in missing.stderr and not (tmp_path / "nine").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_replay_force_deletes_only_what_replay_provably_wrote(tmp_path: Path) -> None:
    """Issue 25, weak spot: ``--force`` trusted the unsigned ``aurora_replay.json`` in the target, so a
    record listing a user's file got it deleted. Now a file is replaced only under replay's own names
    (record, index, shards) or as an attachment whose bytes the run vouches for at the recorded
    version; a file the record lists for no reason, a link (to a file outside) or a name with ``..``
    in the record are never deleted, and a real earlier replay is still replaced."""
    uri = f"file://{tmp_path / 'run'}"
    run = open_run(uri, full_every=FULL_EVERY)
    run.files.put("config.json", b'{"model_type": "toy"}')
    sd = first_state()
    run.publish(sd)
    run.publish(next_state(sd, 1))
    out = tmp_path / "model"
    assert aurora("replay", uri, "--version", "0", "--out", str(out)).returncode == 0
    assert sorted(p.name for p in out.iterdir()) == ["aurora_replay.json", "config.json", "model.safetensors"]
    outside = tmp_path / "outside.txt"
    outside.write_text("not replay's")
    secret = out / "secret.txt"
    secret.write_text("a user's notes")
    (out / "tokenizer.json").symlink_to(outside)
    prov = out / "aurora_replay.json"
    record = json.loads(prov.read_text())
    record["files"].update(
        {
            "secret.txt": hashlib.sha256(b"a user's notes").hexdigest(),
            "tokenizer.json": hashlib.sha256(b"not replay's").hexdigest(),
            "../outside.txt": hashlib.sha256(b"not replay's").hexdigest(),
        }
    )
    record["shards"].append("secret.txt")
    prov.write_text(json.dumps(record))

    r = aurora("replay", uri, "--version", "1", "--out", str(out), "--force")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "secret.txt" in r.stderr and "tokenizer.json (not a regular file)" in r.stderr
    assert secret.read_text() == "a user's notes" and outside.read_text() == "not replay's"
    assert (out / "tokenizer.json").is_symlink()

    (out / "tokenizer.json").unlink()
    r = aurora("replay", uri, "--version", "1", "--out", str(out), "--force")
    assert r.returncode == 1 and "secret.txt" in r.stderr and secret.exists(), "still listed, still not replay's"
    secret.unlink()
    (out / "config.json").write_text('{"model_type": "mine"}')  # an attachment's name, other bytes
    r = aurora("replay", uri, "--version", "1", "--out", str(out), "--force")
    assert r.returncode == 1 and "config.json" in r.stderr
    assert (out / "config.json").read_text() == '{"model_type": "mine"}'

    (out / "config.json").write_bytes(b'{"model_type": "toy"}')  # the run's bytes: replay's to replace
    r = aurora("replay", uri, "--version", "1", "--out", str(out), "--force")
    assert r.returncode == 0, r.stderr
    assert json.loads(prov.read_text())["version"] == 1 and outside.read_text() == "not replay's"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_replay_qwen3_loads_in_transformers(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config)
    sd = {k: v.detach().to(torch.bfloat16).clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    run = open_run(f"file://{tmp_path}/qwen", full_every=4)
    config.save_pretrained(tmp_path / "cfg")
    run.files.put("config.json", (tmp_path / "cfg" / "config.json").read_bytes())
    run.publish(sd)
    sd1 = {k: v.clone() for k, v in sd.items()}
    sd1["model.layers.1.mlp.up_proj.weight"][3, :5] += 1  # a delta version, with a visible change
    assert run.publish(sd1).kind == "delta"
    out = tmp_path / "hf"
    r = aurora("replay", run.uri, "--version", "1", "--out", str(out))
    assert r.returncode == 0, r.stderr
    loaded, info = transformers.Qwen3ForCausalLM.from_pretrained(
        str(out), torch_dtype=torch.bfloat16, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    got = loaded.state_dict()
    assert_bits_equal({k: got[k] for k in sd1}, sd1)
    assert torch.equal(bits(got["lm_head.weight"]), bits(sd1["model.embed_tokens.weight"]))


# ---------------------------------------------------------------- audit


@pytest.mark.slow
def test_audit_passes_and_writes_ledger(pub: Published, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    ledger = tmp_path / "ledger.parquet"
    r = aurora("audit", pub.uri, "--json", "--ledger", str(ledger))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] is True and doc["first_error"] is None
    assert [(v["version"], v["status"]) for v in doc["versions"]] == [(v, "ok") for v in range(VERSIONS)]
    table = pq.read_table(ledger)
    assert table.num_rows == VERSIONS
    rows = table.to_pylist()
    assert [row["version_hash"] for row in rows] == [pub.run.manifest(v).version_hash for v in range(VERSIONS)]
    assert rows[0]["parent_hash"] is None and rows[1]["parent_hash"] == rows[0]["version_hash"]
    assert [row["kind"] for row in rows] == ["full", "delta", "delta", "full", "delta", "delta"]
    assert all(row["signed"] is False and row["error"] is None for row in rows)
    human = aurora("audit", pub.uri)
    assert human.returncode == 0 and human.stdout.count(" ok ") == VERSIONS


def _flip(data: bytes) -> bytes:
    i = len(data) // 2
    return data[:i] + bytes([data[i] ^ 0x10]) + data[i + 1 :]


def damage(pub: Published, what: str) -> tuple[int, str, str]:
    """Plant one kind of damage; returns (failing version, URL of the object to blame, error type)."""
    store = pub.run.store
    if what in ("flip", "truncate", "delete"):
        key = pub.run.manifest(4).segments[0].key
        data = store.get(key, max_bytes=1 << 20)
        if what == "delete":
            delete(store, key)
            return 4, store.url(key), "MissingError"
        overwrite(store, key, _flip(data) if what == "flip" else data[:-3])
        return 4, store.url(key), "CorruptError"
    if what == "shard":
        key = pub.run.manifest(3).segments[0].key
        overwrite(store, key, _flip(store.get(key, max_bytes=1 << 20)))
        return 3, store.url(key), "CorruptError"
    if what == "manifest":
        key = manifest_key(2)
        data = store.get(key, max_bytes=1 << 20)
        assert b'"step":20' in data
        overwrite(store, key, data.replace(b'"step":20', b'"step":21'))
        return 2, store.url(key), "CorruptError"
    assert what == "gap"
    delete(store, manifest_key(2))
    return 3, store.url(manifest_key(2)), "ChainError"


OK, BAD, UNV = "ok", "failed", "unverified"
AFTER_DAMAGE = {
    "flip": {0: OK, 1: OK, 2: OK, 3: OK, 4: BAD, 5: UNV},
    "truncate": {0: OK, 1: OK, 2: OK, 3: OK, 4: BAD, 5: UNV},
    "delete": {0: OK, 1: OK, 2: OK, 3: OK, 4: BAD, 5: UNV},
    "shard": {0: OK, 1: OK, 2: OK, 3: BAD, 4: UNV, 5: UNV},
    "manifest": {0: OK, 1: OK, 2: BAD, 3: UNV, 4: OK, 5: OK},  # 3 is full: its weights check, its link cannot
    "gap": {0: OK, 1: OK, 3: BAD, 4: OK, 5: OK},
}
"""Every version's audit status after each kind of damage: later versions are still checked where they can be."""


@pytest.mark.slow
@pytest.mark.parametrize("what", sorted(AFTER_DAMAGE))
def test_audit_names_the_bad_object(pub: Published, tmp_path: Path, what: str) -> None:
    import pyarrow.parquet as pq

    version, url, kind = damage(pub, what)
    ledger = tmp_path / "ledger.parquet"
    r = aurora("audit", pub.uri, "--json", "--ledger", str(ledger))
    assert r.returncode == 1, r.stdout + r.stderr
    assert url in r.stderr and "Traceback" not in r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] is False
    assert doc["first_error"]["version"] == version and doc["first_error"]["object"] == url
    assert doc["first_error"]["type"] == kind and url in doc["first_error"]["error"]
    status = {row["version"]: row["status"] for row in doc["versions"]}
    assert status == AFTER_DAMAGE[what]
    rows = pq.read_table(ledger).to_pylist()
    assert len(rows) == len(doc["versions"]) and {r["version"]: r["status"] for r in rows} == status
    human = aurora("audit", pub.uri)
    assert human.returncode == 1 and url in human.stderr and "FAILED" in human.stdout


@pytest.mark.slow
def test_audit_keeps_going_after_a_bad_delta(pub: Published) -> None:
    key = pub.run.manifest(1).segments[0].key
    overwrite(pub.run.store, key, _flip(pub.run.store.get(key, max_bytes=1 << 20)))
    r = aurora("audit", pub.uri, "--json")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert [v["status"] for v in doc["versions"]] == ["ok", "failed", "unverified", "ok", "ok", "ok"]
    assert doc["first_error"]["object"] == pub.url(key)


@pytest.mark.slow
def test_audit_signatures(tmp_path: Path) -> None:
    key_a, pub_a = signing.generate_keypair()
    _, pub_b = signing.generate_keypair()
    (tmp_path / "a.pub").write_bytes(pub_a)
    (tmp_path / "b.pub").write_bytes(pub_b)
    signed = publish(tmp_path / "signed", signing_key=key_a, versions=3)
    unsigned = publish(tmp_path / "unsigned", versions=2)
    ok = aurora("audit", signed.uri, "--json", "--verify-key", str(tmp_path / "a.pub"))
    assert ok.returncode == 0, ok.stderr
    assert all(v["signed"] and v["key_id"] for v in json.loads(ok.stdout)["versions"])
    for p, key in ((signed, "b.pub"), (unsigned, "a.pub")):
        r = aurora("audit", p.uri, "--json", "--verify-key", str(tmp_path / key))
        assert r.returncode == 1
        err = json.loads(r.stdout)["first_error"]
        assert err["type"] == "UnauthenticatedError" and err["version"] == 0
        assert err["object"] == p.url(manifest_key(0)) and p.url(manifest_key(0)) in r.stderr
    wrong = aurora(
        "replay", signed.uri, "--version", "2", "--out", str(tmp_path / "o"), "--verify-key", str(tmp_path / "b.pub")
    )
    assert wrong.returncode == 1 and "signed by key" in wrong.stderr and not (tmp_path / "o").exists()
    (tmp_path / "junk.pub").write_bytes(b"not a key")
    junk = aurora("ls", signed.uri, "--verify-key", str(tmp_path / "junk.pub"))
    assert junk.returncode == 1 and junk.stderr.startswith("aurora: error: --verify-key")


def test_audit_empty_run_fails(tmp_path: Path) -> None:
    r = aurora("audit", f"file://{tmp_path}/none", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["first_error"]["type"] == "MissingError"


# ---------------------------------------------------------------- keygen, bench, imports


@pytest.mark.slow
def test_keygen_writes_a_usable_pair(tmp_path: Path) -> None:
    prefix = tmp_path / "trainer"
    r = aurora("keygen", "--out", str(prefix))
    assert r.returncode == 0, r.stderr
    key, pub = Path(f"{prefix}.key"), Path(f"{prefix}.pub")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    run = open_run(f"file://{tmp_path}/run", signing_key=str(key))
    run.publish(first_state())
    assert aurora("audit", run.uri, "--verify-key", str(pub)).returncode == 0
    again = aurora("keygen", "--out", str(prefix))
    assert again.returncode == 1 and "already exists" in again.stderr


def test_bench_codec_is_wired() -> None:
    pytest.importorskip("bench.codec.codec")
    r = aurora("bench", "codec", "--help")
    assert r.returncode == 0, r.stderr
    assert "--quick" in r.stdout and "aurora bench codec" in r.stdout


@pytest.mark.slow
def test_cli_never_imports_torch(pub: Published, tmp_path: Path) -> None:
    code = (
        "import sys\nfrom aurora_store.cli import main\n"
        f"assert main(['ls', {pub.uri!r}, '--json']) == 0\n"
        f"assert main(['audit', {pub.uri!r}, '--json']) == 0\n"
        f"assert main(['replay', {pub.uri!r}, '--version', '5', '--out', {str(tmp_path / 'o')!r}]) == 0\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------- attachments


@pytest.mark.parametrize("name", ["", "a/b", "..", ".", "/etc", "a\\b", "x" * 256, "a\nb", "nul\x00", ".tmp-x"])
def test_attachment_names_are_plain_file_names(tmp_path: Path, name: str) -> None:
    run = open_run(f"file://{tmp_path}/run")
    with pytest.raises(StoreError):
        run.files.put(name, b"x")
    with pytest.raises(StoreError):
        run.files.get(name)
    assert run.files.names() == []


def test_attachments_are_immutable(tmp_path: Path) -> None:
    run = open_run(f"file://{tmp_path}/run")
    assert run.files.put("config.json", b"{}") is True
    assert run.files.put("config.json", b"{}") is False
    with pytest.raises(ConflictError, match="config.json"):
        run.files.put("config.json", b'{"changed": 1}')
    assert run.files.put("tokenizer.json", b"tok") is True
    assert run.files.put("x" * 255, b"") is True
    assert run.files.names() == sorted(["config.json", "tokenizer.json", "x" * 255])
    assert run.files.get("config.json") == b"{}"
    with pytest.raises(MissingError):
        run.files.get("generation_config.json")
    with pytest.raises(StoreError):
        run.files.put("a.txt", "text, not bytes")  # type: ignore[arg-type]


@pytest.mark.slow
def test_audit_catches_a_rehashed_manifest_whose_stats_lie(pub: Published) -> None:
    import dataclasses

    key = manifest_key(3)
    m = parse_manifest(pub.run.store.get(key, max_bytes=1 << 20))
    forged = dataclasses.replace(m, stats=dataclasses.replace(m.stats, changed=m.stats.changed + 1))
    forged = dataclasses.replace(forged, version_hash=forged.compute_hash())
    overwrite(pub.run.store, key, forged.to_bytes())
    r = aurora("audit", pub.uri, "--json")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert doc["first_error"]["version"] == 3 and doc["first_error"]["object"] == pub.url(key)
    assert "stats.changed" in doc["first_error"]["error"]
    assert doc["versions"][4]["status"] == "failed" and "parent hash" in doc["versions"][4]["error"]


# ---------------------------------------------------------------- usage errors, as a user meets them


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["demo", "--stpes", "10"], "--stpes: did you mean --steps?"),
        (["demo", "--step", "10"], "--step: did you mean --steps?"),  # no prefix matching: not taken as --steps
        (["train", "--stor", "file:///x"], "--stor: did you mean --store?"),
        (["bench", "codec", "--layer", "2"], "unrecognized arguments: --layer"),
    ],
)
def test_a_misspelt_or_abbreviated_flag_is_refused_by_its_own_command(argv: list[str], says: str) -> None:
    got = aurora(*argv)
    assert got.returncode == 2 and got.stdout == ""
    assert says in got.stderr
    command = " ".join(argv[:2]) if argv[0] == "bench" else argv[0]
    assert got.stderr.startswith(f"aurora {command}: error:"), got.stderr  # the subcommand's, not the top level's


def test_a_missing_required_flag_says_so_first_and_briefly() -> None:
    got = aurora("relay")
    assert got.returncode == 2
    lines = got.stderr.strip().splitlines()
    assert lines[0].startswith("aurora relay: error: the following arguments are required:"), got.stderr
    assert len(lines) <= 3 and "aurora relay --help" in lines[-1]


def test_a_demo_without_steps_is_refused_before_it_starts(tmp_path: Path) -> None:
    got = aurora("demo", "--steps", "0", "--workdir", str(tmp_path / "w"))
    assert got.returncode == 1 and "--steps must be at least 1" in got.stderr
    assert not (tmp_path / "w").exists(), "nothing was started or written"


@pytest.mark.slow
def test_an_s3_store_without_credentials_says_where_they_go(s3_server: Any, tmp_path: Path) -> None:
    """botocore finds no credentials (none in the environment, the options or a credentials file): the
    one-line error says where to give them instead of only naming NoCredentialsError."""
    opts = {k: v for k, v in s3_server.options().items() if k not in ("key", "secret")}
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"))
    env.update(AWS_EC2_METADATA_DISABLED="true", PYTHONPATH=str(REPO))
    got = subprocess.run(
        [sys.executable, "-m", "aurora_store.cli", "ls", "s3://no-creds/run", "--storage-options", json.dumps(opts)],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=deadline(300),
    )  # fmt: skip
    assert got.returncode == 1 and "Traceback" not in got.stderr, got.stderr
    assert "NoCredentialsError" in got.stderr and "--storage-options" in got.stderr, got.stderr
