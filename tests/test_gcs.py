"""gs:// for real: the object-store contract and GCS's own behaviours through gcsfs against
fake-gcs-server (the GCS JSON API on a local port)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from aurora_store.bucket.objectstore import ObjectStore
from aurora_store.testing.gcs import GcsServer
from aurora_store.testing.store_tests import StoreTests


class TestGcsStore(StoreTests):
    @pytest.fixture
    def store(self, gcs_server: GcsServer) -> Iterator[ObjectStore]:
        s = ObjectStore(f"gs://{gcs_server.new_bucket()}/runs/exp", gcs_server.options())
        yield s
        s.close()
