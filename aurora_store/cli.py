"""The ``aurora`` command: list, replay and audit runs, make signing keys; roles and benchmarks
add their own subcommands (``aurora train``, ``relay``, ``actor``, ``demo``, ``bench ...``)
through the ``aurora.commands`` entry point, so this module never names them.

Parses arguments before importing anything heavy, and never imports torch, so ``--help``
answers at once and relays (no torch) can run it. AuroraRL errors print one line and exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from aurora_store.cli_config import register as register_config
from aurora_store.cli_identity import register as register_identity
from aurora_store.cli_identity import write_new
from aurora_store.cli_parser import Parser
from aurora_store.config.options import json_object, positive

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

    from aurora_store.bucket.run import Run

PROG = "aurora"


class CommandError(Exception):
    """A usage problem found after parsing (exit 1, one line, like a store error)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``aurora`` console script; returns the exit status."""
    from aurora_store import config as configfile
    from aurora_store.errors import AuroraError

    argv = list(sys.argv[1:] if argv is None else argv)
    configfile.requested(argv)  # a role's defaults come from its config file: read before its parser is built
    try:
        parser = build_parser()
    except AuroraError as exc:
        return _fail(exc)
    args, rest = parser.parse_known_args(argv)
    if rest and not getattr(args, "parses_rest", False):  # only a command that parses its own arguments takes them
        parser.subcommand(args.command).unknown(rest)
    args.rest = rest
    try:
        configfile.confirm(args)
        return int(args.handler(args))
    except (AuroraError, CommandError, OSError) as exc:
        return _fail(exc)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


def _fail(exc: BaseException) -> int:
    from aurora_store.redact import redact

    print(f"{PROG}: error: {redact(str(exc))}", file=sys.stderr)
    return 1


def build_parser() -> Parser:
    parser = Parser(
        prog=PROG, description="AuroraRL: RL post-training over object storage. Every role is a subcommand."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("ls", help="list committed versions (manifest stats only; fast)")
    _run_args(p)
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.set_defaults(handler=cmd_ls)

    p = sub.add_parser("replay", help="write a version bit-exact as a HF model directory (transformers, vLLM)")
    _run_args(p)
    p.add_argument("--version", type=int, default=None, help="version to rebuild (default: the latest)")
    p.add_argument("--out", required=True, help="directory to write (must not exist, or be empty)")
    p.add_argument("--shard-bytes", type=positive, default=None, help="target size of a safetensors shard")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an --out an earlier replay wrote: only files under replay's own names, and attachments "
        "whose bytes the run vouches for (never other files, links or directories)",
    )
    p.add_argument(
        "--merge",
        action="store_true",
        help="of a LoRA run: write the base with the adapter merged into it, one HF directory (default: a PEFT "
        "adapter directory, its base in base/)",
    )
    p.add_argument(
        "--dequantize",
        action="store_true",
        help="of a run of quantized weights: write BF16 weights (words x scales, rounded to nearest even; "
        "default: the quantized checkpoint as published, its config.json naming the quantization)",
    )
    p.set_defaults(handler=cmd_replay)

    p = sub.add_parser("audit", help="verify every committed version: objects, hashes, chain, signatures, weights")
    _run_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--ledger", metavar="FILE", help="also write a Parquet ledger, one row per version")
    p.set_defaults(handler=cmd_audit)

    # roles and benchmarks; every role declares how it reads a config file when its module loads, so all
    # are loaded before any registers (a role's defaults come from the whole file, checked)
    commands = sorted(entry_points(group="aurora.commands"), key=lambda e: e.name)
    for register in [*(ep.load() for ep in commands), register_config, register_identity]:
        register(sub)
    if "bench" not in {ep.name for ep in commands}:
        p = sub.add_parser("bench", add_help=False, help="benchmarks (not installed here: see `aurora bench`)")
        p.set_defaults(handler=cmd_no_bench, parses_rest=True)

    p = sub.add_parser(
        "gc",
        help="delete versions and trainer states no one needs (a dry run unless --apply)",
        description="Retire the versions no live actor, relay or kept version's chain needs, and old trainer "
        "states. Version 0, the last --keep-last versions, the last --keep-fulls full versions and every version "
        "at or after the oldest one a live actor holds or a region is at (from Redis) are kept, with the chains "
        "they need. Run it on each region's bucket.",
    )
    _run_args(p)
    p.add_argument("--keep-last", type=positive, default=10, metavar="K", help="keep the newest K versions")
    p.add_argument("--keep-fulls", type=positive, default=2, metavar="F", help="keep the newest F full versions")
    p.add_argument(
        "--keep-states", type=positive, default=2, metavar="S", help="keep the newest S trainer states (at least 1)"
    )
    p.add_argument("--apply", action="store_true", help="delete (without it, only list what would go)")
    p.add_argument(
        "--redis",
        default=os.environ.get("AURORA_REDIS") or None,
        metavar="URL",
        help="the run's Redis (default $AURORA_REDIS): what live actors hold and regions are at; --apply needs it",
    )
    p.add_argument("--run-id", default=None, help="the run's name in Redis (default: the last part of URI)")
    p.add_argument(
        "--signing-key",
        default=os.environ.get("AURORA_SIGNING_KEY") or None,
        metavar="KEY",
        help="the run's Ed25519 private key (a PEM file; default $AURORA_SIGNING_KEY): in a signed run, --apply "
        "signs its retention record with it, as the run's versions are (readers ignore an unsigned one)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    from aurora_store.cli_gc import add_results_arguments

    add_results_arguments(p)
    p.set_defaults(handler=cmd_gc)

    p = sub.add_parser("keygen", help="make an Ed25519 signing key pair")
    p.add_argument("--out", required=True, metavar="PREFIX", help="writes PREFIX.key (private, 0600) and PREFIX.pub")
    p.set_defaults(handler=cmd_keygen)
    return parser


def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("uri", metavar="URI", help="run URI (any fsspec URI: s3://, gs://, file://, memory://)")
    p.add_argument(
        "--storage-options",
        type=json_object,
        default=None,
        metavar="JSON",
        help="JSON object of fsspec storage options",
    )
    p.add_argument(
        "--verify-key",
        metavar="KEY",
        default=os.environ.get("AURORA_VERIFY_KEY") or None,
        help="the run's Ed25519 public key (a PEM file; default $AURORA_VERIFY_KEY, a path or PEM text): "
        "refuse versions it did not sign (a signed run cannot be read without it)",
    )


def _open(args: argparse.Namespace, *, signing_key: str | None = None) -> Run:
    from aurora_store.bucket.run import open_run
    from aurora_store.errors import StoreError
    from aurora_store.format import signing

    private = None
    if signing_key:
        try:
            private = signing.load_signing_key(signing_key)
        except (OSError, ValueError) as exc:
            msg = exc if isinstance(exc, StoreError) else f"not an Ed25519 private key ({type(exc).__name__}: {exc})"
            shown = "(PEM text)" if signing_key.lstrip().startswith("-----BEGIN") else signing_key
            raise CommandError(f"--signing-key {shown}: {msg}") from None
    key = None
    if args.verify_key:
        try:
            key = signing.load_verify_key(args.verify_key)
        except (OSError, ValueError) as exc:
            msg = exc if isinstance(exc, StoreError) else f"not an Ed25519 public key ({type(exc).__name__}: {exc})"
            shown = "(PEM text)" if args.verify_key.lstrip().startswith("-----BEGIN") else args.verify_key
            raise CommandError(f"--verify-key {shown}: {msg}") from None
    return open_run(args.uri, storage_options=args.storage_options, verify_key=key, signing_key=private)


def _stderr() -> Console:
    from rich.console import Console

    return Console(stderr=True)


def _stdout() -> Console:
    """Tables on stdout; wide enough not to fold columns when piped to a file or a pager."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() or "COLUMNS" in os.environ else Console(width=160)


