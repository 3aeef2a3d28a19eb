"""Secrets never show: passwords in URLs are redacted wherever they would be printed or logged, and
signing keys and Redis passwords come from the environment and never appear in --help."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.test_cli import aurora


def test_passwords_in_urls_are_never_printed(tmp_path: Path) -> None:
    from aurora_store.redact import redact
    from aurora_store.testing.processes import wait_for

    assert redact("redis://:s3cret@h:6379/0") == "redis://:***@h:6379/0"
    assert (
        redact("rediss://user:s3cret@h/0 and https://u:p@ss@host/x") == "rediss://user:***@h/0 and https://u:***@host/x"
    )
    assert redact("redis://h/0?password=s3cret&db=1") == "redis://h/0?password=***&db=1"
    assert redact("s3://bucket/run file:///tmp/x") == "s3://bucket/run file:///tmp/x"
    ls = aurora("ls", "https://alice:s3cret@127.0.0.1:1/run")
    assert ls.returncode == 1 and "s3cret" not in ls.stderr and "alice:***@" in ls.stderr, ls.stderr
    log = tmp_path / "relay.log"
    with open(log, "wb") as sink:  # Redis does not answer: the relay waits for it (retrying), and says so redacted
        relay = subprocess.Popen(
            [
                *RELAY,
                "--source",
                "memory://x/run",
                "--dest",
                "memory://y/run",
                "--dest-region",
                "eu",
                "--rescan-s",
                "1",
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, "AURORA_REDIS": f"redis://:s3cret@127.0.0.1:{_free()}/0?password=s3cret"},
        )
        try:
            wait_for(lambda: b"retrying with backoff" in log.read_bytes(), "the relay to say it waits for Redis", 60)
        finally:
            relay.terminate()
            relay.wait(60)
    said = log.read_text()
    assert "s3cret" not in said and ":***@" in said, said


RELAY = (sys.executable, "-m", "aurora_store.cli", "relay")


def _free() -> int:
    from aurora_store.testing.processes import free_port

    return free_port()


def test_secrets_come_from_the_environment_and_never_show_in_help(tmp_path: Path) -> None:
    from actor.config import SyncConfig
    from actor.updater import open_sync_runs
    from aurora_store.format import signing

    env = {"AURORA_REDIS": "redis://:s3cret@127.0.0.1:1/0", "AURORA_SIGNING_KEY": "-----BEGIN s3cret"}
    for role in ("actor", "train", "relay"):
        helped = aurora(role, "--help", env=env)
        assert helped.returncode == 0 and "s3cret" not in helped.stdout, role
    _, pub = signing.generate_keypair()
    sync = SyncConfig(
        store=f"file://{tmp_path}/eu/run",
        region="eu",
        redis="redis://127.0.0.1:1/0",
        run_id="r",
        worker_id="w",
        fallback=f"file://{tmp_path}/home/run",
        storage_options={"auto_mkdir": True},
        verify_key=pub.decode(),
    )
    _, fallback = open_sync_runs(sync)
    assert fallback is not None and fallback.reader.verify_key is not None, "the fallback is verified too"
    assert signing.key_id(fallback.reader.verify_key) == signing.key_id(signing.load_verify_key(pub))
    assert fallback.store.fs.auto_mkdir is True, "and opened with the region's storage options by default"


def test_config_check_ls_and_redact_never_print_a_uris_password(tmp_path: Path) -> None:
    """Issue 25, bug 10: ``config check`` printed every region's URI with its password (text and
    --json), ``aurora ls s3://KEY:SECRET@bucket/...`` echoed the secret through botocore's message,
    and redact() missed passwords holding '/' or a space."""
    from aurora_store.redact import redact

    assert redact("s3://KEY:hunter/5@bucket/run") == "s3://KEY:***@bucket/run"
    assert redact("s3://AKIA:hunter 5@bucket/run, then") == "s3://AKIA:***@bucket/run, then"
    assert redact("'https://u:a/b c@d@host:1/x'") == "'https://u:***@host:1/x'"
    config = tmp_path / "aurora.toml"
    config.write_text(
        'run_id = "r"\nhome = "us"\n[regions.us]\nuri = "file:///b/us/r"\n'
        '[regions.eu]\nuri = "s3://AKIA:hunter/5 x@bucket/r"\n[regions.ap]\nuri = "https://u:hunter6@host/r"\n'
    )
    for argv in (["config", "check", str(config)], ["config", "check", str(config), "--json"]):
        shown = aurora(*argv)
        assert shown.returncode == 0, shown.stderr
        said = shown.stdout + shown.stderr
        assert "hunter" not in said and "s3://AKIA:***@bucket/r" in said and "https://u:***@host/r" in said, said
    for uri in ("s3://KEY:hunter7@bucket/run", "s3://KEY:hun/ter7@bucket/run", "gs://KEY:hunter7@bucket/run"):
        ls = aurora("ls", uri)
        assert ls.returncode == 1 and "ter7" not in ls.stderr and "takes no credentials" in ls.stderr, ls.stderr
