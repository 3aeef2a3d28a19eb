"""One run's Redis, as every coordination object shares it: the clients, the run's keys, calls that fail
as :class:`~aurora_store.coord.errors.CoordinationError`, pipelines, scripts, and the tally of hostile
entries read back.

The :class:`~aurora_store.coord.coordinator.Coordinator` makes one; the objects that each own a part of
the run's keys (region versions, workers, the epoch, leases, results, notices, throughputs) are
handed it, so they share one connection pool and one tally without reaching into each other.

**Where the keys live.** On one server every key is ``{prefix}:{run_id}:...``. On a Redis Cluster
(``redis+cluster://``, :mod:`aurora_store.coord.clients`) the keys carry hash tags, so that every script
and multi-key command touches one slot:

- the run's *control* keys (jobs and leases, results, workers' registrations, regions and their events,
  the epoch, throughputs) are ``{prefix}:{<run_id>}:...``: one slot, where the trainer's scripts run;
- each actor's own streams (its job inbox, its notices, and its copy of its region's commit stream:
  what its listener blocks on, in one XREAD) and its liveness entry (the shard's ``alive`` set, what
  it beats in the same round trip) are ``{prefix}:{<run_id>/s<k>.<salt>}:...``, on one of
  :data:`SHARDS` shard slots picked by a hash of the actor id. The salts place the shards' slots
  evenly over the 16,384 (:func:`shard_tags`), so a cluster whose masters hold equal slot ranges
  carries equal shares of the idle fleet's blocking reads and beats.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Sequence
from functools import cache
from typing import Any

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from aurora_store.coord import clients, wire
from aurora_store.coord.errors import CoordinationError
from aurora_store.redact import redact

log = logging.getLogger("aurora.coord")


SHARDS = 48
"""Shard slots of a run's actor streams on a Redis Cluster (48: an even split over 2, 3, 4, 6, 8, 12 or
16 masters of equal slot ranges)."""


@cache
def shard_tags(run_id: str, shards: int = SHARDS) -> tuple[str, ...]:
    """The hash tags of a run's actor shards: ``{run_id}/s{k}.{salt}``, the smallest salt that puts shard
    ``k`` in the ``k``-th of ``shards`` equal ranges of the cluster's slots."""
    tags = []
    for k in range(shards):
        lo, hi = k * REDIS_CLUSTER_HASH_SLOTS // shards, (k + 1) * REDIS_CLUSTER_HASH_SLOTS // shards
        salt = 0
        while not lo <= key_slot(f"{run_id}/s{k}.{salt}".encode()) < hi:
            salt += 1
        tags.append(f"{run_id}/s{k}.{salt}")
    return tuple(tags)


def shard_of(actor: str, shards: int = SHARDS) -> int:
    """The shard of an actor's streams (a stable hash of its id)."""
    return zlib.crc32(actor.encode()) % shards


class _Script:
    """A Lua script registered with the keyspace's client on its first call (a cluster client is made on
    first use: registering does not make it). In a cluster's pipeline it is sent whole (EVAL): redis-py's
    cluster pipelines do not load a script a node lacks (a replica promoted by a failover has none). On
    one server a pipeline sends it by hash, after asking the server whether it is loaded (``SCRIPT
    EXISTS``, a round trip before every execution), unless it is ``inline``: small scripts in pipelines
    run on every sweep are sent whole, as EVAL of a script Redis has compiled costs a hash of its text."""

    def __init__(self, keys: Keyspace, source: str, *, inline: bool = False) -> None:
        self.keys, self.source, self.inline = keys, source, inline
        self._script: Any = None
        self._client: Any = None
        """The client the script is registered with (a cluster's is made again after a node failure)."""

    def __call__(self, *, keys: list[str], args: list[Any] | None = None, client: Any = None) -> Any:
        if client is not None and (self.inline or self.keys.cluster):
            return client.execute_command("EVAL", self.source, len(keys), *keys, *(args or []))
        r = self.keys.r
        current = r.client if isinstance(r, clients.LazyClient) else r
        if self._client is not current:
            self._script, self._client = current.register_script(self.source), current
        return self._script(keys=keys, args=args or [], client=client)