@contextmanager
def _progress(console: Console) -> Iterator[Progress]:
    """A progress display on stderr; it draws only on a terminal and vanishes when done."""
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    ) as progress:
        yield progress


# ---------------------------------------------------------------- ls


def cmd_no_bench(args: argparse.Namespace) -> int:
    """``aurora bench`` where the benchmarks are not installed: say how to get them."""
    raise CommandError(
        "the benchmarks are not installed here: they are a distribution of their own, beside the product in "
        "its repository (bench/pyproject.toml). From a clone: pip install -e ./bench (make does it)"
    )


def cmd_ls(args: argparse.Namespace) -> int:
    with _open(args) as run:
        versions = run.versions()
        if not versions:
            run.store.require_run()  # a missing bucket or prefix, or an endpoint that does not answer, is an error
        manifests = list(run.store.map(run.manifest, versions))
    rows = []
    for m in manifests:
        s = m.stats
        changed = s.changed if s.counted else None  # a full version published without its parent's bits
        rows.append(
            {
                "version": m.version,
                "kind": m.kind,
                "bytes": s.bytes,
                "changed": changed,
                "counted": s.counted,
                "elements": s.elements,
                "density": None if changed is None else changed / s.elements if s.elements else 0.0,
                "bytes_per_changed": s.bytes / changed if changed else None,
                "ratio": s.full_bytes / s.bytes if s.bytes else None,
                "step": m.step,
                "created": m.created,
                "signed": m.signature is not None,
                "rolls_back_to": None
                if m.rolls_back_to is None
                else {"version": m.rolls_back_to.version, "abandons": list(m.rolls_back_to.abandons)},
            }
        )
    if args.json:
        print(json.dumps(rows))
        return 0
    from rich.table import Table

    table = Table(title=f"{args.uri} ({len(rows)} versions)")
    notes = any(r["rolls_back_to"] for r in rows)
    for col in ("version", "kind", "bytes", "changed", "density", "B/changed", "ratio", "step", "created"):
        table.add_column(col, justify="left" if col in ("kind", "created") else "right")
    if notes:
        table.add_column("trained from", justify="left")
    for r in rows:
        table.add_row(
            str(r["version"]),
            r["kind"],
            _size(r["bytes"]),
            NOT_COUNTED if r["changed"] is None else f"{r['changed']:,}",
            _num(r["density"], ".4%"),
            _num(r["bytes_per_changed"], ".3f"),
            _num(r["ratio"], ".1f", "x"),
            _num(r["step"], "d"),
            r["created"],
            *([_rollback(r["rolls_back_to"])] if notes else []),
        )
    _stdout().print(table)
    return 0


