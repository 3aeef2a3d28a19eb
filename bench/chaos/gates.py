"""The network partitions of ``aurora bench chaos``: partitionable TCP forwarders, grouped by region.

Every connection a region's roles make to Redis, and to home's bucket (through that region's WAN link,
`bench.emulation.world.ProxyProcess`), passes a `Gates` forwarder of that region, which a partition switches to
refusing new connections or to holding them unanswered, after dropping every open one.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

TRAINER_GATE = "trainer-storage"
"""The gate group of the trainer's connections to home's bucket (`bench.chaos.world.World`): a region's
partition never takes it; `bench.chaos.faults.Faults.trainer_storage_outage` and ``rotate_key`` do."""


class Gates:
    """Partitionable TCP forwarders, grouped by region, on an event-loop thread of their own."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.mode: dict[str, str | None] = {}
        """Each region's partition: None, ``refuse`` (new connections are closed at once) or ``hang``
        (they are held unanswered until the partition heals)."""
        self.counts: Counter[str] = Counter()
        self._healed: dict[str, asyncio.Event] = {}
        self._open: dict[str, set[asyncio.Task[None]]] = {}
        self._thread = threading.Thread(target=self.loop.run_forever, name="gates", daemon=True)
        self._thread.start()

    def _on_loop(self, fn: Callable[[], Any]) -> Any:
        async def call() -> Any:
            out = fn()
            return await out if asyncio.iscoroutine(out) else out

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(10)

    def add(self, region: str, target: tuple[str, int]) -> int:
        """A gate of ``region`` to ``target``; returns the loopback port that clients connect to."""

        async def start() -> int:
            self.mode.setdefault(region, None)
            self._healed.setdefault(region, asyncio.Event())
            self._open.setdefault(region, set())
            server = await asyncio.start_server(lambda r, w: self._accept(region, target, r, w), "127.0.0.1", 0)
            return int(server.sockets[0].getsockname()[1])

        return int(self._on_loop(start))

    def _accept(self, region: str, target: tuple[str, int], r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        task = self.loop.create_task(self._serve(region, target, r, w))
        task.add_done_callback(self._open[region].discard)
        task.add_done_callback(lambda _: w.transport.abort())
        self._open[region].add(task)

    async def _serve(
        self, region: str, target: tuple[str, int], r: asyncio.StreamReader, w: asyncio.StreamWriter
    ) -> None:
        mode = self.mode[region]
        self.counts[f"{region}:{mode or 'passed'}"] += 1
        if mode == "hang":
            await self._healed[region].wait()
        if mode is not None:
            return
        try:
            tr, tw = await asyncio.open_connection(*target)
        except OSError:
            return
        try:
            await asyncio.gather(_pump(r, tw), _pump(tr, w), return_exceptions=True)
        finally:
            tw.transport.abort()

    def partition(self, region: str, mode: str | None) -> None:
        """Drop every open connection of ``region`` and refuse or hold new ones; ``mode`` None heals it."""

        def go() -> None:
            self.mode[region] = mode
            if mode is None:
                self._healed[region].set()
                return
            self._healed[region].clear()
            for task in list(self._open[region]):
                task.cancel()

        self._on_loop(go)

    def close(self) -> None:
        for region in list(self.mode):
            self.partition(region, "refuse")
        self._on_loop(lambda: asyncio.sleep(0.2))  # the cancelled connections finish closing
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
        if dst.can_write_eof():
            dst.write_eof()
