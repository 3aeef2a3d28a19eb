"""The WAN emulator: bytes and closes pass intact, latency and rate caps hold, and boto3 works through it."""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import socketserver
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from aurora_store.testing.moto import S3Server
from aurora_store.testing.processes import wait_for
from bench.emulation.wan import CHUNK, MATHIS_C, Link, Shaper, WanProxy, describe, schedule

MIB = 2**20
TIMEOUT_S = 10.0
"""Bound on any socket wait, so a proxy that loses an EOF fails the test instead of hanging it."""


class _Target(socketserver.BaseRequestHandler):
    """``E``: echo until EOF, then close. ``S`` + 8-byte n: send n bytes, then close without reading on."""

    def handle(self) -> None:
        sock: socket.socket = self.request
        mode = sock.recv(1)
        if mode == b"E":
            while chunk := sock.recv(1 << 16):
                sock.sendall(chunk)
        elif mode == b"S":
            n = int.from_bytes(_recv_exact(sock, 8), "big")
            sock.sendall(bytes(n))
        sock.shutdown(socket.SHUT_WR)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True


@pytest.fixture(autouse=True)
def _no_event_loop_errors(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """The proxy's loop logs what it cannot raise (a failed handler, a task destroyed pending): none allowed."""
    yield
    records = caplog.get_records("setup") + caplog.get_records("call")
    errors = [r.getMessage() for r in records if r.name == "asyncio" and r.levelno >= logging.WARNING]
    assert not errors


@pytest.fixture(scope="module")
def target() -> Iterator[tuple[str, int]]:
    with _Server(("127.0.0.1", 0), _Target) as server, ThreadPoolExecutor(1) as pool:
        pool.submit(server.serve_forever, 0.05)
        yield "127.0.0.1", server.server_address[1]
        server.shutdown()


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        assert chunk, f"EOF after {len(buf)} of {n} bytes"
        buf += chunk
    return bytes(buf)


def _recv_to_eof(sock: socket.socket) -> bytes:
    buf = bytearray()
    while chunk := sock.recv(1 << 16):
        buf += chunk
    return bytes(buf)


def _echo(port: int, payload: bytes) -> bytes:
    """Send ``payload`` while reading the echo, half-close, and read to the server's EOF."""
    with _connect(port) as sock, ThreadPoolExecutor(1) as pool:

        def send() -> None:
            sock.sendall(b"E" + payload)
            sock.shutdown(socket.SHUT_WR)

        sent = pool.submit(send)
        got = _recv_to_eof(sock)
        sent.result()
        return got


def _fetch(port: int, n: int) -> int:
    """Ask the target for ``n`` bytes; the target closes first."""
    with _connect(port) as sock:
        sock.sendall(b"S" + n.to_bytes(8, "big"))
        return len(_recv_to_eof(sock))


def _timed_fetches(port: int, sizes: list[int]) -> float:
    with ThreadPoolExecutor(len(sizes)) as pool:
        start = time.monotonic()
        got = list(pool.map(lambda n: _fetch(port, n), sizes))
        elapsed = time.monotonic() - start
    assert got == sizes
    return elapsed


def _loss_for(cap_bps: float, rtt_s: float, mss: int = 1460) -> float:
    """The loss rate whose Mathis cap is ``cap_bps``."""
    return (mss * 8 * MATHIS_C / (rtt_s * cap_bps)) ** 2


def test_mathis_cap_and_describe() -> None:
    link = Link(rtt_s=0.1, loss=1e-4, bandwidth_bps=1e9)
    cap = link.per_connection_bps
    assert cap == pytest.approx(1460 * 8 * math.sqrt(1.5) / (0.1 * 0.01))
    assert cap is not None and 14.0e6 < cap < 14.5e6
    assert Link(rtt_s=0.1, loss=0.0).per_connection_bps is None
    assert Link(rtt_s=0.01, loss=_loss_for(8e6, 0.01)).per_connection_bps == pytest.approx(8e6)
    desc = json.loads(json.dumps(describe(link)))
    assert desc["emulated"] is True
    assert desc["rtt_s"] == 0.1 and desc["loss"] == 1e-4 and desc["bandwidth_bps"] == 1e9 and desc["mss"] == 1460
    assert desc["per_connection_bps"] == pytest.approx(cap)


@pytest.mark.parametrize(
    "bad", [{"rtt_s": -1.0}, {"jitter_s": math.nan}, {"loss": 1.0}, {"bandwidth_bps": 0.0}, {"mss": 0}]
)
def test_link_rejects_bad_parameters(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="Link"):
        Link(**bad)  # type: ignore[arg-type]


def test_bytes_and_closes_pass_intact(target: tuple[str, int]) -> None:
    payloads = [os.urandom(n) for n in (0, 1, 1000, 65536 + 7, 3 * MIB + 5, 2 * MIB)]
    with WanProxy(*target, Link(rtt_s=0.01, jitter_s=0.004), seed=1) as proxy, ThreadPoolExecutor(6) as pool:
        echoed = list(pool.map(lambda p: _echo(proxy.port, p), payloads))
        assert [len(e) for e in echoed] == [len(p) for p in payloads]
        assert echoed == payloads  # in order despite jitter; both EOFs crossed the proxy
        wait_for(lambda: proxy.stats()["open_connections"] == 0, "the proxy to close every connection", 5.0, 0.005)


def test_stats_count_bytes_and_connections(target: tuple[str, int]) -> None:
    sizes = [0, 12345, MIB]
    with WanProxy(*target, Link(rtt_s=0.002)) as proxy:
        for n in sizes:
            assert _fetch(proxy.port, n) == n
        wait_for(lambda: proxy.stats()["open_connections"] == 0, "the proxy to close every connection", 5.0, 0.005)
        assert proxy.stats() == {
            "connections": 3,
            "open_connections": 0,
            "bytes_up": 3 * 9,
            "bytes_down": sum(sizes),
        }


def test_latency_is_applied(target: tuple[str, int]) -> None:
    with WanProxy(*target, Link(rtt_s=0.2)) as proxy, _connect(proxy.port) as sock:
        start = time.monotonic()
        sock.sendall(b"Ex")
        assert sock.recv(1) == b"x"
        first = time.monotonic() - start
        start = time.monotonic()
        sock.sendall(b"y")
        assert sock.recv(1) == b"y"
        second = time.monotonic() - start
    # lower bounds only: the emulator delays at least this much; a loaded machine can only add to it
    assert first >= 0.4  # a handshake round trip, then the request's
    assert second >= 0.2


def _burst(shapers: list[Shaper], size: int, delay: float, at: float = 0.0) -> float:
    """When the last of ``size`` bytes read at once arrives, by the proxy's own schedule (virtual time)."""
    arrive = 0.0
    for _ in range(-(-size // CHUNK)):
        _, arrive = schedule(shapers, CHUNK, at, delay, arrive)
    return arrive


def test_delay_and_rate_compose_like_a_pipe() -> None:
    """4 MiB is 64+ chunks: pipelined, the one-way delay is paid once, not once per chunk (+3.2 s).
    Checked on the schedule the proxy sleeps to, so no wall time is asserted."""
    rtt, rate, size = 0.1, 64e6, 4 * MIB
    last = _burst([Shaper(rate)], size, rtt / 2)
    assert last == pytest.approx(size * 8 / rate + rtt / 2)
    _, late = schedule([Shaper(rate)], CHUNK, 0.0, 0.0, last)
    assert late == last, "a chunk never overtakes the one before it"
    assert schedule([], 0, 7.0, 0.05, 0.0) == (7.0, 7.05), "an EOF takes the delay alone"


def test_a_real_transfer_takes_at_least_the_link_time(target: tuple[str, int]) -> None:
    rtt, rate, size = 0.1, 64e6, 4 * MIB
    with WanProxy(*target, Link(rtt_s=rtt, bandwidth_bps=rate)) as proxy:
        elapsed = _timed_fetches(proxy.port, [size])
    assert elapsed >= 0.8 * (size * 8 / rate + 2 * rtt)  # handshake, request up, first bytes down


def test_rate_caps_per_connection_and_aggregate() -> None:
    """A per-connection cap (the Mathis bound of a lossy link) lets four connections move four times
    what one does; a link's bandwidth caps all of them together (the proxy's schedule, virtual time)."""
    cap, total = 8e6, 768 * 1024
    ideal = total * 8 / cap
    assert _burst([Shaper(cap), Shaper(1e9)], total, 0.0) == pytest.approx(ideal)
    link = Shaper(1e9)
    four = [_burst([Shaper(cap), link], total // 4, 0.0) for _ in range(4)]
    assert max(four) == pytest.approx(ideal / 4, rel=0.01)
    shared = Shaper(cap)
    together = [_burst([shared], total // 4, 0.0) for _ in range(4)]
    assert max(together) == pytest.approx(ideal)


def test_caps_hold_through_the_proxy(target: tuple[str, int]) -> None:
    rtt, cap, total = 0.01, 8e6, 768 * 1024
    ideal = total * 8 / cap
    per_conn = Link(rtt_s=rtt, loss=_loss_for(cap, rtt), bandwidth_bps=1e9)
    with WanProxy(*target, per_conn) as proxy:
        one = _timed_fetches(proxy.port, [total])
        four = _timed_fetches(proxy.port, [total // 4] * 4)
    with WanProxy(*target, Link(rtt_s=rtt, loss=_loss_for(cap, rtt), bandwidth_bps=cap)) as proxy:
        shared = _timed_fetches(proxy.port, [total // 4] * 4)
    assert one >= 0.8 * ideal and four >= 0.8 * ideal / 4 and shared >= 0.8 * ideal


def test_stop_closes_open_connections(target: tuple[str, int]) -> None:
    proxy = WanProxy(*target, Link(rtt_s=0.002)).start()
    with _connect(proxy.port) as sock:
        sock.sendall(b"Ehello")
        assert _recv_exact(sock, 5) == b"hello"
        proxy.stop()
        try:  # the client is told (EOF or reset), not left hanging
            got = sock.recv(1)
        except ConnectionResetError:
            got = b""
        assert got == b""
    with pytest.raises(ConnectionRefusedError):
        _connect(proxy.port).close()
    proxy.stop()


def test_boto3_through_proxy(s3_server: S3Server) -> None:
    from botocore.config import Config

    host, port = s3_server.endpoint.removeprefix("http://").split(":")
    body = os.urandom(MIB + 3)
    with WanProxy(host, int(port), Link(rtt_s=0.005, bandwidth_bps=1e9)) as proxy:
        s3 = s3_server.client(proxy.endpoint, config=Config(max_pool_connections=4))
        bucket = s3_server.new_bucket()
        s3.put_object(Bucket=bucket, Key="v/1", Body=body)
        assert s3.get_object(Bucket=bucket, Key="v/1")["Body"].read() == body
        ranged = s3.get_object(Bucket=bucket, Key="v/1", Range="bytes=1000-70999")["Body"].read()
        assert ranged == body[1000:71000]
        s3.close()
        stats = proxy.stats()
    assert stats["connections"] >= 1
    assert stats["bytes_up"] > len(body) and stats["bytes_down"] > len(body) + 70000
