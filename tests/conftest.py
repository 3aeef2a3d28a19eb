"""Session services for the tests: a real moto S3 server on a free port, a real Redis, and store roots.

Every test that needs a store gets a fresh, unique root on memory://, file:// or s3://
(the last through s3fs over HTTP to the moto server), so backends share one test suite.
"""

from __future__ import annotations

import importlib.util
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import settings

from aurora_store.testing.gcs import GcsServer, GcsUnavailable, start_fake_gcs
from aurora_store.testing.moto import S3Server, start_moto
from aurora_store.testing.redis_cluster import RedisCluster
from aurora_store.testing.redis_server import RedisServer, RedisUnavailable

# Hypothesis's default 200 ms deadline per example is a timing assertion, which fails on a loaded
# machine (a CI run saw 404 ms for a pure function): no example of this suite has a deadline.
settings.register_profile("aurora", deadline=None)
settings.load_profile("aurora")

os.environ["COLUMNS"] = "200"
"""Commands print rich tables at the width COLUMNS says where it is set (as under pytest-xdist, whose
workers inherit the controller's terminal width); tests read whole column titles, so one width for all."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``vllm`` start a real vLLM engine: they run where vLLM is installed (``make test``
    runs them in .venv/vllm, vLLM's CPU build, with ``make test-vllm``) and are skipped elsewhere."""
    if importlib.util.find_spec("vllm") is not None:
        return
    skip = pytest.mark.skip(reason="vLLM is not installed here; `make test-vllm` runs these in .venv/vllm")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    server = start_moto()
    yield server
    server.process.terminate()
    server.process.wait(10)


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[GcsServer]:
    """fake-gcs-server (the GCS JSON API) on a free port, for the gs:// tests; a bucket per test."""
    try:
        server = start_fake_gcs()
    except GcsUnavailable as exc:
        pytest.skip(str(exc))
    with server:
        yield server


@dataclass
class Root:
    """A fresh run location on one backend."""

    backend: str
    uri: str
    storage_options: dict[str, Any] = field(default_factory=dict)

    def child(self, name: str) -> Root:
        return Root(self.backend, f"{self.uri}/{name}", self.storage_options)


@pytest.fixture(params=["memory", "file", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Any) -> Root:
    """A unique run URI on each backend: memory://, file://, s3:// (moto over HTTP)."""
    backend = request.param
    if backend == "memory":
        return Root(backend, f"memory://aurora-tests/{uuid.uuid4().hex}/run")
    if backend == "file":
        return Root(backend, f"file://{tmp_path}/run")
    server: S3Server = request.getfixturevalue("s3_server")
    return Root(backend, f"s3://{server.new_bucket()}/runs/exp", server.options())


@pytest.fixture
def mem_uri() -> str:
    return f"memory://aurora-tests/{uuid.uuid4().hex}/run"


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A real ``redis-server`` on a free port, that a test can kill and restart (state lost)."""
    try:
        server = RedisServer()
    except RedisUnavailable:
        pytest.skip("redis-server is not installed")
    with server.start():
        yield server


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """A real Redis Cluster of 3 masters (no replicas) on free ports, shared by the session: a test keeps
    to a run id of its own."""
    try:
        cluster = RedisCluster(masters=3)
    except RedisUnavailable:
        pytest.skip("redis-server and redis-cli are not installed")
    with cluster:
        yield cluster


@pytest.fixture(params=["server", "cluster"])
def redis_url(request: pytest.FixtureRequest) -> str:
    """A Redis URL of each kind: a fresh ``redis-server``'s, and the session's Redis Cluster's (a test on it
    uses a run id no other test uses)."""
    if request.param == "cluster":
        return str(request.getfixturevalue("redis_cluster").url)
    return str(request.getfixturevalue("redis_server").url)


@pytest.fixture
def run_id() -> str:
    """A run id of this test's own (tests on the session's cluster share its keys otherwise)."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Tiny HF checkpoints made here: ``qwen3`` (tied embeddings) and ``llama``, each with a BPE tokenizer."""
    from tests.hf_models import save_model

    root = tmp_path_factory.mktemp("hf")
    return {arch: save_model(root / arch, arch) for arch in ("qwen3", "llama")}
