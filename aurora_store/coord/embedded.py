"""An embedded Redis-compatible server for single-machine runs.

When a run names no Redis, one process starts fakeredis's TCP server on a free loopback
port and every role talks to it over the Redis protocol, exactly as they would to a real
server, so there is one code path. Lua scripts need the ``lupa`` package.
"""

from __future__ import annotations

import threading

from aurora_store.errors import UnsupportedError


class EmbeddedRedis:
    """A Redis-protocol server on 127.0.0.1 (``port`` 0: any free one) in a background thread; ``url`` to connect."""

    def __init__(self, port: int = 0) -> None:
        try:
            from fakeredis import TcpFakeServer
        except ImportError as exc:
            raise UnsupportedError(f"the embedded Redis server needs fakeredis: {exc}") from None
        self._server = TcpFakeServer(("127.0.0.1", port), server_type="redis")
        self.port = int(self._server.server_address[1])  # the one the OS chose when port is 0
        self._thread = threading.Thread(target=self._server.serve_forever, name="aurora-embedded-redis", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> EmbeddedRedis:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
