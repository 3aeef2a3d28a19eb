"""What actor identities cost: signing on the actor, checking on the trainer, against admission.

Results are built as an actor builds them (:class:`actor.identity.Identity` signs the payload's
SHA-256, the job, the lease token, the version and its hash, the actor and the run) and admitted
as the trainer admits them (:class:`trainer.admission.Payloads`, its identity gate
:class:`trainer.identity.ResultGate` first). Measured, in one run, per result (thread CPU):

- ``sign_us``: the actor's SHA-256 of the payload and its Ed25519 signature;
- ``check_us``: the trainer's check of a result whose certificate is cached (SHA-256 of an inline
  payload, validity and revocation, one Ed25519 verification);
- ``cert_us``: verifying a certificate the first time it is seen (parse, fleet signature), which the
  cache pays once per certificate, not per result;
- ``admission``: results per second through ``Payloads.decode_all`` (decode and check every payload)
  without a gate and with one, alternated over ``reps`` rounds, best of each, and their ratio.

No Redis and no bucket in the timing: the payloads are inline, as the bench coord's admission row.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aurora_store.config.options import option, positive
from bench.output import Output, emit


@dataclass(kw_only=True, slots=True)
class Flags(Output):
    """The command line of ``aurora bench identity``."""

    results: int = field(default=256, metadata=option(parse=positive))
    """Results per admission round."""
    group: int = field(default=8, metadata=option(parse=positive))
    """Completions per result."""
    tokens: int = field(default=256, metadata=option(parse=positive))
    """Tokens per completion."""
    vocab: int = field(default=32000, metadata=option(parse=positive))
    """Vocabulary size of the token ids."""
    reps: int = field(default=5, metadata=option(parse=positive))
    """Admission rounds, alternating without and with the gate."""
    seed: int = 0
    """Seeds the completions."""


def _per_call_us(fn: Callable[[], Any], n: int) -> float:
    t0 = time.thread_time()
    for _ in range(n):
        fn()
    return (time.thread_time() - t0) / n * 1e6


def measure(flags: Flags) -> dict[str, Any]:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from actor.identity import Identity
    from aurora_store.coord.lease import Lease
    from aurora_store.coord.results import INLINE_MAX, Result
    from aurora_store.format import identity as ident
    from aurora_store.format import results as payloads
    from aurora_store.rl.sampling import SamplingConfig
    from trainer.admission import Payloads
    from trainer.identity import ResultGate

    rng = random.Random(flags.seed)
    run, actor, vhash, digest = "bench", "actor-0", "a" * 64, "d" * 32
    fleet, key = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    now = int(time.time())
    cert = ident.issue(actor, key.public_key(), fleet, run=run, not_before=now - 60, not_after=now + 3600, serial=1)
    me = Identity(key, cert.encode(), actor=actor, run=run)
    rows = [
        (
            [rng.randrange(flags.vocab) for _ in range(flags.tokens)],
            [-rng.random() for _ in range(flags.tokens)],
            "length",
            0.0,
        )
        for _ in range(flags.group)
    ]
    data = payloads.encode(rows, failures={}, weights_digest=digest)
    if len(data) > INLINE_MAX:
        raise ValueError(f"a payload of {len(data)} bytes is not inline; use fewer --tokens or --group")
    leases = [Lease(f"t:1:{i}", 1000 + i, 1, 0, 0, {}) for i in range(flags.results)]

    def sign(lease: Lease) -> str:
        return me.sign(lease, version=0, version_hash=vhash, payload_sha256=hashlib.sha256(data).hexdigest())

    signed = [
        Result(f"1-{i}", lz.job, lz.token, actor, 0, vhash, inline=data, cert=me.cert, sig=sign(lz))
        for i, lz in enumerate(leases)
    ]
    gate = ResultGate(fleet.public_key(), run)
    assert all(gate.check(r) is None for r in signed), "every signed result passes the gate"
    it = iter(leases * 4)
    sign_us = _per_call_us(lambda: sign(next(it)), len(leases) * 4)
    results = iter(signed * 4)
    check_us = _per_call_us(lambda: gate.check(next(results)), len(signed) * 4)

    def cold() -> None:
        ident.verify_cert(ident.parse_cert(me.cert), fleet.public_key())
        ident.parse_cert(me.cert).public_key()

    cert_us = _per_call_us(cold, 200)
    sampling = SamplingConfig(group=flags.group, max_new_tokens=flags.tokens)

    def pipeline(with_gate: bool) -> Payloads:
        return Payloads(
            sampling=sampling,
            vocab_size=flags.vocab,
            stores={},
            digests=lambda v: digest,
            gate=ResultGate(fleet.public_key(), run).check if with_gate else None,
        )

    plain, gated = pipeline(False), pipeline(True)
    best = {"unsigned": float("inf"), "signed": float("inf")}
    for _ in range(flags.reps):
        for name, p in (("unsigned", plain), ("signed", gated)):
            t0 = time.thread_time()
            out = p.decode_all(signed)
            best[name] = min(best[name], time.thread_time() - t0)
            assert all(why is None for _, why in out), "every result admitted"
    plain.close()
    gated.close()
    rate = {k: flags.results / v for k, v in best.items()}
    return {
        "results": flags.results,
        "payload_bytes": len(data),
        "tokens_per_result": flags.group * flags.tokens,
        "sign_us": round(sign_us, 1),
        "check_us": round(check_us, 1),
        "cert_us": round(cert_us, 1),
        "admission": {
            "unsigned_results_per_s": round(rate["unsigned"]),
            "signed_results_per_s": round(rate["signed"]),
            "signed_over_unsigned": round(rate["signed"] / rate["unsigned"], 3),
            "check_share_of_admission": round(check_us / (1e6 / rate["signed"]), 3),
        },
    }


def run(flags: Flags) -> int:
    def render(r: dict[str, Any]) -> None:
        a = r["admission"]
        print(
            f"per result ({r['tokens_per_result']} tokens, {r['payload_bytes']} bytes): actor signs in "
            f"{r['sign_us']:.0f} us, trainer checks in {r['check_us']:.0f} us (a new certificate: "
            f"{r['cert_us']:.0f} us once); admission {a['unsigned_results_per_s']}/s unsigned, "
            f"{a['signed_results_per_s']}/s signed ({a['signed_over_unsigned']:.2f}x)"
        )
        print(json.dumps(r, indent=1))

    return emit(measure(flags), flags, render)