class Keyspace:
    """The keys of one run on one Redis server (``{prefix}:{run_id}:...``) or a Redis Cluster (hash-tagged)."""

    def __init__(self, url: str, run_id: str, *, prefix: str = "aurora", client_name: str | None = None) -> None:
        """``client_name``: what ``CLIENT LIST`` names this process's connections (an actor: its worker id)."""
        if not run_id or any(c in run_id for c in " {}\n:"):  # ':' separates a key's parts: a run 'exp:notices'
            # would share keys with run 'exp' (its notice stream of an actor named 'results')
            raise CoordinationError(f"run id must be a non-empty name without spaces, braces or colons, got {run_id!r}")
        self.url = url
        self.run_id = run_id
        self.prefix = prefix
        self.cluster = clients.is_cluster(url)
        """Whether this is a Redis Cluster (keys hash-tagged, actor streams sharded)."""
        self.base = f"{prefix}:{{{run_id}}}" if self.cluster else f"{prefix}:{run_id}"
        self.client_name = client_name
        self.r: Any = clients.connect(
            url,
            decode=True,
            client_name=client_name,
            health_check_interval=60,  # above --check-s: a connection used on schedule never pays a PING
        )
        """The client that decodes replies (``redis.Redis``, or a cluster client made on first use)."""
        self._rb: Any = None
        self.skipped = wire.Tally(log, f"Redis entries of run {run_id}")
        """Entries read from Redis that failed their checks, by reason."""

    @property
    def rb(self) -> Any:
        """A client that does not decode replies (result payloads are bytes), made on first use."""
        if self._rb is None:
            self._rb = clients.connect(self.url, decode=False, client_name=self.client_name)
        return self._rb

    def key(self, *parts: str) -> str:
        """A control key of the run (on a cluster: the run's one control slot)."""
        return ":".join((self.base, *parts))

    def actor_key(self, actor: str, *parts: str) -> str:
        """A key of ``actor``'s own streams: on a cluster, on the actor's shard slot (so its listener's
        one XREAD reads one slot); on one server, the control key of the same name."""
        if not self.cluster:
            return self.key(*parts)
        return ":".join((f"{self.prefix}:{{{shard_tags(self.run_id)[shard_of(actor)]}}}", *parts))

    def shard_keys(self, *parts: str) -> list[str]:
        """On a cluster, the key of that name on every actor shard (what a commit is copied to); on one
        server, none."""
        if not self.cluster:
            return []
        return [":".join((f"{self.prefix}:{{{tag}}}", *parts)) for tag in shard_tags(self.run_id)]

    def sharded(self, *parts: str) -> list[str]:
        """Every key of that name a run has: one a shard on a cluster (:meth:`shard_keys`), the one
        control key on one server."""
        return self.shard_keys(*parts) or [self.key(*parts)]

    def script(self, source: str, *, inline: bool = False) -> _Script:
        """A Lua script on this Redis (every key it is given must be in one slot on a cluster); ``inline``:
        sent whole in pipelines (see :class:`_Script`)."""
        return _Script(self, source, inline=inline)

    def call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        """``fn(*args, **kw)`` on this Redis; a Redis failure is a CoordinationError (the password never
        in its message)."""
        try:
            return fn(*args, **kw)
        except clients.FAILURES as exc:
            dropped = [c.failed(exc) for c in (self.r, self._rb) if isinstance(c, clients.LazyClient)]
            if any(dropped):
                log.info("Redis Cluster: %s; learning its slot map again on the next command", type(exc).__name__)
            raise CoordinationError(f"Redis at {redact(self.url)}: {type(exc).__name__}: {redact(str(exc))}") from None

    def xread(
        self, streams: dict[str, str], *, count: int | None = None, block: int | None = None, binary: bool = False
    ) -> Any:
        """XREAD (blocking ``block`` ms if given) as a CoordinationError-raising :meth:`call`."""
        return self.xread_after((), streams, count=count, block=block, binary=binary)[1]

    def xread_after(
        self,
        commands: Sequence[tuple[Any, ...]],
        streams: dict[str, str],
        *,
        count: int | None = None,
        block: int | None = None,
        binary: bool = False,
    ) -> tuple[list[Any], Any]:
        """``commands`` (keys of the streams' slot only), then an XREAD, in one round trip: their replies
        (an error reply as the exception, for the caller to judge: a hostile key of another type must not
        stop the read), and the XREAD's. It goes straight to the node of the streams' slot: on a cluster redis-py would
        first ask a node which keys an XREAD names (``COMMAND GETKEYS``, a round trip per read: an idle
        actor's listener reads every beat)."""
        client = self.rb if binary else self.r
        if not self.cluster and not commands:
            return [], self.call(client.xread, streams, count=count, block=block)
        args: list[Any] = ["XREAD"]
        if count is not None:
            args += ["COUNT", count]
        if block is not None:
            args += ["BLOCK", block]
        args += ["STREAMS", *streams, *streams.values()]

        def go() -> tuple[list[Any], Any]:
            node = (
                client.get_redis_connection(client.get_node_from_key(next(iter(streams)))) if self.cluster else client
            )
            with node.pipeline(transaction=False) as pipe:
                for command in commands:
                    pipe.execute_command(*command)
                pipe.execute_command(*args)
                *first, read = pipe.execute(raise_on_error=False)
            if isinstance(read, Exception):
                raise read
            return first, read

        return self.call(go)

    def pipeline(self, fill: Any, *, binary: bool = False, errors: bool = False) -> list[Any]:
        """Run ``fill(pipe)``'s commands in one round trip (no transaction); their replies (``errors``: an
        error reply as the exception, for the caller to judge, instead of raising it)."""

        def go() -> list[Any]:
            with (self.rb if binary else self.r).pipeline(transaction=False) as pipe:
                fill(pipe)
                return list(pipe.execute(raise_on_error=not errors))

        return list(self.call(go))

    def close_binary(self) -> None:
        """Close the non-decoding client's connections (it reconnects if used again)."""
        if self._rb is not None:
            self._rb.close()

    def release_idle(self) -> None:
        """Close the connections no thread is using now, of both clients (they reconnect when next used)."""
        for client, keep_one in ((self.r, True), (self._rb, False)):  # the listener beats on r's
            if isinstance(client, clients.LazyClient):
                client.release_idle(keep_one=keep_one)
            elif client is not None:
                clients.release_idle(client.connection_pool, keep_one=keep_one)

    def close(self) -> None:
        self.close_binary()
        self.r.close()
