"""Redis clients from a role's ``--redis`` URL: one server (``redis://``, ``rediss://``, ``unix://``, as
redis-py reads them) or a Redis Cluster (``redis+cluster://host:port[,host:port...]``, the nodes to
learn the cluster from; ``rediss+cluster://`` with TLS; a user and password as in the other URLs, the
same for every node; ``?ssl_cert_reqs=none`` and the other TLS options as redis-py reads them).

A cluster client learns the slot map when it is made, so it is made on first use
(:class:`LazyClient`): a role that starts while the cluster is unreachable fails its first command
(and retries it), not its constructor. A client whose command failed for want of a node (a master
killed, the cluster down during a failover) is dropped and made again, from the seeds, on next use: so
a role's retry learns the slot map as the cluster now serves it (redis-py's own refresh may run before
the replica is promoted and then never again). A failure of either kind is :data:`FAILURES`.
"""

from __future__ import annotations

import contextlib
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
import redis.cluster
import redis.exceptions

from aurora_store.coord.errors import CoordinationError
from aurora_store.redact import redact

CLUSTER_SCHEMES = {"redis+cluster": False, "rediss+cluster": True}
"""URL scheme -> TLS."""

FAILURES: tuple[type[Exception], ...] = (redis.RedisError, redis.exceptions.RedisClusterException)
"""What a Redis call may raise: redis-py's errors, and its cluster client's that are not RedisErrors
(no seed answered, a slot no node serves)."""

NODE_FAILURES: tuple[type[Exception], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.RedisClusterException,
    redis.exceptions.MovedError,  # an XREAD sent to the node its slot was on (keyspace.xread): the map moved
    redis.exceptions.AskError,
)
"""Failures after which a cluster client learns the slot map again (:meth:`LazyClient.failed`)."""

_TLS_OPTIONS = {"ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname"}


@dataclass(frozen=True, slots=True)
class ClusterTarget:
    """A parsed ``redis+cluster://`` URL."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    tls: bool
    options: tuple[tuple[str, str], ...]


def is_cluster(url: str) -> bool:
    return url.split("://", 1)[0].lower() in CLUSTER_SCHEMES


def parse_cluster(url: str) -> ClusterTarget:
    """The seed nodes, credentials and TLS of a cluster URL; a CoordinationError naming what is wrong."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in CLUSTER_SCHEMES:
        raise CoordinationError(f"not a Redis Cluster URL: {redact(url)!r}")
    rest, _, query = rest.partition("?")
    rest, _, path = rest.partition("/")
    userinfo, at, hosts = rest.rpartition("@")
    if not at:
        userinfo, hosts = "", rest
    user, colon, pw = userinfo.partition(":")
    if path not in ("", "0"):
        raise CoordinationError(f"a Redis Cluster has database 0 only, got /{path} in {redact(url)!r}")
    nodes = []
    for hp in hosts.split(","):
        host, _, port = hp.strip().rpartition(":")
        host = host.strip("[]")
        if not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
            raise CoordinationError(f"a Redis Cluster URL names nodes as host:port, got {hp!r} in {redact(url)!r}")
        nodes.append((host, int(port)))
    options = urllib.parse.parse_qsl(query, keep_blank_values=True)
    for key, _ in options:
        if key not in _TLS_OPTIONS:
            raise CoordinationError(
                f"unknown option {key!r} in Redis Cluster URL {redact(url)!r}"
                f" (known: {', '.join(sorted(_TLS_OPTIONS))})"
            )
    return ClusterTarget(
        tuple(nodes),
        urllib.parse.unquote(user) or None,
        urllib.parse.unquote(pw) if colon else None,
        CLUSTER_SCHEMES[scheme.lower()],
        tuple(options),
    )


def connect(url: str, *, decode: bool, client_name: str | None, **kw: Any) -> Any:
    """A client for ``url`` (``redis.Redis``, or a :class:`LazyClient` over ``RedisCluster``); nothing is
    sent yet. A malformed URL is a CoordinationError."""
    common: dict[str, Any] = {"decode_responses": decode, "socket_timeout": 30, "client_name": client_name, **kw}
    if decode:
        common["encoding_errors"] = "replace"  # bytes that are not UTF-8 (anyone may write them) reach the parsers
    if not is_cluster(url):
        try:
            return redis.Redis.from_url(url, **common)
        except ValueError as exc:
            raise CoordinationError(f"bad Redis URL {redact(url)!r}: {exc}") from None
    target = parse_cluster(url)

    def make() -> redis.cluster.RedisCluster:
        opts: dict[str, Any] = dict(target.options)
        if "ssl_check_hostname" in opts:
            opts["ssl_check_hostname"] = opts["ssl_check_hostname"].lower() in ("1", "true", "yes")
        return redis.cluster.RedisCluster(
            startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in target.nodes],
            username=target.username,
            password=target.password,
            ssl=target.tls,
            **opts,
            **common,
        )

    return LazyClient(make)


class LazyClient:
    """A cluster client made on first use (``RedisCluster`` reads the slot map from a seed when made);
    every attribute is the client's. Made again after a failed first try."""

    def __init__(self, make: Callable[[], redis.cluster.RedisCluster]) -> None:
        self._make = make
        self._client: redis.cluster.RedisCluster | None = None
        self._lock = threading.Lock()

    @property
    def client(self) -> redis.cluster.RedisCluster:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._make()
        return self._client

    def __getattr__(self, name: str) -> Any:
        """The client's attribute; before the client is made, a method that makes it when called (so a
        cluster that cannot be reached fails the call, inside the caller's error handling)."""
        if self._client is not None:
            return getattr(self._client, name)

        def deferred(*args: Any, **kw: Any) -> Any:
            return getattr(self.client, name)(*args, **kw)

        return deferred

    def failed(self, exc: Exception) -> bool:
        """A command failed with ``exc``: after a node failure, drop the client (made again, with a fresh
        slot map, on next use); whether it was dropped."""
        if not isinstance(exc, NODE_FAILURES):
            return False
        with self._lock:
            old, self._client = self._client, None
        if old is None:
            return False
        with contextlib.suppress(*FAILURES):
            old.close()
        return True

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def release_idle(self, *, keep_one: bool) -> None:
        """:func:`release_idle` on every node's pool."""
        if self._client is not None:
            for node in self._client.get_nodes():
                if node.redis_connection is not None:
                    release_idle(node.redis_connection.connection_pool, keep_one=keep_one)


def release_idle(pool: Any, *, keep_one: bool = False) -> None:
    """Close the connections of ``pool`` that no thread is using now; with ``keep_one``, all but the one
    to be used next when none is in use (an idle actor's listener beats on a cluster node it does not
    block on, the control slot's: a connection closed between two beats would cost a new one, connect
    and name, at every beat). They reconnect when next used."""
    lock = getattr(pool, "_lock", None)
    avail = getattr(pool, "_available_connections", None)
    in_use = getattr(pool, "_in_use_connections", None)
    if not keep_one or lock is None or not isinstance(avail, list) or in_use is None:
        pool.disconnect(inuse_connections=False)
        return
    with lock:
        for conn in avail if in_use else avail[:-1]:  # the pool hands out its last one first
            conn.disconnect()
