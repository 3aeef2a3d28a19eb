"""The world of ``aurora bench chaos``: Redis, an S3 server per region, the WAN links and gates between
them, the signing keys, and the command line of every role."""

from __future__ import annotations

import contextlib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aurora_store.format import signing
from aurora_store.testing.moto import S3Server, start_moto
from aurora_store.testing.processes import free_port
from aurora_store.testing.redis_server import RedisServer
from bench.chaos.bucket import Bucket
from bench.chaos.config import Config
from bench.chaos.gates import TRAINER_GATE, Gates
from bench.chaos.supervisor import Proc
from bench.emulation.wan import Link
from bench.emulation.world import ProxyProcess

REGIONS = ("home", "eu", "ap")
RUN = "chaos"


def s3_options(server: S3Server, port: int | None = None) -> dict[str, Any]:
    """s3fs options (through a gate on ``port``) with short timeouts: a partition is an error to retry."""
    endpoint = f"http://127.0.0.1:{port}" if port else None
    timeouts = {"connect_timeout": 3, "read_timeout": 10, "retries": {"max_attempts": 2}}
    return {**server.options(endpoint), "config_kwargs": timeouts, "skip_instance_cache": True}


def _command(role: str, **flags: Any) -> list[str]:
    """``python -m aurora_store.cli ROLE --flag value ...`` (after the interpreter): dicts as JSON."""
    out = ["-m", "aurora_store.cli", role]
    for k, v in flags.items():
        out += [f"--{k.replace('_', '-')}", json.dumps(v) if isinstance(v, dict) else str(v)]
    return out


class World:
    """Redis, the S3 servers, the WAN links and gates, the keys, and the command line of every role."""

    def __init__(self, cfg: Config, work: Path, stack: contextlib.ExitStack) -> None:
        self.cfg, self.work = cfg, work
        out = stack.enter_context(open(work / "redis-server.out", "ab"))  # noqa: SIM115 - closed by the stack
        self.redis = RedisServer(log=out).start()
        stack.callback(self.redis.stop)
        with ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(start_moto) for _ in REGIONS]
        for f in futures:
            if f.exception() is None:
                stack.callback(f.result().stop)
        servers = dict(zip(REGIONS, (f.result() for f in futures), strict=True))
        self.buckets = {r: Bucket(r, s, s.new_bucket(), f"runs/{RUN}/") for r, s in servers.items()}
        self.gates = Gates()
        stack.callback(self.gates.close)
        link = Link(rtt_s=cfg.rtt_s, jitter_s=cfg.rtt_s / 10, bandwidth_bps=cfg.bandwidth_bps, connect_rtts=0)
        self.proxies: dict[str, ProxyProcess] = {}
        self.ports: dict[str, tuple[int, int]] = {}
        """Region -> (gate to home's bucket through its WAN link, gate to Redis)."""
        for i, r in enumerate(REGIONS[1:]):
            self.proxies[r] = ProxyProcess(servers["home"], link, seed=cfg.seed + i)
            stack.callback(self.proxies[r].stop)
            here = ("127.0.0.1", self.proxies[r].port), ("127.0.0.1", self.redis.port)
            self.ports[r] = (self.gates.add(r, here[0]), self.gates.add(r, here[1]))
        self.trainer_storage = self.gates.add(TRAINER_GATE, ("127.0.0.1", servers["home"].port))
        """The gate the trainer reaches home's bucket through: a storage outage of the trainer alone (its
        publishes and state saves fail) partitions it (`bench.chaos.faults.Faults.trainer_storage_outage`)."""
        self.metrics_port = free_port()
        """The trainer's /metrics port (scraped with garbage by `bench.chaos.faults.Faults.garbage_scrape`)."""
        private, self.public = signing.generate_keypair()
        self.sign_env = {"AURORA_SIGNING_KEY": private.decode()}
        """The trainer's environment: its signing key, and the key it rotates to once a rotation is injected."""
        self.verify_env = {"AURORA_VERIFY_KEY": self.public.decode()}
        self.admissions = work / "admissions.jsonl"

    def uri(self, region: str) -> str:
        return self.buckets[region].uri

    def options(self, region: str) -> dict[str, Any]:
        return s3_options(self.buckets[region].server)

    def home_from(self, region: str) -> dict[str, Any]:
        """Home's bucket as ``region`` reaches it: through its gate and WAN link, or directly at home."""
        return s3_options(self.buckets["home"].server, self.ports[region][0] if region in self.ports else None)

    def redis_from(self, region: str) -> str:
        return f"redis://127.0.0.1:{self.ports[region][1]}/0" if region in self.ports else self.redis.url

    def trainer(self) -> Proc:
        c = self.cfg
        argv = _command(
            "train",
            store=self.uri("home"), storage_options=s3_options(self.buckets["home"].server, self.trainer_storage),
            redis=self.redis.url, run_id=RUN, metrics_port=self.metrics_port,
            seed=c.seed, steps=c.total_steps, prompts=c.prompts, group=c.group, max_new_tokens=c.max_new_tokens,
            sft_steps=c.sft_steps, lr=5e-4, state_every=c.state_every, lease_s=c.lease_s,
            admissions_log=self.admissions,
        )  # fmt: skip
        return Proc("trainer", "trainer", "home", argv, self.sign_env, self.work / "trainer.log")

    def relay(self, region: str) -> Proc:
        argv = _command(
            "relay",
            source=self.uri("home"), dest=self.uri(region), redis=self.redis_from(region), run_id=RUN,
            dest_region=region, rescan_s=3, source_options=self.home_from(region), dest_options=self.options(region),
        )  # fmt: skip
        return Proc(f"relay-{region}", "relay", region, argv, self.verify_env, self.work / f"relay-{region}.log")

    def actor(self, role: str, region: str, name: str, slowdown: float | None) -> Proc:
        c = self.cfg
        argv = _command(
            "actor",
            store=self.uri(region), storage_options=self.options(region), region=region,
            redis=self.redis_from(region), run_id=RUN, worker_id=name, fallback=self.uri("home"),
            fallback_options=self.home_from(region), batch=4, heartbeat_s=c.heartbeat_s,
            slowdown=slowdown or c.slowdown,
        )  # fmt: skip
        return Proc(name, role, region, argv, self.verify_env, self.work / f"{role}-{name}.log")