NOT_COUNTED = "not counted"
"""What ``ls`` and ``audit`` show as a version's changed elements when its manifest says they were not
counted (a full version published without its parent's bits)."""


def _rollback(back: dict[str, Any] | None) -> str:
    """How ``aurora ls`` shows a version trained from an older state than its parent's."""
    if back is None:
        return ""
    gone = back["abandons"]
    span = str(gone[0]) if len(gone) == 1 else f"{gone[0]}..{gone[-1]}"
    return f"rolls back to {back['version']} (abandons {span})"


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _num(v: float | int | None, fmt: str, suffix: str = "") -> str:
    return "-" if v is None else f"{v:{fmt}}{suffix}"


# ---------------------------------------------------------------- replay


def cmd_replay(args: argparse.Namespace) -> int:
    from aurora_store.bucket.replay import DEFAULT_SHARD_BYTES, replay

    console = _stderr()
    with _open(args) as run, _progress(console) as progress:
        tasks: dict[str, Any] = {}

        def step(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = progress.add_task(
                    {"materialize": "materialize", "shards": "write shards", "files": "copy files"}.get(stage, stage),
                    total=total,
                )
            progress.update(tasks[stage], completed=done, total=total)

        artefact = _artefact_of(run, args.version)
        result = replay(
            run,
            args.version,
            args.out,
            shard_bytes=args.shard_bytes or DEFAULT_SHARD_BYTES,
            force=args.force,
            progress=step,
            adapter=_adapter_of(artefact),
            merge=args.merge,
            scheme=None if artefact is None else artefact.scheme,
            dequantize=args.dequantize,
        )
    for name in result.skipped:
        print(f"{PROG}: note: attached file {name!r} not copied: it would shadow the replayed weights", file=sys.stderr)
    print(
        f"version {result.version} ({result.version_hash[:16]}) -> {result.out}: {len(result.shards)} shard(s), "
        f"{result.total_size:,} bytes, {len(result.files)} attached file(s)"
    )
    return 0


def _artefact_of(run: Any, version: int | None) -> Any:
    """What the run's versions hold as its run spec (at ``version``, verified) says; None for a run
    without a run spec (started by an earlier trainer: BF16 weights)."""
    from aurora_store.rl.runspec import NAME, RunSpec

    at = run.latest() if version is None else version
    if at is None:
        return None
    files = run.reader.files(run.manifest(at), names={NAME}.__contains__)
    if NAME not in files:
        return None
    return RunSpec.from_bytes(files[NAME], f"{run.uri}/files/{NAME}").artefact


def _adapter_of(artefact: Any) -> Any:
    """A LoRA run's adapter and base as its artefact names them; None for any other run."""
    from aurora_store.bucket.replay import Adapter

    lora = None if artefact is None else artefact.lora
    if lora is None:
        return None
    return Adapter(lora.rank, lora.alpha, lora.targets, lora.base_files, lora.base_digest)


# ---------------------------------------------------------------- audit


def cmd_audit(args: argparse.Namespace) -> int:
    from aurora_store.bucket.audit import audit, write_ledger

    console = _stderr()
    with _open(args) as run, _progress(console) as progress:
        task = progress.add_task("audit", total=None)

        def on_version(row: Any, total: int) -> None:
            progress.update(task, advance=1, total=total, description=f"audit v{row.version}")

        result = audit(run, on_version=on_version)
    if args.json:
        print(json.dumps(result.to_dict()), flush=True)
    else:
        _audit_table(result)
    if args.ledger:
        write_ledger(result, args.ledger)
    for bad in result.bad_records:
        print(f"{PROG}: error: retention record ignored: {bad}", file=sys.stderr)
    if result.first_error is None and result.bad_records:
        return 1
    if result.first_error is not None:
        e = result.first_error
        print(f"{PROG}: error: audit failed at version {e.version}: {e.type}: {e.error}", file=sys.stderr)
        return 1
    return 0


def _audit_table(result: Any) -> None:
    from rich.table import Table

    retired = f" ({result.retired} versions retired by gc)" if result.retired else ""
    table = Table(title=f"audit {result.uri}: {'OK' if result.ok else 'FAILED'}{retired}")
    for col in ("version", "kind", "segments", "bytes", "changed", "status"):
        table.add_column(col, justify="left" if col in ("kind", "status") else "right")
    for r in result.versions:
        status = {"ok": "[green]ok[/]", "failed": "[red]FAILED[/]"}.get(r.status, f"[yellow]{r.status}[/]")
        if r.rolls_back_to is not None:
            status += f" (trained from {r.rolls_back_to})"
        table.add_row(
            str(r.version),
            r.kind or "?",
            _num(r.segments, "d"),
            "-" if r.bytes is None else _size(r.bytes),
            NOT_COUNTED if r.counted is False else _num(r.changed, ","),
            status,
        )
    _stdout().print(table)


# ---------------------------------------------------------------- gc


def cmd_gc(args: argparse.Namespace) -> int:
    from aurora_store.cli_gc import gc

    with _open(args, signing_key=args.signing_key) as run:
        return gc(run, args)


# ---------------------------------------------------------------- keygen


def cmd_keygen(args: argparse.Namespace) -> int:
    from aurora_store.format import signing

    private, public = signing.generate_keypair()
    key_path, pub_path = f"{args.out}.key", f"{args.out}.pub"
    for path in (key_path, pub_path):
        if os.path.lexists(path):
            raise CommandError(f"{path} already exists; refusing to overwrite a key")
    write_new(key_path, private, 0o600)
    write_new(pub_path, public, 0o644)
    kid = signing.key_id(signing.load_verify_key(public))
    print(f"wrote {key_path} (private, keep it secret) and {pub_path}; key id {kid}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
