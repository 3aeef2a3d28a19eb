"""The object-store contract (aurora_store.testing.store_tests) on every backend: file://,
memory:// and the real S3 protocol (a moto server, through s3fs)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

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
