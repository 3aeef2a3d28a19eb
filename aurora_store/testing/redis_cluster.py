"""A real Redis Cluster on free loopback ports: ``masters`` masters, each with ``replicas`` replicas,
made by ``redis-cli --cluster create`` from ``redis-server --cluster-enabled yes`` processes (no
persistence), for tests and benchmarks. :meth:`RedisCluster.kill_master_of` kills the master that
serves a key and waits until the cluster has promoted its replica and answers again.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self, TypeVar

from aurora_store.testing.redis_server import RedisServer, RedisUnavailable

T = TypeVar("T")

NODE_TIMEOUT_MS = 1000
"""``cluster-node-timeout``: how long a master may not answer before its replica is promoted."""


BUS_OFFSET = 10000
"""A node's cluster bus listens on its port plus this."""


def free_node_port(tries: int = 200) -> int:
    """A port on 127.0.0.1 free now with its cluster bus port (the port plus :data:`BUS_OFFSET`): both below
    32,768, where Linux's ephemeral ports (outgoing connections, port 0) begin, so no client takes one
    between this check and the node's start."""
    for _ in range(tries):
        port = random.randrange(20000, 32768 - BUS_OFFSET)
        try:
            for p in (port, port + BUS_OFFSET):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


class ClusterServer(RedisServer):
    """One cluster node: ``redis-server`` with ``--cluster-enabled yes`` and a node file of its own."""

    def __init__(self, workdir: Path, *, log: IO[bytes] | None = None) -> None:
        super().__init__(free_node_port(), log=log)
        self.workdir = workdir

    def _args(self) -> list[str]:
        return [
            *super()._args(),
            "--cluster-enabled", "yes",
            "--cluster-config-file", str(self.workdir / f"nodes-{self.port}.conf"),
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            "--dir", str(self.workdir),
        ]  # fmt: skip


class RedisCluster:
    """A Redis Cluster of ``masters`` masters and ``masters * replicas`` replicas on 127.0.0.1."""

    def __init__(self, masters: int = 3, replicas: int = 0, *, log: IO[bytes] | None = None) -> None:
        if shutil.which("redis-cli") is None or shutil.which("redis-server") is None:
            raise RedisUnavailable("redis-server and redis-cli are needed for a cluster")
        self.masters, self.replicas, self.log = masters, replicas, log
        self._tmp = tempfile.TemporaryDirectory(prefix="aurora-cluster-")
        self.nodes = [ClusterServer(Path(self._tmp.name), log=log) for _ in range(masters * (1 + replicas))]
        self.killed: list[ClusterServer] = []

    @property
    def url(self) -> str:
        """``redis+cluster://`` with every node as a seed."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self, timeout: float = 60) -> Self:
        try:
            self._create(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _create(self, timeout: float) -> None:
        for node in self.nodes:
            node.start()
        cmd = ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes)]
        cmd += ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
        done = subprocess.run(cmd, capture_output=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout[-2000:]!r} {done.stderr[-2000:]!r}")
        self.wait_ok(timeout)

    @staticmethod
    def _ask(node: RedisServer, ask: Callable[[Any], T]) -> T | None:
        """``ask(client)`` on a client of ``node``'s own, closed after; None if the node does not answer."""
        import redis

        client = redis.Redis(port=node.port, socket_timeout=2, decode_responses=True)
        try:
            return ask(client)
        except redis.RedisError:
            return None
        finally:
            client.close()

    def state(self, node: RedisServer) -> str:
        text = self._ask(node, lambda c: c.execute_command("CLUSTER", "INFO"))
        if text is None:
            return "unreachable"
        info = text if isinstance(text, dict) else dict(line.split(":", 1) for line in str(text).split() if ":" in line)
        return str(info.get("cluster_state", "unknown"))

    def live(self) -> list[ClusterServer]:
        return [n for n in self.nodes if n not in self.killed]

    def wait_ok(self, timeout: float = 60) -> None:
        """Wait until every live node says the cluster is ``ok`` and every slot has a live master."""
        end = time.monotonic() + timeout
        while True:
            states = {n.port: self.state(n) for n in self.live()}
            if all(s == "ok" for s in states.values()) and len(self.primaries()) == self.masters and self._synced():
                return
            if time.monotonic() > end:
                raise RuntimeError(f"Redis Cluster not ok after {timeout} s: {states}")
            time.sleep(0.2)

    def _synced(self) -> bool:
        """Every live replica whose master lives has its link up (a replica never synced cannot fail over)."""
        for node in self.live():
            info = self._ask(node, lambda c: c.info("replication"))
            if info is None:
                return False
            down = info.get("role") == "slave" and info.get("master_link_status") != "up"
            if down and all(n.port != int(info.get("master_port", 0)) for n in self.killed):
                return False
        return True

    def primaries(self) -> list[ClusterServer]:
        """The live nodes that are masters now."""
        roles = {n: self._ask(n, lambda c: c.info("replication").get("role")) for n in self.live()}
        return [n for n, role in roles.items() if role == "master"]

    def master_of(self, key: str) -> ClusterServer:
        """The live master that serves ``key``'s slot now."""
        node = self.primaries()[0]
        asked = self._ask(
            node, lambda c: (c.execute_command("CLUSTER", "KEYSLOT", key), c.execute_command("CLUSTER", "NODES"))
        )
        if asked is None:
            raise RuntimeError(f"the cluster's master on port {node.port} does not answer")
        slot, nodes = int(asked[0]), str(asked[1])
        for line in nodes.splitlines():  # <id> <ip:port@bus> <flags> <master> <ping> <pong> <epoch> <link> <slots...>
            parts = line.split()
            if len(parts) < 9 or "master" not in parts[2] or "fail" in parts[2]:
                continue
            port = int(parts[1].split("@")[0].rsplit(":", 1)[1])
            for held in parts[8:]:
                lo, _, hi = held.partition("-")
                if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                    return next(n for n in self.nodes if n.port == port)
        raise RuntimeError(f"no live master serves {key!r} (slot {slot})")

    def kill_master_of(self, key: str, timeout: float = 60) -> ClusterServer:
        """SIGKILL the master serving ``key`` and wait until its replica serves the slot (the cluster ok
        again); the killed node."""
        if self.replicas < 1:
            raise RuntimeError("a master of a cluster without replicas cannot fail over")
        node = self.master_of(key)
        node.kill()
        self.killed.append(node)
        self.wait_ok(timeout)
        return node

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()
        self._tmp.cleanup()

    def __enter__(self) -> Self:
        return self if any(n.process is not None for n in self.nodes) else self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
