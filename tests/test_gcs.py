"""gs:// for real: the object-store contract, and each way GCS (through gcsfs) differs from S3,
against fake-gcs-server (the GCS JSON API on a local port, :mod:`aurora_store.testing.gcs`).

The root-parametrized tests of other modules run on memory://, file:// and s3:// only; the ones that
exercise what a bucket does (publish and materialize, racing publishers, damage, result payloads,
results gc) run on gs:// here, once each, rather than multiplying the whole suite by a fourth root.
"""

from __future__ import annotations

import http.client
import inspect
import json
import logging
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar, Self
from urllib.parse import urlsplit

import pytest

import aurora_store
from aurora_store.bucket import gc
from aurora_store.bucket.audit import audit
from aurora_store.bucket.objectstore import ObjectStore, RangeRequest
from aurora_store.bucket.results import put_payload
from aurora_store.cli import main
from aurora_store.errors import MissingError
from aurora_store.storage import GcsBackend
from aurora_store.testing.gcs import GcsServer
from aurora_store.testing.processes import deadline, wait_for
from aurora_store.testing.store_tests import StoreTests
from tests import test_gc, test_hostile, test_results_format, test_store
from tests.conftest import Root
from tests.helpers import bits_equal, state_dict, step

REPO = Path(__file__).resolve().parents[1]


class TestGcsStore(StoreTests):
    @pytest.fixture
    def store(self, gcs_server: GcsServer) -> Iterator[ObjectStore]:
        s = ObjectStore(f"gs://{gcs_server.new_bucket()}/runs/exp", gcs_server.options())
        yield s
        s.close()


@pytest.fixture
def gs_root(gcs_server: GcsServer) -> Root:
    return Root("gs", f"gs://{gcs_server.new_bucket()}/runs/exp", gcs_server.options())


ON_GCS: list[Callable[[Root], None]] = [
    test_store.test_publish_materialize_round_trip,
    test_store.test_concurrent_publishers_exactly_one_wins,
    test_store.test_retry_after_a_crash_half_way,
    test_store.test_existing_object_with_other_bytes_is_a_conflict,
    test_store.test_manifest_is_written_once,
    test_store.test_signed_run,
    test_store.test_full_versions_are_standard_safetensors,
    test_hostile.test_flipped_byte_in_a_segment,
    test_hostile.test_truncated_segment,
    test_hostile.test_missing_segment,
    test_results_format.test_put_and_get_on_every_backend,
    test_results_format.test_tampered_objects_are_corrupt,
    test_gc.test_gc_deletes_result_payloads_older_than_the_max_age,
]


@pytest.mark.parametrize("check", ON_GCS, ids=lambda f: f"{f.__module__.rsplit('.', 1)[-1]}.{f.__name__}")
def test_on_gcs(check: Callable[[Root], None], gs_root: Root) -> None:
    check(gs_root)


RACER = """
import json, os, sys, time
from aurora_store.bucket.objectstore import ObjectStore
store = ObjectStore(sys.argv[1], json.loads(sys.argv[2]))
store.exists("warm-up")  # connected before the start
open(sys.argv[3] + ".ready-" + sys.argv[4], "w").close()
while not os.path.exists(sys.argv[3]):
    time.sleep(0.001)
print(json.dumps(store.put_if_absent("versions/0000000001/manifest.json", sys.argv[4].encode())))
"""


def test_processes_racing_for_one_key(gs_root: Root, tmp_path: Path) -> None:
    """Writers in separate processes, each with its own gcsfs client and connections, race to create one
    key: exactly one is told it wrote it, and its bytes are the object's."""
    go, n = tmp_path / "go", 4
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, gs_root.uri, json.dumps(gs_root.storage_options), str(go), f"writer {i}"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    try:

        def ready() -> bool:
            assert all(p.poll() is None for p in procs), "a racer exited before the start"
            return len(list(tmp_path.glob("go.ready-*"))) == n

        wait_for(ready, "the racers to connect", 120, 0.01)
        go.touch()
        won = []
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            won.append(json.loads(out))
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
    assert won.count(True) == 1, won
    store = ObjectStore(gs_root.uri, gs_root.storage_options)
    assert store.get("versions/0000000001/manifest.json", max_bytes=100) == f"writer {won.index(True)}".encode()


