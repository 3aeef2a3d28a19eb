"""A real S3 protocol server for tests and benchmarks: moto's server on a free loopback port.

Everything it stores lives in that process (objects over ~5 MiB spill to temporary files), so
:meth:`S3Server.reset` frees a benchmark phase's objects and :meth:`S3Server.stop` all of them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.request
import uuid
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

from aurora_store.testing.processes import free_port, peak_rss_mb, stop_process, wait_until_answers


@dataclass
class S3Server:
    endpoint: str
    process: subprocess.Popen[bytes]

    @property
    def host(self) -> str:
        return urlsplit(self.endpoint).hostname or "127.0.0.1"

    @property
    def port(self) -> int:
        port = urlsplit(self.endpoint).port
        assert port is not None
        return port

    def options(self, endpoint: str | None = None) -> dict[str, Any]:
        """s3fs storage options for this server, or for ``endpoint`` (a proxy in front of it)."""
        return {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": endpoint or self.endpoint, "region_name": "us-east-1"},
            "use_listings_cache": False,
        }

    def client(self, endpoint: str | None = None, **kwargs: Any) -> Any:
        """A boto3 S3 client of this server, or of ``endpoint`` (a proxy in front of it)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=endpoint or self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
            **kwargs,
        )

    def new_bucket(self) -> str:
        name = f"b-{uuid.uuid4().hex[:20]}"
        client = self.client()
        client.create_bucket(Bucket=name)
        client.close()
        return name

    def reset(self) -> None:
        """Drop every bucket and object (moto's reset API)."""
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST"), timeout=60)

    def peak_rss_mb(self) -> float | None:
        """The server process's peak resident memory (Linux only; None elsewhere or once it has exited)."""
        return peak_rss_mb(self.process.pid)

    def stop(self) -> None:
        """Terminate the server and wait for it; idempotent."""
        stop_process(self.process)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def start_moto() -> S3Server:
    port = free_port()
    exe = shutil.which("moto_server", path=os.path.dirname(sys.executable)) or shutil.which("moto_server")
    cmd = [exe] if exe else [sys.executable, "-m", "moto.server"]
    # moto serves each request on a new thread; with glibc's default of 8 malloc arenas per core, buffers its
    # threads free stay resident in their arenas, and a benchmark's big objects pile up gigabytes per server
    env = {**os.environ, "MALLOC_ARENA_MAX": "2"}
    proc = subprocess.Popen(
        [*cmd, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_until_answers(
            lambda: urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).read(), proc, "moto server"
        )
    except RuntimeError:
        proc.kill()
        proc.wait()
        raise
    return S3Server(endpoint, proc)
