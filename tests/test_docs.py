"""The docs cannot drift from the code: every ```python block in README.md and docs/*.md runs,
and the manifest JSON Schema accepts what the store writes and refuses what its parser refuses.

Blocks of one document run in order in one fresh namespace (like a doctest session); a block
fenced as ```python no-run is skipped. Examples open runs under a unique memory:// root of their
own (a fresh uuid each run); whatever a document leaves in the memory filesystem is removed. A
document whose blocks name ``gs://BUCKET/`` runs against fake-gcs-server (the session's): the test
creates those buckets there and sets ``STORAGE_EMULATOR_HOST``, which gcsfs reads as Google's own
clients do.
"""

from __future__ import annotations

import hashlib
import json
import re
import traceback
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aurora_store.errors import StoreError
from aurora_store.format.manifest import TensorSpec, canonical
from aurora_store.format.manifest_parser import parse_manifest

REPO = Path(__file__).resolve().parent.parent
SCHEMA_PATH = REPO / "docs" / "manifest.schema.json"
_FENCE = re.compile(r"^```python(?P<info>[ \t][^\n]*)?\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def documents() -> list[Path]:
    docs = sorted((REPO / "docs").glob("*.md"))
    readme = REPO / "README.md"
    return ([readme] if readme.exists() else []) + docs


def code_blocks(text: str) -> Iterator[tuple[int, int, str, bool]]:
    """(block number from 1, first line of its code, code, runs) for every ```python fence."""
    for n, m in enumerate(_FENCE.finditer(text), start=1):
        info = (m.group("info") or "").split()
        yield n, text.count("\n", 0, m.start("body")) + 1, m.group("body"), "no-run" not in info


_GS_BUCKET = re.compile(r"gs://([a-z0-9][a-z0-9_.-]*[a-z0-9])/")


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_doc_examples_run(doc: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    import fsspec

    name = str(doc.relative_to(REPO))
    buckets = {
        b for _, _, code, runs in code_blocks(doc.read_text(encoding="utf-8")) if runs for b in _GS_BUCKET.findall(code)
    }
    if buckets:  # gs:// examples run against fake-gcs-server, found as Google's clients find an emulator
        gcs = request.getfixturevalue("gcs_server")
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.endpoint)
        for bucket in sorted(buckets):
            gcs.new_bucket(bucket)
    namespace: dict[str, Any] = {"__name__": f"__docs_{doc.stem}__"}
    before = set(fsspec.filesystem("memory").store)
    failure = None
    try:
        for n, line, code, runs in code_blocks(doc.read_text(encoding="utf-8")):
            if not runs:
                continue
            try:  # padded so that tracebacks give the document's own line numbers
                exec(compile("\n" * (line - 1) + code, name, "exec"), namespace)
            except Exception as exc:
                detail = "".join(traceback.format_exception(exc)[-6:])
                failure = f"{name}: python block {n} (line {line}) failed: {type(exc).__name__}: {exc}\n{detail}"
                break
    finally:
        store = fsspec.filesystem("memory").store
        for path in set(store) - before:
            store.pop(path, None)
    if failure is not None:
        pytest.fail(failure, pytrace=False)


def test_format_spec_has_examples_and_schema_link() -> None:
    text = (REPO / "docs" / "FORMAT.md").read_text(encoding="utf-8")
    runnable = [b for b in code_blocks(text) if b[3]]
    assert len(runnable) >= 4
    assert "manifest.schema.json" in text


def test_fence_parser() -> None:
    text = "x\n```python\na = 1\n```\n```python no-run\nboom()\n```\n```py\nnot python\n```\n"
    assert [(n, line, code, runs) for n, line, code, runs in code_blocks(text)] == [
        (1, 3, "a = 1\n", True),
        (2, 6, "boom()\n", False),
    ]


# ---------------------------------------------------------------- the manifest schema


@pytest.fixture(scope="module")
def validator() -> Any:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def load(data: bytes) -> Any:
    """JSON as the schema must see it: a number with a fraction or exponent is never an integer."""
    return json.loads(data, parse_float=Decimal)


def _words(rng: np.random.Generator, spec: TensorSpec) -> np.ndarray:
    bits = rng.integers(0, 1 << (8 * spec.width), size=spec.numel, dtype=np.uint64)
    return bits.astype(f"<u{spec.width}")


def _bf16(x: np.ndarray) -> np.ndarray:
    """FP32 values rounded to BF16 (nearest even), as words."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")


def published_manifests(signed: bool) -> list[bytes]:
    """Manifest bytes of a full version and of deltas with sparse (escaped and not), classed and dense blocks."""
    from aurora_store import open_run
    from aurora_store.format.signing import generate_keypair

    private, public = generate_keypair() if signed else (None, None)
    run = open_run(
        f"memory://aurora-docs-test/{uuid.uuid4().hex}/run", signing_key=private, verify_key=public, segment_bytes=512
    )
    specs = (
        TensorSpec("a.bias", "F32", (16,)),
        TensorSpec("a.weight", "BF16", (8, 32)),
        TensorSpec("b.weight", "BF16", (64, 64)),
        TensorSpec("count", "I64", (3,)),
        TensorSpec("mask", "BOOL", (2, 2)),
        TensorSpec("scalar", "F16", ()),
    )
    rng = np.random.default_rng(7)
    words = {s.name: _words(rng, s) for s in specs}
    # trained-looking weights (FP32 masters rounded to BF16) and a small step of every master: the
    # small weights, whose ULP is small, change more often (the classed codec's case)
    masters = rng.normal(0, 0.02, 4096).astype(np.float32)
    words["b.weight"] = _bf16(masters)
    try:
        run.publish_words(specs, words, step=0, meta={"note": "é"})
        w = words["a.weight"].copy()
        w[::7] += 1
        w[3] ^= 0x8000
        b = _bf16(masters + np.float32(2e-5) * rng.choice(np.array([-1, 1], np.float32), masters.size))
        words = {**words, "a.weight": w, "b.weight": b, "count": words["count"] + np.uint64(1)}
        run.publish_words(specs, words, kind="delta", step=1)
        run.publish_words(specs, words, kind="delta", step=2)  # nothing changed: no segments
        return [run.store.get(f"versions/{v:010d}/manifest.json", max_bytes=1 << 20) for v in run.versions()]
    finally:
        run.close()


@pytest.fixture(scope="module")
def manifests() -> dict[bool, list[bytes]]:
    return {signed: published_manifests(signed) for signed in (False, True)}


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
def test_store_manifests_match_schema(validator: Any, manifests: dict[bool, list[bytes]], signed: bool) -> None:
    raws = manifests[signed]
    kinds = [json.loads(r)["kind"] for r in raws]
    assert kinds == ["full", "delta", "delta"]
    codecs = {b["codec"] for s in json.loads(raws[1])["segments"] for b in s["blocks"]}
    assert codecs == {"sparse", "classed", "dense"}
    assert [json.loads(r)["format"] for r in raws] == ["aurora/2", "aurora/3", "aurora/2"]
    for raw in raws:
        errors = [e.message for e in validator.iter_errors(load(raw))]
        assert errors == [], errors
        assert (json.loads(raw)["signature"] is not None) == signed
        parse_manifest(raw)


def _reseal(doc: dict[str, Any]) -> bytes:
    """Re-hash a mutated manifest, so the parser must refuse it for its structure, not its hash."""
    body = {k: v for k, v in doc.items() if k not in ("version_hash", "signature")}
    doc = {**doc, "version_hash": hashlib.sha256(canonical(body)).hexdigest(), "signature": None}
    return canonical(doc)


def _block(doc: dict[str, Any], codec: str) -> dict[str, Any]:
    return next(b for s in doc["segments"] for b in s["blocks"] if b["codec"] == codec)


Mutation = Callable[[dict[str, Any]], Any]

HOSTILE: dict[str, Mutation] = {
    "extra-top-level-field": lambda d: d.update(extra=1),
    "extra-block-field": lambda d: _block(d, "sparse").update(note="x"),
    "missing-field": lambda d: d.pop("meta"),
    "float-step": lambda d: d.update(step=1.5),
    "float-syntax-version": lambda d: d.update(version=1.0),
    "float-syntax-size": lambda d: d["segments"][0].update(size=float(d["segments"][0]["size"])),
    "bool-count": lambda d: _block(d, "dense").update(count=True),
    "uppercase-hex-sha256": lambda d: d["segments"][0].update(sha256=d["segments"][0]["sha256"].upper()),
    "short-hex-parent": lambda d: d["parent"].update(version_hash=d["parent"]["version_hash"][:63]),
    "non-hex-digest": lambda d: d.update(weights_digest="g" * 32),
    "key-dotdot": lambda d: d["segments"][0].update(key="versions/0000000001/../0000000000/x.seg"),
    "key-absolute": lambda d: d["segments"][0].update(key="/versions/0000000001/x.seg"),
    "key-outside-versions": lambda d: d["segments"][0].update(key="files/x.seg"),
    "unknown-codec": lambda d: _block(d, "dense").update(codec="lz4"),
    "unknown-dtype": lambda d: d["tensors"][0].update(dtype="FP32"),
    "unknown-kind": lambda d: d.update(kind="patch"),
    "wrong-format": lambda d: d.update(format="aurora/7"),
    "counted-true": lambda d: (d.update(format="aurora/5"), d["stats"].update(counted=True)),
    "counted-in-aurora/4": lambda d: (d.update(format="aurora/4"), d["stats"].update(counted=False)),
    "counted-in-a-delta": lambda d: (d.update(format="aurora/5"), d["stats"].update(counted=False)),
    "classed-no-classes": lambda d: _block(d, "classed").update(classes=0),
    "classed-four-streams": lambda d: _block(d, "classed").update(streams=_block(d, "classed")["streams"][:4]),
    "classed-gap-width": lambda d: _block(d, "classed").update(gap_width=4),
    "legacy-format-with-run": lambda d: d.update(format="aurora/1"),
    "no-run": lambda d: d.pop("run"),
    "run-without-origin": lambda d: d["run"].update(origin=None),
    "run-extra-field": lambda d: d["run"].update(note="x"),
    "run-bad-signer": lambda d: d["run"].update(signed_by="XYZ"),
    "object-named-manifest": lambda d: d["segments"][0].update(key="versions/0000000001/manifest.json"),
    "delta-with-index": lambda d: d.update(
        index={"key": "versions/0000000001/i.json", "size": 1, "sha256": "0" * 64, "tensors": []}
    ),
    "no-parent": lambda d: d.update(parent=None),
    "two-streams": lambda d: _block(d, "sparse").update(streams=_block(d, "sparse")["streams"][:2]),
    "negative-start": lambda d: _block(d, "sparse").update(start=-1),
    "meta-not-string": lambda d: d.update(meta={"k": 1}),
    "file-key-escapes": lambda d: d.update(files=[{"key": "files/../x", "size": 1, "sha256": "0" * 64, "tensors": []}]),
    "file-key-nested": lambda d: d.update(files=[{"key": "files/a/b", "size": 1, "sha256": "0" * 64, "tensors": []}]),
    "file-hidden-name": lambda d: d.update(
        files=[{"key": "files/.tmp-x", "size": 1, "sha256": "0" * 64, "tensors": []}]
    ),
    "gap-width-6": lambda d: _block(d, "sparse").update(gap_width=6),
    "key-trailing-newline": lambda d: d["segments"][0].update(key=d["segments"][0]["key"] + "\n"),
    "sha256-trailing-newline": lambda d: d["segments"][0].update(sha256=d["segments"][0]["sha256"] + "\n"),
    "index-tensors-on-delta": lambda d: d.update(
        index={"key": "versions/0000000001/i.json", "size": 1, "sha256": "0" * 64, "tensors": [0]}
    ),
    "version-over-ten-digits": lambda d: d.update(version=10**10),
}


def _hostile(manifests: dict[bool, list[bytes]], mutate: Mutation) -> bytes:
    doc = json.loads(manifests[False][1])
    mutate(doc)
    return _reseal(doc)


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_manifest_refused_by_schema_and_parser(
    validator: Any, manifests: dict[bool, list[bytes]], case: str
) -> None:
    raw = _hostile(manifests, HOSTILE[case])
    assert not validator.is_valid(load(raw)), f"schema accepts {case}"
    with pytest.raises(StoreError):
        parse_manifest(raw)


def test_a_classed_block_needs_format_aurora_3(manifests: dict[bool, list[bytes]]) -> None:
    """A version in an older format is read by readers that predate the classed codec: it may not hold one."""
    raw = _hostile(manifests, lambda d: d.update(format="aurora/2"))
    with pytest.raises(StoreError, match="classed codec needs format aurora/3"):
        parse_manifest(raw)


def test_resealed_unmutated_manifest_is_valid(validator: Any, manifests: dict[bool, list[bytes]]) -> None:
    """The hostile cases above differ from a valid manifest only by their mutation."""
    raw = _hostile(manifests, lambda d: None)
    assert validator.is_valid(load(raw))
    parse_manifest(raw)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d["tensors"][0].update(name="\ud800"),
        lambda d: d.update(signature={"alg": "rsa", "key_id": "0" * 16, "sig": "A" * 86 + "=="}),
        lambda d: d.update(signature={"alg": "ed25519", "key_id": "xyz", "sig": "A" * 86 + "=="}),
        lambda d: d.update(signature={"alg": "ed25519", "key_id": "0" * 16, "sig": "not base64"}),
    ],
    ids=["lone-surrogate-name", "signature-alg", "signature-key-id", "signature-sig"],
)
def test_parser_refuses_what_a_schema_cannot_say(manifests: dict[bool, list[bytes]], mutate: Mutation) -> None:
    doc = json.loads(manifests[False][1])
    body = {k: v for k, v in doc.items() if k not in ("version_hash", "signature")}
    mutate(body)
    sig = body.pop("signature", None)
    doc = {**body, "version_hash": hashlib.sha256(canonical(body)).hexdigest(), "signature": sig}
    with pytest.raises(StoreError):
        parse_manifest(canonical(doc))