# ---------------------------------------------------------------- creates: the paths where ifGenerationMatch=0 holds


def _gcsfs(server: GcsServer) -> Any:
    import gcsfs.core

    return gcsfs.core.GCSFileSystem(**server.options(), skip_instance_cache=True)


def test_fake_gcs_server_ignores_the_precondition_of_resumable_uploads(gcs_server: GcsServer) -> None:
    """Why the GCS backend never makes a resumable upload: fake-gcs-server checks ifGenerationMatch=0 on
    single-request uploads and drops it from resumable ones (its upload.go commits those with
    NoConditions), so create-only on that path cannot be exercised here. If this starts failing, the
    server honours it now: the backend may then let gcsfs choose resumable uploads again."""
    fs, bucket = _gcsfs(gcs_server), gcs_server.new_bucket()
    big, chunk = 600 << 10, 256 << 10
    fs.pipe_file(f"{bucket}/one", b"a", mode="create")
    with pytest.raises(FileExistsError):
        fs.pipe_file(f"{bucket}/one", b"b", mode="create")  # single request: refused with 412
    fs.pipe_file(f"{bucket}/big", b"a" * big, mode="create", chunksize=chunk)
    fs.pipe_file(f"{bucket}/big", b"b" * big, mode="create", chunksize=chunk)  # resumable: not refused
    assert fs.cat_file(f"{bucket}/big")[:1] == b"b", "the server replaced an object a create-only upload named"


