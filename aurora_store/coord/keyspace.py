"""One run's Redis, as every coordination object shares it: the clients, the run's key prefix, calls
that fail as :class:`~aurora_store.coord.errors.CoordinationError`, pipelines, and the tally of
hostile entries read back.

The :class:`~aurora_store.coord.coordinator.Coordinator` makes one; the objects that each own a part of
the run's keys (region versions, workers, the epoch, leases, results, notices, throughputs) are
handed it, so they share one connection pool and one tally without reaching into each other.
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from aurora_store.coord import wire
from aurora_store.coord.errors import CoordinationError
from aurora_store.redact import redact

log = logging.getLogger("aurora.coord")


class Keyspace:
    """The keys of one run (``{prefix}:{run_id}:...``) on one Redis."""

    def __init__(self, url: str, run_id: str, *, prefix: str = "aurora", client_name: str | None = None) -> None:
        """``client_name``: what ``CLIENT LIST`` names this process's connections (an actor: its worker id)."""
        if not run_id or any(c in run_id for c in " {}\n:"):  # ':' separates a key's parts: a run 'exp:notices'
            # would share keys with run 'exp' (its notice stream of an actor named 'results')
            raise CoordinationError(f"run id must be a non-empty name without spaces, braces or colons, got {run_id!r}")
        self.url = url
        self.run_id = run_id
        self.base = f"{prefix}:{run_id}"
        try:
            self.r = redis.Redis.from_url(
                url,
                decode_responses=True,
                encoding_errors="replace",  # bytes that are not UTF-8 (anyone may write them) reach the parsers
                socket_timeout=30,
                health_check_interval=60,  # above --check-s: a connection used on schedule never pays a PING
                client_name=client_name,
            )
        except ValueError as exc:
            raise CoordinationError(f"bad Redis URL {redact(url)!r}: {exc}") from None
        self._rb: redis.Redis | None = None
        self.skipped = wire.Tally(log, f"Redis entries of run {run_id}")
        """Entries read from Redis that failed their checks, by reason."""

    @property
    def rb(self) -> redis.Redis:
        """A client that does not decode replies (result payloads are bytes), made on first use."""
        if self._rb is None:
            self._rb = redis.Redis.from_url(
                self.url,
                decode_responses=False,
                socket_timeout=30,
                client_name=self.r.get_connection_kwargs().get("client_name"),
            )
        return self._rb

    def key(self, *parts: str) -> str:
        return ":".join((self.base, *parts))

    def call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        """``fn(*args, **kw)`` on this Redis; a Redis failure is a CoordinationError (the password never
        in its message)."""
        try:
            return fn(*args, **kw)
        except redis.RedisError as exc:
            raise CoordinationError(f"Redis at {redact(self.url)}: {type(exc).__name__}: {redact(str(exc))}") from None

    def pipeline(self, fill: Any, *, binary: bool = False) -> list[Any]:
        """Run ``fill(pipe)``'s commands in one round trip (no transaction); their replies."""

        def go() -> list[Any]:
            with (self.rb if binary else self.r).pipeline(transaction=False) as pipe:
                fill(pipe)
                return list(pipe.execute())

        return list(self.call(go))

    def close_binary(self) -> None:
        """Close the non-decoding client's connections (it reconnects if used again)."""
        if self._rb is not None:
            self._rb.close()

    def release_idle(self) -> None:
        """Close the connections no thread is using now, of both clients (they reconnect when next used)."""
        self.r.connection_pool.disconnect(inuse_connections=False)
        if self._rb is not None:
            self._rb.connection_pool.disconnect(inuse_connections=False)

    def close(self) -> None:
        self.close_binary()
        self.r.close()
