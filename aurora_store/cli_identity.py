"""``aurora actor-cert issue|show``: the operator certifies an actor's key with the fleet key.

``issue`` makes an actor key pair (or takes the actor's public key, when its private key never
leaves its host) and writes the certificate signed by the fleet's private key (``aurora keygen``
makes one). ``show`` prints a certificate, its actor key's id and serial (what a revocation list
names) and, given the fleet's public key, whether it verifies. See docs/OPERATIONS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import time
from typing import Any


def register(sub: Any) -> None:
    """Add ``aurora actor-cert`` and its actions to the ``aurora`` parser."""
    p = sub.add_parser("actor-cert", help="issue or show an actor's certificate (signed by the fleet key)")
    inner = p.add_subparsers(dest="cert_command", required=True, metavar="ACTION")
    i = inner.add_parser(
        "issue", help="write an actor's key (unless --actor-key) and its certificate, signed by the fleet key"
    )
    i.add_argument("--fleet-key", required=True, metavar="KEY", help="the fleet's Ed25519 private key (PEM file)")
    i.add_argument("--actor", required=True, metavar="NAME", help="the actor's worker id (--worker-id)")
    i.add_argument("--out", required=True, metavar="DIR", help="writes DIR/NAME.cert (and DIR/NAME.key, 0600)")
    i.add_argument(
        "--actor-key", metavar="PUB", help="certify this existing Ed25519 public key (PEM) instead of making a pair"
    )
    i.add_argument("--run", default="*", metavar="RUN_ID", help="the run it may serve (default: any, '*')")
    i.add_argument("--days", type=float, default=90.0, help="validity from now, in days (default 90)")
    i.add_argument("--serial", type=int, default=None, help="serial number (default: random)")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    i.set_defaults(handler=cmd_issue)
    s = inner.add_parser("show", help="print a certificate, its key id and serial; verify it with --fleet-pub")
    s.add_argument("cert", metavar="CERT", help="the certificate file")
    s.add_argument("--fleet-pub", metavar="PUB", help="the fleet's public key: also verify the certificate")
    s.set_defaults(handler=cmd_show)


def cmd_issue(args: argparse.Namespace) -> int:
    from aurora_store.errors import ConfigError, UnauthenticatedError
    from aurora_store.format import identity as ident
    from aurora_store.format import signing

    fleet = signing.load_signing_key(args.fleet_key)
    if args.actor_key is not None:
        actor_key = signing.load_verify_key(args.actor_key)
        private = None
    else:
        private, _ = signing.generate_keypair()
        actor_key = signing.load_signing_key(private).public_key()
    now = int(time.time())
    most = (ident.MAX_TIME_S - now) / 86400
    if not 0 < args.days <= most:  # NaN fails both; inf, and what would overflow the format, the second
        raise ConfigError(f"--days must be a number of days above 0 and at most {most:,.0f}, got {args.days}")
    serial = args.serial if args.serial is not None else secrets.randbits(52)
    try:
        cert = ident.issue(
            args.actor,
            actor_key,
            fleet,
            run=args.run,
            not_before=now - 300,  # five minutes of clock skew between the operator and the trainer
            not_after=now + int(args.days * 86400),
            serial=serial,
        )
    except UnauthenticatedError as exc:
        raise ConfigError(f"cannot issue: {exc}") from None
    os.makedirs(args.out, exist_ok=True)
    cert_path = os.path.join(args.out, f"{args.actor}.cert")
    key_path = os.path.join(args.out, f"{args.actor}.key")
    for path in [cert_path] + ([key_path] if private is not None else []):
        if os.path.lexists(path):
            raise ConfigError(f"{path} already exists; refusing to overwrite it")
    if private is not None:
        write_new(key_path, private, 0o600)
    write_new(cert_path, cert.encode() + b"\n", 0o644)
    out = {
        "cert": cert_path,
        "key": key_path if private is not None else None,
        "actor": cert.actor,
        "run": cert.run,
        "serial": cert.serial,
        "key_id": cert.key_id,
        "issuer": cert.issuer,
        "not_before": cert.not_before,
        "not_after": cert.not_after,
    }
    if args.json:
        print(json.dumps(out))
    else:
        wrote = f"{cert_path}" + (f" and {key_path} (private, keep it on the actor's host)" if private else "")
        print(f"wrote {wrote}; actor {cert.actor}, serial {cert.serial}, key id {cert.key_id}, fleet key {cert.issuer}")
    return 0


def write_new(path: str, data: bytes, mode: int) -> None:
    """Create ``path`` (never overwrite) with ``data`` and exactly ``mode``: keys and certificates."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)  # the umask may have narrowed (or, for .key, must not have widened) it


def cmd_show(args: argparse.Namespace) -> int:
    from aurora_store.format import identity as ident
    from aurora_store.format import signing

    with open(args.cert, "rb") as f:
        cert = ident.parse_cert(f.read(ident.MAX_CERT_BYTES + 1).strip())
    doc: dict[str, Any] = {**cert.body(), "key_id": cert.key_id}
    if args.fleet_pub is not None:
        ident.verify_cert(cert, signing.load_verify_key(args.fleet_pub))
        doc["verified"] = True
    print(json.dumps(doc, indent=1))
    return 0
