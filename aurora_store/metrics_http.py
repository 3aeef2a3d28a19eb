"""``/metrics`` over HTTP from one thread, whatever the number of connections.

prometheus_client's ``start_http_server`` spends a thread on every connection and waits on an idle
one forever: 1,500 connections that never send a request held 1,508 threads in a relay. Here one
thread multiplexes every connection (``selectors``): a connection has ``timeout_s`` to send its
request and as long again for each piece of the answer to leave, at most ``max_connections`` are
open (a new one closes the oldest still waiting for its request, so a scraper always gets in), and
a request over ``MAX_REQUEST_BYTES`` is refused. Each request gets one answer and the connection
closes (``Connection: close``), which Prometheus handles as any scrape.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger("aurora.metrics")

ADDR_ENV = "AURORA_METRICS_ADDR"
"""The variable that gives every role's ``--metrics-addr``."""
LOOPBACK = "127.0.0.1"
"""What ``--metrics-port`` binds unless told otherwise: metrics say what a run does, so only this host
reads them until the operator opens them (``--metrics-addr 0.0.0.0`` behind a firewall). The roles'
options name it, so this module imports nothing heavy until a server starts."""
MAX_CONNECTIONS = 64
"""Connections open at once; Prometheus holds one per target, a person with curl another."""
TIMEOUT_S = 10.0
"""How long a connection may take to send its request (and each piece of the answer to leave)."""
MAX_REQUEST_BYTES = 8192
"""A scrape's request line and headers are a few hundred bytes."""
PATHS = ("/metrics", "/")


@dataclass(slots=True)
class _Conn:
    sock: socket.socket
    deadline: float
    request: bytearray = field(default_factory=bytearray)
    answer: memoryview | None = None
    """What is left to send, once the request has been read."""


class MetricsServer:
    """Serves ``registry`` on ``addr:port`` (port 0: a free one, see :attr:`port`) from a daemon thread."""

    def __init__(
        self,
        registry: CollectorRegistry,
        addr: str,
        port: int,
        *,
        max_connections: int = MAX_CONNECTIONS,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        self.registry = registry
        self.max_connections = max_connections
        self.timeout_s = timeout_s
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        self._listener = socket.create_server((addr, port), family=family, backlog=128)
        self._listener.setblocking(False)
        self.address: str = self._listener.getsockname()[0]
        """The address it listens on."""
        self.port: int = self._listener.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._conns: dict[socket.socket, _Conn] = {}
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name=f"aurora-metrics-{self.port}", daemon=True)
        self._thread.start()

    @property
    def connections(self) -> int:
        """Connections open now (for tests and logs)."""
        return len(self._conns)

    def close(self) -> None:
        """Stop serving: the thread ends, every connection and the port are closed."""
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join(timeout=10)
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()

    # ------------------------------------------------------------ the loop

    def _loop(self) -> None:
        try:
            while not self._stopping:
                now = time.monotonic()
                soonest = min((c.deadline for c in self._conns.values()), default=now + 1.0)
                for key, events in self._selector.select(timeout=max(0.0, min(soonest - now, 1.0))):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(64)
                    else:
                        conn = self._conns.get(key.fileobj)  # type: ignore[call-overload]
                        if conn is not None:
                            self._serve(conn, events)
                now = time.monotonic()
                for conn in [c for c in self._conns.values() if c.deadline <= now]:
                    self._drop(conn)
        except Exception:  # metrics never take a role down; a scrape then fails, and says so in the log
            log.exception("metrics server stopped")
        finally:
            for conn in list(self._conns.values()):
                self._drop(conn)
            self._selector.close()

    def _accept(self) -> None:
        for _ in range(self.max_connections):  # a batch a turn: the other connections get their turn too
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of file descriptors and the like: the next turn tries again
                log.warning("metrics: cannot accept a connection: %s", exc)
                return
            if len(self._conns) >= self.max_connections:
                waiting = [c for c in self._conns.values() if c.answer is None] or list(self._conns.values())
                self._drop(min(waiting, key=lambda c: c.deadline))
            sock.setblocking(False)
            conn = _Conn(sock, time.monotonic() + self.timeout_s)
            self._conns[sock] = conn
            self._selector.register(sock, selectors.EVENT_READ)

    def _serve(self, conn: _Conn, events: int) -> None:
        """One connection's turn. Whatever its bytes make fail costs that connection, never the server."""
        try:
            if events & selectors.EVENT_WRITE:
                self._write(conn)
            else:
                self._read(conn)
        except Exception as exc:
            log.warning("metrics: a connection failed and was closed: %s: %s", type(exc).__name__, exc)
            self._drop(conn)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        conn.request += data
        end = conn.request.find(b"\r\n\r\n")
        if end < 0 and len(conn.request) <= MAX_REQUEST_BYTES:
            return
        too_large: tuple[str, dict[str, str], bytes] = ("431 Request Header Fields Too Large", {}, b"too large\n")
        if end < 0 or end > MAX_REQUEST_BYTES:
            status, headers, body = too_large
        else:
            try:
                status, headers, body = self._answer(conn.request[:end])
            except ValueError:  # a target urlsplit refuses ("http://[::1"), an Accept header that names no version
                status, headers, body = "400 Bad Request", {}, b"bad request\n"
        head = [f"HTTP/1.1 {status}", "Connection: close", f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        if conn.request.startswith(b"HEAD "):
            body = b""
        conn.answer = memoryview(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        conn.deadline = time.monotonic() + self.timeout_s
        self._selector.modify(conn.sock, selectors.EVENT_WRITE)
        self._write(conn)

    def _answer(self, request: bytes | bytearray) -> tuple[str, dict[str, str], bytes]:
        from prometheus_client.exposition import choose_encoder

        lines = request.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return "400 Bad Request", {}, b"bad request\n"
        method, target, _ = parts
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", {"Allow": "GET, HEAD"}, b"GET /metrics\n"
        url = urlsplit(target)
        if url.path not in PATHS:
            return "404 Not Found", {}, b"not found: try /metrics\n"
        fields = [line.split(":", 1) for line in lines[1:] if ":" in line]
        accept = next((v.strip() for k, v in fields if k.strip().lower() == "accept"), "")
        encoder, content_type = choose_encoder(accept)
        names = parse_qs(url.query).get("name[]")
        registry = self.registry.restricted_registry(names) if names else self.registry
        try:
            body = encoder(registry)
        except Exception as exc:  # a collector that fails: this scrape fails, the server goes on
            log.warning("metrics: a scrape failed: %s: %s", type(exc).__name__, exc)
            return "500 Internal Server Error", {}, b"metrics could not be collected\n"
        return "200 OK", {"Content-Type": content_type}, body

    def _write(self, conn: _Conn) -> None:
        assert conn.answer is not None
        try:
            sent = conn.sock.send(conn.answer)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn)
            return
        conn.answer = conn.answer[sent:]
        conn.deadline = time.monotonic() + self.timeout_s
        if not conn.answer:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_WR)
            self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        if self._conns.pop(conn.sock, None) is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(conn.sock)
        conn.sock.close()
