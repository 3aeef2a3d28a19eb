"""A userspace WAN emulator: a loopback TCP proxy that gives one link latency, jitter and bandwidth caps.

Emulation, not netem: no packet is dropped or retransmitted. Loss only sets each connection's
steady-state throughput cap by the Mathis formula; slow start and loss-induced stalls are not modelled.
Each direction is a pipe: a chunk leaves when the link's token buckets allow and arrives rtt/2 later.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import random
import threading
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self

MATHIS_C = math.sqrt(1.5)
"""The constant in Mathis et al.'s throughput formula for periodic loss with delayed ACKs off (≈ 1.22)."""
CHUNK = 64 * 1024
"""Largest read from a socket: the unit the link books and delivers."""
LEAD_S = 0.02
"""How far (seconds of link time) a reader may book ahead of the clock: the buckets' depth, so timer slack
never leaves the link idle. Delivery times stay exact; this only lets bytes wait in the proxy."""

Direction = Literal["up", "down"]
"""``up``: client to target; ``down``: target to client."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Link:
    """One emulated WAN link; a proxy applies it to both directions independently."""

    rtt_s: float = 0.0
    """Round-trip time in seconds; each direction adds rtt/2 of one-way delay."""
    jitter_s: float = 0.0
    """Uniform ± jitter on each chunk's one-way delay, seconds; bytes within a connection are never reordered."""
    bandwidth_bps: float | None = None
    """Aggregate capacity in bits/s per direction, shared by all connections; None for unlimited."""
    loss: float = 0.0
    """Packet loss probability p; it only sets the per-connection Mathis cap (nothing is dropped)."""
    mss: int = 1460
    """Maximum segment size in bytes, for the Mathis cap."""
    window_bytes: int = 16 * 2**20
    """Unacknowledged bytes allowed per connection and direction (a TCP window): caps one connection at
    window/RTT and bounds the proxy's memory."""
    connect_rtts: float = 1.0
    """Round trips a new connection pays before its first byte leaves: 1 for TCP's handshake (TLS 1.3 adds 1)."""

    def __post_init__(self) -> None:
        for name in ("rtt_s", "jitter_s", "connect_rtts"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"Link.{name} must be finite and >= 0, got {value!r}")
        if self.bandwidth_bps is not None and not (math.isfinite(self.bandwidth_bps) and self.bandwidth_bps > 0):
            raise ValueError(f"Link.bandwidth_bps must be positive or None, got {self.bandwidth_bps!r}")
        if not 0 <= self.loss < 1:
            raise ValueError(f"Link.loss must be in [0, 1), got {self.loss!r}")
        if self.mss < 1 or self.window_bytes < 1:
            raise ValueError(f"Link.mss and Link.window_bytes must be >= 1, got {self.mss}, {self.window_bytes}")

    @property
    def per_connection_bps(self) -> float | None:
        """Mathis steady-state TCP throughput MSS·8·C/(RTT·√p); None (no cap) when loss or RTT is 0."""
        if self.loss == 0 or self.rtt_s == 0:
            return None
        return self.mss * 8 * MATHIS_C / (self.rtt_s * math.sqrt(self.loss))


def describe(link: Link) -> dict[str, Any]:
    """The link's parameters and derived caps, marked as emulated, for benchmark JSON."""
    window_cap = link.window_bytes * 8 / link.rtt_s if link.rtt_s else None
    return {
        **dataclasses.asdict(link),
        "per_connection_bps": link.per_connection_bps,
        "window_cap_bps": window_cap,
        "emulated": True,
        "model": "loopback TCP proxy: one-way delay rtt/2±jitter, per-direction token buckets, "
        "Mathis per-connection cap; no real loss, no slow start",
    }


class Shaper:
    """A token bucket in virtual-time form: bytes leave back to back at the rate, never before they arrive."""

    __slots__ = ("_free_at", "_rate")

    def __init__(self, bps: float) -> None:
        self._rate = bps / 8
        self._free_at = 0.0

    def book(self, nbytes: int, now: float) -> float:
        """Put ``nbytes`` on the wire after those already booked; return when their last byte has left."""
        self._free_at = max(self._free_at, now) + nbytes / self._rate
        return self._free_at


def schedule(shapers: list[Shaper], nbytes: int, now: float, delay: float, last: float) -> tuple[float, float]:
    """Where a chunk of ``nbytes`` read at ``now`` goes, in the link's virtual time: when its last byte
    leaves (booked on every shaper it crosses: its connection's cap, the link's bandwidth) and when it
    arrives, ``delay`` later but never before the chunk before it (``last``). Chunks are pipelined: the
    one-way delay is paid once per burst, not once per chunk. (The proxy sleeps until these times; the
    tests check the schedule itself, so a loaded machine cannot fail them.)"""
    left = max([s.book(nbytes, now) for s in shapers], default=now) if nbytes else now
    return left, max(last, left + max(delay, 0.0))