def test_objects_above_gcsfs_resumable_threshold_are_created_once(gcs_server: GcsServer) -> None:
    """gcsfs would send these as resumable uploads; the backend sends one request, where the precondition holds."""
    from gcsfs.core import GCSFileSystem

    threshold = inspect.signature(GCSFileSystem._pipe_file).parameters["chunksize"].default
    assert threshold == 50 << 20, "gcsfs's resumable threshold moved: check the GCS backend's docstring"
    store = ObjectStore(f"gs://{gcs_server.new_bucket()}/runs/exp", gcs_server.options())
    data = bytes(range(256)) * ((threshold + 4096) // 256)
    assert store.put_if_absent("versions/0000000000/00000-big.safetensors", data)
    assert not store.put_if_absent("versions/0000000000/00000-big.safetensors", b"x" * len(data))
    assert store.size("versions/0000000000/00000-big.safetensors") == len(data)
    assert (
        store.get_range(RangeRequest("versions/0000000000/00000-big.safetensors", len(data) - 3, len(data)))
        == (data[-3:])
    )


def test_the_experimental_gcsfs_filesystem_is_never_used(gcs_server: GcsServer, tmp_path: Path) -> None:
    """gcsfs's default filesystem (GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT unset) overwrites on create-only in a
    zonal bucket and asks a gRPC API for every bucket's layout first (60 s against this server). A store
    opened under gcsfs's defaults works on its JSON-API filesystem, and at once."""
    code = (
        "import json, sys, time, gcsfs, gcsfs.core\n"
        "from aurora_store.bucket.objectstore import ObjectStore\n"
        "t0 = time.monotonic()\n"
        "s = ObjectStore(sys.argv[1], json.loads(sys.argv[2]))\n"
        "made = [s.put_if_absent('k', b'1'), s.put_if_absent('k', b'2')]\n"
        "print(json.dumps({'default': gcsfs.GCSFileSystem.__name__, 'used': type(s.fs).__name__,\n"
        "    'core': type(s.fs) is gcsfs.core.GCSFileSystem, 'made': made, 'keys': s.list_keys(''),\n"
        "    'seconds': time.monotonic() - t0}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"}
    uri = f"gs://{gcs_server.new_bucket()}/runs/exp"
    out = subprocess.run(
        [sys.executable, "-c", code, uri, json.dumps(gcs_server.options())],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["default"] == "ExtendedGcsFileSystem", "gcsfs's default filesystem changed: check the GCS backend"
    assert doc["used"] == "GCSFileSystem" and doc["core"]
    assert doc["made"] == [True, False] and doc["keys"] == ["k"]
    assert doc["seconds"] < deadline(20), f"{doc['seconds']:.1f} s: a storage-layout lookup was waited for"


# ---------------------------------------------------------------- reads, listings, missing things, errors


def test_a_read_at_the_end_is_empty_and_logs_nothing(gcs_server: GcsServer, caplog: pytest.LogCaptureFixture) -> None:
    """GCS answers 416 to a range that starts at the end; gcsfs raises its own HttpError (not an
    OSError, as s3fs does) after logging it with a traceback at ERROR."""
    store = ObjectStore(f"gs://{gcs_server.new_bucket()}/runs/exp", gcs_server.options())
    store.put_if_absent("s", b"0123456789")
    store.put_if_absent("empty", b"")
    with caplog.at_level(logging.DEBUG, logger="gcsfs"):
        assert store.get_range(RangeRequest("s", 10, 20)) == b""
        assert store.get("empty", max_bytes=10) == b""
        assert bytes(store.get_sized("s", 10, 5)) == b"0123456789"  # its last part starts at the end
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert isinstance(store.backend, GcsBackend)


def test_folder_placeholders_are_not_objects(gcs_server: GcsServer) -> None:
    """The Cloud Console's "create folder" (and gsutil's ``_$folder$`` era tools) leave zero-byte objects
    named ``prefix/``: gcsfs reports them as directories, so they are neither keys nor a run."""
    bucket = gcs_server.new_bucket()
    for name in ("runs/exp/", "runs/exp/versions/", "runs/exp/results/"):
        url = f"{gcs_server.endpoint}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}"
        urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"), timeout=30).read()
    store = ObjectStore(f"gs://{bucket}/runs/exp", gcs_server.options())
    assert store.list_keys("versions") == [] and store.list_modified("results") == []
    with pytest.raises(MissingError, match="nothing is stored under this URI"):
        store.require_run()
    assert aurora_store.open_run(store.uri, storage_options=gcs_server.options()).versions() == []
    store.put_if_absent("versions/0000000000/x", b"1")
    assert store.list_keys("") == ["versions/0000000000/x"]


def test_listing_is_by_directory_not_by_string_prefix(gcs_server: GcsServer) -> None:
    """GCS has no directories, only names; gcsfs lists a prefix as a directory (a trailing ``/``), so a
    sibling run or key sharing the prefix's letters is never listed with it, as on S3."""
    bucket = gcs_server.new_bucket()
    store = ObjectStore(f"gs://{bucket}/runs/exp", gcs_server.options())
    sibling = ObjectStore(f"gs://{bucket}/runs/expx", gcs_server.options())
    for key in ("files/a", "files2/b", "filesx", "versions/0000000001/x"):
        store.put_if_absent(key, b"1")
    sibling.put_if_absent("versions/0000000001/manifest.json", b"{}")
    assert store.list_keys("files") == ["files/a"]
    assert store.list_keys("") == ["files/a", "files2/b", "filesx", "versions/0000000001/x"]
    assert sibling.list_keys("") == ["versions/0000000001/manifest.json"]


def test_a_missing_bucket_is_named(gcs_server: GcsServer) -> None:
    store = ObjectStore("gs://no-such-bucket-aurora/runs/exp", gcs_server.options())
    with pytest.raises(MissingError, match="bucket 'no-such-bucket-aurora' does not exist"):
        store.require_run()
    assert store.list_keys("versions") == [] and not store.exists("versions/0000000000/manifest.json")
    for call in (lambda: store.put_if_absent("k", b"1"), lambda: store.get("k", max_bytes=1)):
        with pytest.raises(MissingError) as err:
            call()
        assert err.value.url == store.url("k")


def test_listing_ages_are_gcs_updated_times(gcs_server: GcsServer) -> None:
    """An object's age is GCS's ``updated`` time (s3fs lists ``LastModified``): gcsfs lists it as the
    ISO string GCS sends and as ``mtime``, an aware datetime, which the backend reads first."""
    store = ObjectStore(f"gs://{gcs_server.new_bucket()}/runs/exp", gcs_server.options())
    before = time.time()
    key, _ = put_payload(store, b"a payload")
    info = store.backend.find("results", detail=True)[store.path(key)]
    assert "LastModified" not in info and info["updated"].endswith("Z")
    assert info["mtime"] == datetime.fromisoformat(info["updated"]) and info["mtime"].tzinfo is not None
    [(listed, size, modified)] = store.list_modified("results")
    assert (listed, size) == (key, 9) and modified is not None and before - 5 <= modified <= time.time() + 5


def test_racing_retried_payload_puts(gcs_server: GcsServer) -> None:
    """Actors retrying the same payload (content-addressed) race on one key: every put succeeds, one object."""
    store = ObjectStore(f"gs://{gcs_server.new_bucket()}/runs/exp", gcs_server.options())
    barrier, keys = threading.Barrier(6), []

    def put() -> None:
        barrier.wait()
        keys.append(put_payload(store, b"p" * 1000)[0])

    threads = [threading.Thread(target=put) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(keys) == 6 and len(set(keys)) == 1 and store.list_keys("results") == keys[:1]


# ---------------------------------------------------------------- config


def test_a_gcs_regions_token_method_is_no_credential(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """gcsfs's ``token`` option usually names where credentials come from (``google_default``, ``cloud``,
    ``anon``): the config check used to warn of it as a credential (any key named like ``token``). A
    token that is credentials (their fields) is still warned of and never printed."""
    text = (
        'run_id = "x"\nhome = "us"\n[regions.us]\nuri = "s3://home/runs/x"\n'
        '[regions.eu]\nuri = "gs://eu/runs/x"\nsource = "us"\n'
        'storage_options = { token = "google_default", project = "p" }\n'
        '[regions.ap]\nuri = "gs://ap/runs/x"\nsource = "us"\n'
        'storage_options = { token = { client_id = "c", client_secret = "hunter4", refresh_token = "r" } }\n'
    )
    (tmp_path / "aurora.toml").write_text(text)
    assert main(["config", "check", str(tmp_path / "aurora.toml"), "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert [w for w in doc["warnings"] if "regions.eu" in w] == []
    assert sorted(w.split(":")[0] for w in doc["warnings"]) == [
        "regions.ap.storage_options.token.client_secret",
        "regions.ap.storage_options.token.refresh_token",
    ]
    assert "hunter4" not in captured.out and "hunter4" not in captured.err


# ---------------------------------------------------------------- aurora gc on gs://


def test_aurora_gc_on_gcs(gs_root: Root, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Versions retired and payloads aged by GCS's own times, through ``aurora gc``: what is kept audits
    and materializes bit-exact."""
    monkeypatch.delenv("AURORA_REDIS", raising=False)
    opts = json.dumps(gs_root.storage_options)
    run = aurora_store.open_run(gs_root.uri, storage_options=gs_root.storage_options, full_every=3)
    old = sorted(put_payload(run.store, bytes([i]) * 100)[0] for i in range(3))  # the clock starts for these
    hist = test_gc._publish(run, 6)
    max_age = 2
    wait_for(
        lambda: all(time.time() - (m or time.time()) > max_age + 0.5 for _, _, m in run.store.list_modified("results")),
        f"the payloads to be older than {max_age} s by GCS's clock",
        timeout=30,
        interval=0.1,
    )
    young = put_payload(run.store, b"y" * 100)[0]

    assert main(["gc", gs_root.uri, "--storage-options", opts, "--results-max-age", str(max_age), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["results"]["expired"] == 3 and doc["results"]["young"] == 1 and doc["results"]["undated"] == []
    assert main(["gc", gs_root.uri, "--storage-options", opts, "--results-max-age", str(max_age), "--apply"]) == 1
    assert "3 old results/ payload(s) deleted" in capsys.readouterr().err
    assert run.store.list_keys("results") == [young] and not set(old) & set(run.store.list_keys(""))

    fresh = aurora_store.open_run(gs_root.uri, storage_options=gs_root.storage_options)
    gc.apply(fresh, gc.plan(fresh, gc.RetentionPolicy(keep_last=2, keep_fulls=1)))  # Redis-free: the library's
    kept = aurora_store.open_run(gs_root.uri, storage_options=gs_root.storage_options)
    assert kept.versions() == [0, 3, 4, 5]
    assert audit(kept).ok
    for v in kept.versions():
        assert bits_equal(kept.materialize(v), hist[v])


# ---------------------------------------------------------------- retries


class _LosingHandler(BaseHTTPRequestHandler):
    """Forwards every request to the server; answers 503 instead of the server's answer to the uploads
    ``lose`` picks, after the server has acted on them (an answer lost on the way back)."""

    upstream: ClassVar[str]
    lose: ClassVar[Callable[[bytes], bool]]
    lost: ClassVar[list[str]]

    def _forward(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n)
        up = urlsplit(self.upstream)
        conn = http.client.HTTPConnection(up.hostname or "127.0.0.1", up.port, timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        conn.request(self.command, self.path, body=body or None, headers=headers)
        answer = conn.getresponse()
        data = answer.read()
        conn.close()
        if self.command == "POST" and self.path.startswith("/upload/") and answer.status == 200 and self.lose(body):
            self.lost.append(self.path)
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(answer.status)
        for k, v in answer.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _forward

    def log_message(self, format: str, *args: Any) -> None:
        pass


class LosingProxy:
    """An HTTP proxy in front of the GCS server that loses the answer to the first upload ``lose`` picks."""

    def __init__(self, upstream: str, lose: Callable[[bytes], bool]) -> None:
        lost: list[str] = []

        def once(body: bytes) -> bool:
            return not lost and lose(body)

        handler = type("Handler", (_LosingHandler,), {"upstream": upstream, "lose": staticmethod(once), "lost": lost})
        self.lost = lost
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.endpoint = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


@pytest.mark.slow
def test_a_commit_whose_answer_was_lost_is_the_publishers_own(gcs_server: GcsServer) -> None:
    """gcsfs retries an upload whose answer is lost (here a 503 after the server wrote the object); GCS
    refuses the retried create-only with 412, which reads as "the key is taken". The publisher finds its
    own bytes there and counts its commit, where it used to report a version "committed by another
    publisher" that it had committed itself."""
    uri = f"gs://{gcs_server.new_bucket()}/runs/exp"
    with LosingProxy(gcs_server.endpoint, lambda body: b"/manifest.json" in body) as proxy:
        opts = {**gcs_server.options(), "endpoint_url": proxy.endpoint}
        run = aurora_store.open_run(uri, storage_options=opts)
        sd = state_dict()
        assert run.publish(sd).version == 0
        assert len(proxy.lost) == 1, "the manifest's upload was answered 503 once, and retried"
        nxt = step(sd, 1)
        assert run.publish(nxt).version == 1, "the publisher goes on from the version it committed"
    with LosingProxy(gcs_server.endpoint, lambda body: b"lost answer" in body) as proxy:
        store = ObjectStore(uri, {**gcs_server.options(), "endpoint_url": proxy.endpoint})
        assert not store.put_if_absent("k", b"lost answer"), "the store itself cannot tell: the retry found the key"
        assert store.get("k", max_bytes=20) == b"lost answer" and len(proxy.lost) == 1
    fresh = aurora_store.open_run(uri, storage_options=gcs_server.options())
    assert fresh.versions() == [0, 1] and bits_equal(fresh.materialize(1), nxt)
