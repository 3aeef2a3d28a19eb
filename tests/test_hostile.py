"""Hostile inputs: every one is a clear error of the store's family and changes nothing committed."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
import zstandard

import aurora_store
from aurora_store import ChainError, CorruptError, LimitError, MissingError, StoreError, UnauthenticatedError
from aurora_store.format.keys import manifest_key
from aurora_store.format.manifest import canonical
from aurora_store.testing.damage import delete, overwrite
from tests.conftest import Root
from tests.helpers import bits_equal, state_dict, step


def make_run(root: Root, versions: int = 4, **kw: Any) -> tuple[aurora_store.Run, list[dict[str, Any]]]:
    run = aurora_store.open_run(root.uri, storage_options=root.storage_options, segment_bytes=256, **kw)
    hist = []
    sd = state_dict()
    for v in range(versions):
        run.publish(sd)
        hist.append(sd)
        sd = step(sd, v)
    return run, hist


def reopen(root: Root, **kw: Any) -> aurora_store.Run:
    return aurora_store.open_run(root.uri, storage_options=root.storage_options, **kw)


def forge(run: aurora_store.Run, version: int, mutate: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite a manifest with ``mutate`` applied and a correct version hash (an attacker's best effort)."""
    doc = json.loads(run.store.get(manifest_key(version), max_bytes=1 << 24))
    mutate(doc)
    body = {k: v for k, v in doc.items() if k not in ("version_hash", "signature")}
    doc["version_hash"] = hashlib.sha256(canonical(body)).hexdigest()
    overwrite(run.store, manifest_key(version), canonical(doc))


def committed_state_intact(root: Root, hist: list[dict[str, Any]], upto: int) -> None:
    fresh = reopen(root)
    for v in range(upto):
        assert bits_equal(fresh.materialize(v), hist[v]), v


def first_delta_segment(run: aurora_store.Run, version: int = 2) -> str:
    m = run.manifest(version)
    assert m.kind == "delta" and m.segments
    return m.segments[0].key