class _Window:
    """Bytes sent but not yet acknowledged on one direction of one connection."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._used = 0
        self._room = asyncio.Event()
        self._room.set()

    async def wait_room(self) -> None:
        while self._used >= self._size:
            self._room.clear()
            await self._room.wait()

    def take(self, nbytes: int) -> None:
        self._used += nbytes

    def release(self, nbytes: int) -> None:
        self._used -= nbytes
        self._room.set()


class WanProxy:
    """Forwards each TCP connection to one target through an emulated `Link`, on its own event-loop thread."""

    def __init__(
        self,
        target_host: str,
        target_port: int,
        link: Link,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        *,
        seed: int | None = None,
    ) -> None:
        self.link = link
        self._target = (target_host, target_port)
        self._listen = (listen_host, listen_port)
        self._rng = random.Random(seed)
        bw = link.bandwidth_bps
        self._link_shapers: dict[Direction, Shaper | None] = {d: Shaper(bw) if bw else None for d in ("up", "down")}
        self._counts = {"connections": 0, "open_connections": 0, "bytes_up": 0, "bytes_down": 0}
        self._counts_lock = threading.Lock()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._port: int | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("WanProxy is not started")
        return self._port

    @property
    def endpoint(self) -> str:
        host = self._listen[0]
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def stats(self) -> dict[str, int]:
        """Connections accepted and open, and bytes delivered up (client→target) and down (target→client)."""
        with self._counts_lock:
            return dict(self._counts)

    def start(self) -> Self:
        """Listen on a background thread; return once connections are accepted."""
        if self._thread is not None:
            raise RuntimeError("WanProxy already started")
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), name="wan-proxy", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error
        return self

    def stop(self) -> None:
        """Close the listener and every connection, and join the thread; idempotent."""
        if self._thread is None or not self._thread.is_alive():
            return
        if self._loop is not None and self._stopping is not None:
            with contextlib.suppress(RuntimeError):  # the loop finished on its own
                self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join()

    def __enter__(self) -> Self:
        return self if self._thread is not None else self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _count(self, key: str, delta: int) -> None:
        with self._counts_lock:
            self._counts[key] += delta

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        try:
            server = await asyncio.start_server(self._accept, *self._listen)
        except Exception as e:  # raised again by start(), in the caller's thread
            self._error = e
            self._ready.set()
            return
        self._port = int(server.sockets[0].getsockname()[1])
        self._ready.set()
        await self._stopping.wait()
        server.close()
        await asyncio.sleep(0)  # connections accepted just before the close get their handler
        while self._handlers:
            for task in self._handlers:
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            await asyncio.sleep(0)  # aborted transports run connection_lost and close their sockets

    def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        """Register a handler task for a new connection at once, so that stop() always finds and cancels it."""
        task = asyncio.get_running_loop().create_task(self._serve(client_r, client_w))
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)
        task.add_done_callback(lambda _: client_w.transport.abort())  # no-op once closed; cancelled early: close

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self._count("connections", 1)
        self._count("open_connections", 1)
        try:
            await self._forward(client_r, client_w)
        finally:
            self._count("open_connections", -1)

    async def _forward(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        """Pay the handshake, connect to the target, pump both directions; close both sockets at the end."""
        writers = [client_w]
        clean = False
        try:
            await asyncio.sleep(self.link.connect_rtts * self.link.rtt_s)
            target_r, target_w = await asyncio.open_connection(*self._target)
            writers.append(target_w)
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._pump(client_r, target_w, "up"))
                tg.create_task(self._pump(target_r, client_w, "down"))
            clean = True
        except* OSError:
            pass  # a refused or reset connection ends both directions, as it would end a real one
        finally:
            await _close(writers, clean)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, direction: Direction) -> None:
        """Carry one direction: book each chunk on the link, deliver it one-way delay later, in order."""
        loop = asyncio.get_running_loop()
        cap = self.link.per_connection_bps
        shapers = [s for s in (Shaper(cap) if cap else None, self._link_shapers[direction]) if s is not None]
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        window = _Window(self.link.window_bytes)
        half_rtt, jitter = self.link.rtt_s / 2, self.link.jitter_s
        arrive = 0.0
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._deliver(queue, dst, window, direction))
            while True:
                await window.wait_room()
                data = await src.read(CHUNK)
                now = loop.time()
                delay = half_rtt + self._rng.uniform(-jitter, jitter) if jitter else half_rtt
                left, arrive = schedule(shapers, len(data), now, delay, arrive)
                window.take(len(data))
                queue.put_nowait((arrive, data))
                if not data:
                    return
                if left - now > LEAD_S:
                    await asyncio.sleep(left - now - LEAD_S)

    async def _deliver(
        self,
        queue: asyncio.Queue[tuple[float, bytes]],
        dst: asyncio.StreamWriter,
        window: _Window,
        direction: Direction,
    ) -> None:
        """Write each chunk at its arrival time; an empty chunk is the sender's EOF."""
        loop = asyncio.get_running_loop()
        ack_delay = self.link.rtt_s / 2
        key = f"bytes_{direction}"
        while True:
            arrive, data = await queue.get()
            wait = arrive - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                if dst.can_write_eof():
                    dst.write_eof()
                return
            self._count(key, len(data))  # first: the peer can never hold bytes not yet counted
            dst.write(data)
            await dst.drain()
            if ack_delay:
                loop.call_later(ack_delay, window.release, len(data))  # the ACK's trip back
            else:
                window.release(len(data))


async def _close(writers: list[asyncio.StreamWriter], clean: bool) -> None:
    """Close sockets gracefully after a clean finish, else abort them; wait until they are closed."""
    for w in writers:
        if clean:
            w.close()
        else:
            w.transport.abort()
    try:
        for w in writers:
            with contextlib.suppress(OSError):
                await w.wait_closed()
    except asyncio.CancelledError:
        for w in writers:
            w.transport.abort()
        raise
