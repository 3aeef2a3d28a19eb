"""The object-store contract (aurora_store.testing.store_tests) on every backend: file://,
memory:// and the real S3 protocol (a moto server, through s3fs); and the refusal of an fsspec
protocol that cannot create objects atomically."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from aurora_store import storage
from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.errors import StoreError, UnsupportedError
from aurora_store.testing.moto import S3Server
from aurora_store.testing.store_tests import StoreTests


class TestFileStore(StoreTests):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[ObjectStore]:
        s = ObjectStore(f"file://{tmp_path}/run/")
        yield s
        s.close()

    def test_backend_errors_become_store_errors_naming_the_object(self, tmp_path: Path) -> None:
        (tmp_path / "flat").write_bytes(b"a file, not a directory")
        s = ObjectStore(f"file://{tmp_path}/flat/run")
        with pytest.raises(StoreError, match="storage backend error") as err:
            s.put_if_absent("k", b"1")
        assert err.value.url == s.url("k") and not isinstance(err.value, OSError)


class TestMemoryStore(StoreTests):
    @pytest.fixture
    def store(self) -> Iterator[ObjectStore]:
        s = ObjectStore(f"memory://store-tests/{uuid.uuid4().hex}/run")
        yield s
        s.close()


class TestS3Store(StoreTests):
    @pytest.fixture
    def store(self, s3_server: S3Server) -> Iterator[ObjectStore]:
        s = ObjectStore(f"s3://{s3_server.new_bucket()}/runs/exp", s3_server.options())
        yield s
        s.close()


@pytest.mark.parametrize("uri", ["", "nosuchscheme://x/y"])
def test_bad_uris_are_refused(uri: str) -> None:
    with pytest.raises((StoreError, UnsupportedError)):
        ObjectStore(uri)


class EmulatedCreate(MemoryFileSystem):
    """A filesystem whose ``mode="create"`` is exists-then-write: two racing writers can both
    pass the check, and the later replaces the earlier's object."""

    protocol = "aurora-emulated-create"
    store: ClassVar[dict[str, Any]] = {}
    pseudo_dirs: ClassVar[list[str]] = [""]
    between: ClassVar[list[Any]] = []
    """Called between the check and the write (a racing writer gets in there)."""

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        if mode == "create":
            if self.exists(path):
                raise FileExistsError(path)
            for hook in self.between:
                hook()
        super().pipe_file(path, value, **kwargs)


@pytest.fixture
def emulated() -> Iterator[str]:
    fsspec.register_implementation(EmulatedCreate.protocol, EmulatedCreate, clobber=True)  # a test-only protocol
    yield f"{EmulatedCreate.protocol}://bucket/{uuid.uuid4().hex}/run"
    EmulatedCreate.store.clear()
    EmulatedCreate.between.clear()


def test_the_emulation_really_loses_an_object(emulated: str) -> None:
    """Why it is refused: through fsspec alone, both racing writers "create" and the first object is gone."""
    fs, path = fsspec.core.url_to_fs(f"{emulated}/k")
    EmulatedCreate.between.append(lambda: (EmulatedCreate.between.clear(), fs.pipe_file(path, b"first", mode="create")))
    fs.pipe_file(path, b"second", mode="create")
    assert fs.cat_file(path) == b"second", "the first writer was told it created an object that is now gone"


def test_a_protocol_that_cannot_create_atomically_is_refused_when_opened(emulated: str) -> None:
    with pytest.raises(UnsupportedError, match="not known to create objects atomically") as err:
        ObjectStore(emulated)
    message = str(err.value)
    assert "aurora-emulated-create" in message and "trust_atomic_create" in message and "s3" in message
    assert err.value.url == emulated


@pytest.mark.parametrize(
    "uri", ["ftp://127.0.0.1:{port}/x", "zip://x", "zip://x::file:///tmp", "http://127.0.0.1:{port}/r"]
)
def test_an_unsupported_protocol_is_refused_before_anything_is_contacted(uri: str, tmp_path: Path) -> None:
    """Issue 34, bug 8: ``ftp://127.0.0.1:P/x`` connected to the server and then failed with EOFError; ``zip://x``
    opened the working directory ("Is a directory"). The protocol is refused first, by name."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.5)
        uri = uri.format(port=server.getsockname()[1])
        with pytest.raises(UnsupportedError, match="not known to create objects atomically"):
            ObjectStore(uri)
        with pytest.raises(TimeoutError):
            server.accept()  # nobody connected


def test_a_protocol_declared_atomic_is_opened_and_says_why(emulated: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage._fsspec, "ATOMIC_CREATE", dict(storage.ATOMIC_CREATE))
    with pytest.raises(ValueError, match="say why"):
        storage.trust_atomic_create(EmulatedCreate.protocol, " ")
    storage.trust_atomic_create(EmulatedCreate.protocol, "a test declares it")
    s = ObjectStore(emulated)
    assert isinstance(s.backend, storage.FsspecBackend) and s.backend.why_atomic == "a test declares it"
    assert s.put_if_absent("k", b"1") and not s.put_if_absent("k", b"2")


def test_the_uri_picks_the_backend(tmp_path: Path, s3_server: S3Server) -> None:
    file, memory = ObjectStore(f"file://{tmp_path}/run"), ObjectStore(f"memory://picks/{uuid.uuid4().hex}/run")
    s3 = ObjectStore(f"s3://{s3_server.new_bucket()}/runs/exp", s3_server.options())
    assert type(file.backend) is storage.LocalBackend and type(memory.backend) is storage.MemoryBackend
    assert type(s3.backend) is storage.FsspecBackend and "If-None-Match" in str(s3.backend.why_atomic)
    assert file.capabilities.staged_write and not memory.capabilities.staged_write
    assert not s3.capabilities.staged_write and not s3.capabilities.positional_read


def test_file_uris_are_decoded_and_name_this_host_only(tmp_path: Path) -> None:
    """Issue 25: a percent-encoded file:// URI (as ``Path.as_uri()`` makes) named another directory
    than the raw spelling, and ``file://host/path`` was silently a relative path."""
    run = tmp_path / "my runs 100%" / "run"
    ObjectStore(run.as_uri(), {"auto_mkdir": True}).put_if_absent("versions/x", b"one")
    assert (run / "versions" / "x").read_bytes() == b"one", "the encoded URI names the directory itself"
    for spelling in (f"file://{run}", run.as_uri().replace("file://", "file://localhost", 1)):
        assert ObjectStore(spelling).get("versions/x", max_bytes=8) == b"one", spelling
    for uri in ("file://otherhost/data/run", "file://relative/run"):
        with pytest.raises(UnsupportedError, match="names a host"):
            ObjectStore(uri)