def test_flipped_byte_in_a_segment(root: Root) -> None:
    run, hist = make_run(root)
    key = first_delta_segment(run)
    data = bytearray(run.store.get(key, max_bytes=1 << 20))
    data[len(data) // 2] ^= 0x01
    overwrite(run.store, key, bytes(data))
    with pytest.raises(CorruptError, match=f"{key}: sha256"):
        reopen(root).materialize(2)
    with pytest.raises(CorruptError):
        reopen(root).materialize(3)
    committed_state_intact(root, hist, 2)
    assert reopen(root).versions() == [0, 1, 2, 3]


def test_truncated_segment(root: Root) -> None:
    run, hist = make_run(root)
    key = first_delta_segment(run)
    data = run.store.get(key, max_bytes=1 << 20)
    overwrite(run.store, key, data[:-7])
    with pytest.raises(CorruptError, match=f"{key} is truncated"):
        reopen(root).materialize(2)
    committed_state_intact(root, hist, 2)


def test_missing_segment(root: Root) -> None:
    run, hist = make_run(root)
    key = first_delta_segment(run)
    delete(run.store, key)
    with pytest.raises(MissingError, match=key):
        reopen(root).materialize(2)
    committed_state_intact(root, hist, 2)


def test_wrong_hash_in_manifest(root: Root) -> None:
    run, hist = make_run(root)

    def mutate(doc: dict[str, Any]) -> None:
        doc["segments"][0]["sha256"] = "0" * 64

    forge(run, 2, mutate)
    with pytest.raises(CorruptError, match="sha256 .* manifest says 0000"):
        reopen(root).materialize(2)
    # the forged manifest breaks the chain for its child too, whose parent hash no longer matches
    with pytest.raises(ChainError, match="parent hash"):
        reopen(root).materialize(3)
    committed_state_intact(root, hist, 2)


def test_tampered_manifest_without_rehash(root: Root) -> None:
    run, hist = make_run(root)
    doc = json.loads(run.store.get(manifest_key(1), max_bytes=1 << 24))
    doc["step"] = 12345
    overwrite(run.store, manifest_key(1), canonical(doc))
    with pytest.raises(CorruptError, match="version_hash .* does not match"):
        reopen(root).materialize(1)
    committed_state_intact(root, hist, 1)


def test_digest_mismatch_is_a_chain_error(root: Root) -> None:
    run, hist = make_run(root)

    def mutate(doc: dict[str, Any]) -> None:
        doc["weights_digest"] = "ab" * 16

    forge(run, 1, mutate)
    with pytest.raises(ChainError, match="weights digest"):
        reopen(root).materialize(1)
    committed_state_intact(root, hist, 1)


@pytest.mark.parametrize(
    "payload",
    [b"", b"{", b"[]", b"null", b'{"format": "aurora/1"}', b"\xff\xfe", b'{"version": 1.5}', b"[" * 100_000],
    ids=["empty", "truncated", "list", "null", "partial", "binary", "float", "deep"],
)
def test_malformed_manifest(root: Root, payload: bytes) -> None:
    run, hist = make_run(root, versions=3)
    overwrite(run.store, manifest_key(2), payload)
    with pytest.raises(CorruptError, match=manifest_key(2)):
        reopen(root).materialize(2)
    committed_state_intact(root, hist, 2)
    with pytest.raises(CorruptError):
        reopen(root).publish(hist[-1])  # a publisher refuses to build on a corrupt head
    assert reopen(root).versions() == [0, 1, 2]


def test_oversized_manifest(root: Root) -> None:
    run, hist = make_run(root, versions=2)
    overwrite(run.store, manifest_key(1), b" " * 5000)
    small = aurora_store.Limits(max_manifest_bytes=4096)
    with pytest.raises(LimitError, match="cap of 4096"):
        reopen(root, limits=small).materialize(1)
    committed_state_intact(root, hist, 1)


@pytest.mark.parametrize(
    "bad_key",
    [
        "../escape.seg",
        "versions/0000000002/../../x.seg",
        "/abs.seg",
        "versions/0000000001/other-version.seg",
        "s3://bucket/x",
        "versions/0000000002/",
    ],
)
def test_key_escaping_the_prefix(root: Root, bad_key: str) -> None:
    run, hist = make_run(root)

    def mutate(doc: dict[str, Any]) -> None:
        doc["segments"][0]["key"] = bad_key

    forge(run, 2, mutate)
    with pytest.raises(CorruptError, match="escapes the run prefix"):
        reopen(root).materialize(2)
    committed_state_intact(root, hist, 2)


def test_version_gap(root: Root) -> None:
    run, hist = make_run(root)
    delete(run.store, manifest_key(2))
    assert reopen(root).versions() == [0, 1, 3]
    with pytest.raises(ChainError, match="needs version 2, which is missing"):
        reopen(root).materialize(3)
    committed_state_intact(root, hist, 2)


def test_manifest_at_the_wrong_version(root: Root) -> None:
    run, _ = make_run(root, versions=3)
    overwrite(run.store, manifest_key(2), run.store.get(manifest_key(1), max_bytes=1 << 24))
    with pytest.raises(CorruptError, match="declares version 1, expected 2"):
        reopen(root).materialize(2)


def test_wrong_and_missing_signature(root: Root) -> None:
    from aurora_store.format.signing import generate_keypair

    priv, pub = generate_keypair()
    run, hist = make_run(root, signing_key=priv)
    ok = reopen(root, verify_key=pub)
    assert bits_equal(ok.materialize(3), hist[3])

    def keep_old_signature(doc: dict[str, Any]) -> None:
        doc["step"] = 7  # an attacker changes the manifest and cannot re-sign it

    forge(run, 3, keep_old_signature)
    with pytest.raises(UnauthenticatedError, match="does not verify"):
        reopen(root, verify_key=pub).materialize(3)

    def strip(doc: dict[str, Any]) -> None:
        doc["signature"] = None

    forge(run, 3, strip)
    with pytest.raises(UnauthenticatedError, match="unsigned"):
        reopen(root, verify_key=pub).materialize(3)

    def resign_with_attacker_key(doc: dict[str, Any]) -> None:
        from aurora_store.format.signing import load_signing_key, sign

        body = {k: v for k, v in doc.items() if k not in ("version_hash", "signature")}
        attacker = load_signing_key(generate_keypair()[0])
        doc["signature"] = sign(hashlib.sha256(canonical(body)).hexdigest(), attacker).to_dict()

    forge(run, 2, resign_with_attacker_key)
    with pytest.raises(UnauthenticatedError, match="signed by key"):
        reopen(root, verify_key=pub).materialize(2)

    def forge_key_id(doc: dict[str, Any]) -> None:
        doc["signature"]["key_id"] = ok.reader.manifest(1).signature.key_id  # type: ignore[union-attr]

    forge(run, 1, lambda d: (resign_with_attacker_key(d), forge_key_id(d)))
    with pytest.raises(UnauthenticatedError, match="does not verify"):
        reopen(root, verify_key=pub).materialize(1)
    assert bits_equal(reopen(root, verify_key=pub).materialize(0), hist[0])


BOMB = zstandard.ZstdCompressor(level=3).compress(bytes(1 << 30))
"""A frame of a few tens of KiB that declares (and would inflate to) 1 GiB."""


def _replace_segment(run: aurora_store.Run, version: int, data: bytes, block: dict[str, Any]) -> None:
    """Plant a new segment (correctly hashed) holding one crafted block."""
    key = f"versions/{version:010d}/99999-{'ab' * 16}.seg"
    overwrite(run.store, key, data)

    def mutate(doc: dict[str, Any]) -> None:
        doc["segments"] = [
            {
                "key": key,
                "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                "blocks": [dict(block, offset=0, length=len(data))],
            }
        ]

    forge(run, version, mutate)


def test_decompression_bomb_declared_size(root: Root) -> None:
    """A tiny frame that would inflate to 1 GiB is refused before it is decompressed."""
    run, hist = make_run(root, versions=2)
    m = run.manifest(1)
    t = next(i for i, s in enumerate(m.tensors) if s.dtype == "I64")
    bomb = BOMB
    assert len(bomb) < 100_000
    _replace_segment(run, 1, bomb, {"tensor": t, "start": 0, "stop": 20, "codec": "dense", "count": 20})
    with pytest.raises(LimitError, match="declares 1073741824 bytes, expected 160"):
        reopen(root).materialize(1)
    committed_state_intact(root, hist, 1)


def test_decompression_bomb_over_the_block_cap(root: Root) -> None:
    run, _ = make_run(root, versions=2)
    m = run.manifest(1)
    t = next(i for i, s in enumerate(m.tensors) if s.name == "model.embed_tokens.weight")
    n = m.tensors[t].numel
    frame = zstandard.ZstdCompressor().compress(b"\1" * 64)
    _replace_segment(
        run,
        1,
        frame * 4,
        {
            "tensor": t,
            "start": 0,
            "stop": n,
            "codec": "sparse",
            "count": n,
            "gap_width": 8,
            "escapes": 0,
            "split": 0,
            "streams": [len(frame)] * 4,
        },
    )
    small = aurora_store.Limits(max_block_decoded_bytes=1000)
    with pytest.raises(LimitError, match="over the cap of 1000"):
        reopen(root, limits=small).materialize(1)


def test_segment_over_the_size_cap(root: Root) -> None:
    make_run(root, versions=2)
    with pytest.raises(LimitError, match="segment cap"):
        reopen(root, limits=aurora_store.Limits(max_segment_bytes=64)).materialize(1)


def test_errors_are_one_family() -> None:
    for cls in (
        CorruptError,
        LimitError,
        ChainError,
        MissingError,
        UnauthenticatedError,
        aurora_store.ConflictError,
        aurora_store.LayoutError,
        aurora_store.UnsupportedError,
        aurora_store.UnreachableError,
    ):
        assert issubclass(cls, StoreError) and issubclass(cls, ValueError)
    assert issubclass(MissingError, FileNotFoundError)


def test_unknown_protocol_and_unreachable_backend(tmp_path: Any) -> None:
    with pytest.raises(aurora_store.UnsupportedError, match="nosuchproto"):
        aurora_store.open_run("nosuchproto://x/run")
    dead = {
        "key": "k",
        "secret": "s",
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"},
        "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1},
    }
    run = aurora_store.open_run("s3://bucket/run", storage_options=dead)
    with pytest.raises(aurora_store.UnreachableError, match="storage backend error.*does not answer"):
        run.versions()


def test_an_endpoint_that_answers_with_an_error_is_not_unreachable() -> None:
    """Issue 39: only an endpoint that does not answer is worth waiting for; one that refuses (here every
    request gets 403 AccessDenied, as with wrong credentials) is a plain StoreError at once."""

    class Denying(http.server.BaseHTTPRequestHandler):
        def _deny(self) -> None:
            body = b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
            self.send_response(403)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_HEAD = do_PUT = do_POST = _deny

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Denying)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        options = {
            "key": "k",
            "secret": "s",
            "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{server.server_address[1]}"},
            "config_kwargs": {"retries": {"max_attempts": 1}},
        }
        run = aurora_store.open_run("s3://bucket/run", storage_options=options)
        with pytest.raises(StoreError) as caught:
            run.versions()
        assert not isinstance(caught.value, aurora_store.UnreachableError), caught.value
    finally:
        server.shutdown()


def test_bad_key_material(tmp_path: Any) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_bytes(b"-----BEGIN NOTHING-----\nzzz\n")
    with pytest.raises(StoreError, match="PEM"):
        aurora_store.open_run("memory://x/keys", verify_key=str(junk))
    with pytest.raises(StoreError, match="cannot read key file"):
        aurora_store.open_run("memory://x/keys", signing_key=str(tmp_path / "absent.key"))
