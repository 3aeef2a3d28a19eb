"""The four-regions world of ``aurora bench e2e --world four-regions``: home and four regions on one machine.

Each site of `bench.emulation.links` gets a bucket server of its scheme (a moto S3 server, or fake-gcs-server for
the ``gs://`` region across clouds), and each link of the table a `bench.emulation.world.ProxyProcess` in front of
its source's server: every byte a relay (or a relay-less actor) reads from another site crosses one.
Redis is the embedded server. Emulation, not a WAN: the JSON says so.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import aurora_store.testing.gcs as gcs  # first: sets the gcsfs variable before anything imports gcsfs
from aurora_store.testing.moto import S3Server, start_moto
from bench.emulation import links
from bench.emulation.wan import Link
from bench.emulation.world import ProxyProcess, bench_redis, cpu_seconds, redis_pids, s3_options

LOSS = 1e-4
"""Each link's packet loss: only sets the Mathis per-connection cap (nothing is dropped)."""
JITTER_FRAC = 0.025


@dataclass(slots=True)
class Bucketed:
    """One site's bucket server and the bucket of the current mode."""

    site: links.Site
    s3: S3Server | None = None
    gcs: gcs.GcsServer | None = None
    bucket: str = ""

    def new_bucket(self) -> str:
        if self.s3 is not None:
            self.s3.reset()
            return self.s3.new_bucket()
        assert self.gcs is not None
        return self.gcs.new_bucket()  # fake-gcs-server has no reset: a bucket per mode

    def uri(self, mode: str) -> str:
        return f"{self.site.scheme}://{self.bucket}/runs/{mode}"

    def options(self, connections: int = 64, endpoint: str | None = None) -> dict[str, Any]:
        """Storage options for this site's bucket (through ``endpoint``, a link's proxy, when given)."""
        if self.s3 is not None:
            return s3_options(self.s3, connections, endpoint)
        assert self.gcs is not None and endpoint is None, "no link is fed from the gs:// region"
        return {**self.gcs.options(), "skip_instance_cache": True}

    def pid(self) -> int:
        server = self.s3 or self.gcs
        assert server is not None
        return server.process.pid

    def peak_rss_mb(self) -> float | None:
        from aurora_store.testing.processes import peak_rss_mb

        return peak_rss_mb(self.pid())


def link_of(hop: links.Hop) -> Link:
    return Link(
        rtt_s=hop.rtt_s, jitter_s=hop.rtt_s * JITTER_FRAC, bandwidth_bps=hop.bandwidth_bps, loss=LOSS, connect_rtts=0.0
    )


class Regions:
    """Every site's server, a proxy per link of the table, and Redis; closed by ``stack``."""

    def __init__(self, stack: contextlib.ExitStack, seed: int) -> None:
        sites = list(links.SITES)
        with ThreadPoolExecutor(len(sites)) as pool:
            futures: list[Future[S3Server | gcs.GcsServer]] = [
                pool.submit(gcs.start_fake_gcs if s.scheme == "gs" else start_moto) for s in sites
            ]
        for f in futures:  # every server that started is stopped, even if another failed to
            if f.exception() is None:
                stack.callback(f.result().stop)
        self.sites: dict[str, Bucketed] = {}
        for s, f in zip(sites, futures, strict=True):
            server = f.result()
            self.sites[s.name] = (
                Bucketed(s, gcs=server) if isinstance(server, gcs.GcsServer) else Bucketed(s, s3=server)
            )
        self.proxies: dict[str, ProxyProcess] = {}
        for i, hop in enumerate(links.HOPS):
            source = self.sites[hop.source].s3
            assert source is not None, f"link {hop.name}: only S3 sites feed links"
            proxy = ProxyProcess(source, link_of(hop), seed=seed + i)
            stack.callback(proxy.stop)
            self.proxies[hop.name] = proxy
        self.redis = bench_redis(stack)

    def reset(self) -> None:
        """A fresh bucket at every site for the next mode."""
        for b in self.sites.values():
            b.bucket = b.new_bucket()

    def via(self, hop: links.Hop, mode: str, connections: int) -> tuple[str, dict[str, Any]]:
        """``hop.source``'s run as a reader at ``hop.dest`` sees it: through the link's proxy."""
        src = self.sites[hop.source]
        return src.uri(mode), src.options(2 * connections, self.proxies[hop.name].endpoint)

    def snapshot(self) -> dict[str, Any]:
        """Bytes each link has carried so far, and CPU seconds of this process and every server and proxy."""
        pids = [b.pid() for b in self.sites.values()] + [p.pid for p in self.proxies.values()]
        pids += redis_pids(self.redis)
        return {"links": {n: p.stats() for n, p in self.proxies.items()}, "cpu_s": cpu_seconds(pids)}
