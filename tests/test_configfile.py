"""One config file for every role (``aurora.toml``): what each role reads from it, what overrides it,
what a bad file says (the key and what was expected, all at once), hostile documents, and a whole
run started from the file alone: trainer, relay and actor as real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aurora_store import config as configfile
from aurora_store.cli import build_parser, main
from aurora_store.coord.coordinator import Coordinator
from aurora_store.errors import ConfigError
from aurora_store.testing.processes import wait_for

REPO = Path(__file__).resolve().parents[1]

GOOD = """
run_id = "exp1"
home = "us"

[keys]
verify = "keys/run.pub"

[regions.us]
uri = "file:///buckets/us/exp1"
storage_options = { auto_mkdir = true }

[regions.eu]
uri = "file:///buckets/eu/exp1"

[regions.ap]
uri = "file:///buckets/ap/exp1"
source = "eu"

[trainer]
steps = 7
[model]
hidden = 32
[optim]
lr = 1
[publish]
full_every = 4
[actor]
batch = 4
connections = 3
[regions.ap.actor]
batch = 2
[relay]
concurrency = 5
"""


def _file(tmp_path: Path, text: str = GOOD, name: str = "aurora.toml") -> str:
    """The config file, and the verify key GOOD names beside it (config check wants the files it names)."""
    path = tmp_path / name
    path.write_text(text)
    (tmp_path / "keys").mkdir(exist_ok=True)
    (tmp_path / "keys" / "run.pub").write_text("x")
    return str(path)


@pytest.fixture(autouse=True)
def _no_request_left() -> Any:
    """Every role has declared its part of the file before a test checks one (the roles declare when
    they register their subcommands, as ``aurora`` does before it reads a file), whichever test runs
    first in this process; and a test that notes a command line's config file (``requested``) leaves
    none noted for the next, whose parsers would take this test's file as their defaults."""
    build_parser()
    yield
    configfile.requested([])


def _args(argv: list[str]) -> Any:
    """``argv`` parsed as ``aurora`` parses it, config file and all."""
    configfile.requested(argv)
    return build_parser().parse_args(argv)


def test_each_role_reads_its_part(tmp_path: Path) -> None:
    path = _file(tmp_path)
    train = _args(["train", "--config", path, "--redis", "redis://r:6379/0"])
    assert (train.store, train.region, train.run_id) == ("file:///buckets/us/exp1", "us", "exp1")
    assert train.storage_options == {"auto_mkdir": True}
    assert (train.steps, getattr(train, "model.hidden"), getattr(train, "publish.full_every")) == (7, 32, 4)
    assert getattr(train, "optim.lr") == 1.0 and isinstance(getattr(train, "optim.lr"), float)

    relay = _args(["relay", "--config", path, "--region", "ap"])
    assert (relay.source, relay.source_region, relay.dest, relay.dest_region) == (
        "file:///buckets/eu/exp1",
        "eu",
        "file:///buckets/ap/exp1",
        "ap",
    )
    assert relay.concurrency == 5 and relay.run_id == "exp1"
    assert relay.verify_key == str(tmp_path / "keys/run.pub"), "a relative key path is beside the file"
    assert relay.dest_options == {} and relay.source_options == {}

    eu = _args(["actor", "--config", path, "--region", "eu", "--redis", "redis://r", "--worker-id", "a1"])
    assert (getattr(eu, "sync.store"), getattr(eu, "sync.fallback")) == (
        "file:///buckets/eu/exp1",
        "file:///buckets/us/exp1",
    )
    assert getattr(eu, "sync.fallback_options") == {"auto_mkdir": True}
    assert (getattr(eu, "rollout.batch"), getattr(eu, "sync.connections")) == (4, 3)
    ap = _args(["actor", "--config", path, "--region", "ap", "--redis", "redis://r", "--worker-id", "a1"])
    assert getattr(ap, "rollout.batch") == 2, "[regions.ap.actor] wins over [actor] in ap"
    home = _args(["actor", "--config", path, "--region", "us", "--redis", "redis://r", "--worker-id", "a1"])
    assert getattr(home, "sync.fallback") is None, "home's actors have no fallback"


def test_flags_and_environment_override_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _file(tmp_path, GOOD.replace('home = "us"', 'home = "us"\nredis = "redis://file-redis:6379/0"'))
    assert _args(["train", "--config", path]).redis == "redis://file-redis:6379/0"
    monkeypatch.setenv("AURORA_REDIS", "redis://env-redis:6379/0")
    monkeypatch.setenv("AURORA_WORKER_ID", "host-7")
    assert _args(["train", "--config", path]).redis == "redis://env-redis:6379/0"
    args = _args(["train", "--config", path, "--redis", "redis://flag:1/0", "--steps", "9", "--hidden", "48"])
    assert (args.redis, args.steps, getattr(args, "model.hidden")) == ("redis://flag:1/0", 9, 48)
    actor = _args(["actor", "--config", path, "--region", "eu"])
    assert getattr(actor, "sync.worker_id") == "host-7" and getattr(actor, "sync.redis") == "redis://env-redis:6379/0"
    monkeypatch.setenv("AURORA_CONFIG", path)
    assert _args(["relay", "--region", "eu"]).dest == "file:///buckets/eu/exp1", "$AURORA_CONFIG names the file"


def test_no_config_changes_nothing() -> None:
    args = _args(["relay", "--source", "file:///a/r", "--dest", "file:///b/r", "--dest-region", "b", "--once"])
    assert (args.source, args.concurrency, args.config) == ("file:///a/r", 8, None)


def test_check_accepts_a_good_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _file(tmp_path)
    (tmp_path / "keys" / "run.pub").unlink()
    assert main(["config", "check", path]) == 1, "the verify key it names is not there"
    assert "keys/run.pub does not exist" in capsys.readouterr().err
    (tmp_path / "keys" / "run.pub").write_text("x")
    assert main(["config", "check", path]) == 0
    out = capsys.readouterr().out
    assert "ok: run exp1, home region us, 3 region(s)" in out and "(relayed from eu)" in out
    assert "redis ($AURORA_REDIS)" in out and "worker_id ($AURORA_WORKER_ID)" in out
    assert main(["config", "check", path, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    roles = sorted((r["command"], r["region"]) for r in doc["roles"])
    assert roles == [
        ("actor", "ap"),
        ("actor", "eu"),
        ("actor", "us"),
        ("relay", "ap"),
        ("relay", "eu"),
        ("train", "us"),
    ]
    ap = next(r for r in doc["roles"] if r["command"] == "actor" and r["region"] == "ap")
    assert ap["options"]["rollout.batch"] == 2 and ap["options"]["engine.engine"] == "torch"


BAD = [
    ("", "run_id: missing"),
    ('run_id = "x"\nhome = "a"\n', "regions: missing"),
    ('run_id = "x y"\nhome = "a"\n[regions.a]\nuri = "file:///a"', "run_id: expected a short name"),
    ('run_id = "x"\nhome = "b"\n[regions.a]\nuri = "file:///a"', "home: 'b' is not a key of [regions]"),
    ('run_id = "x"\nhome = "a"\n[regions.a]\nuri = 3', "regions.a.uri: expected the region's run URI"),
    ('run_id = "x"\nhome = "a"\n[regions.a]\nurl = "file:///a"', "regions.a.uri: missing"),
    ('run_id = "x"\nhome = "a"\n[regions.a]\nuri = "file:///a"\n[regions.b]\nuri = "file:///a/"', "the same URI"),
    (
        'run_id = "x"\nhome = "a"\n[regions.a]\nuri = "file:///a"\n[regions.b]\nuri = "file:///b"\nsource = "c"\n'
        '[regions.c]\nuri = "file:///c"\nsource = "b"',
        "never reaches home",
    ),
    ('run_id = "x"\nhome = "a"\n[regions.a]\nuri = "file:///a"\nsource = "a"', "the home region has no source"),
    (
        'run_id = "x"\nhome = "a"\n[regions.a]\nuri = "file:///a"\n[modle]\nhidden = 3',
        "modle: unknown key; did you mean 'model'?",
    ),
    (
        'run_id = "x"\nhome = "a"\n[regions.a]\nuri = "file:///a"\n[model]\nhiden = 3',
        "model.hiden: unknown key; did you mean 'hidden'?",
    ),
    (
        'run_id = "x"\nhome = "a"\n[regions.a]\nuri = "file:///a"\n[model]\nhidden = "big"',
        "model.hidden: expected an integer",
    ),
    (
        'run_id = "x"\nhome = "a"\n[regions.a]\nuri = "file:///a"\n[model]\nhidden = true',
        "model.hidden: expected an integer",
    ),
    (
        'run_id = "x"\nhome = "a"\n[regions.a]\nuri = "file:///a"\n[actor]\nengine = "jax"',
        "actor.engine: expected one of 'torch', 'vllm'",
    ),
    (
        'run_id = "x"\nhome = "a"\n[regions.a]\nuri = "file:///a"\n[trainer]\nstore = "s3://x"',
        "comes from the file's common part",
    ),
    (
        'run_id = "x"\nhome = "a"\n[regions.a]\nuri = "file:///a"\n[actor]\nworker_id = "a-0"',
        "actor.worker_id: unknown key (it is set per host: a flag or its variable)",
    ),
    (
        'run_id = "x"\nhome = "a"\n[regions.a]\nuri = "file:///a"\n[regions.a.model]\nhidden = 3',
        "regions.a.model: unknown key",
    ),
    (
        'run_id = "x"\nhome = "a"\n[regions.a]\nuri = "file:///a"\n[keys]\nsigning = "-----BEGIN PRIVATE KEY-----"',
        "$AURORA_SIGNING_KEY",
    ),
    ('run_id = "x"\nhome = "a"\nredis = "http://x"\n[regions.a]\nuri = "file:///a"', "redis: expected a redis://"),
    (
        'run_id = "x"\nhome = "a"\n[regions.a]\nuri = "file:///a"\n[relay]\nconcurrency = [1]',
        "relay.concurrency: expected an integer",
    ),
    ("run_id = [", "not valid TOML"),
    ("\xff\xfe", "not valid TOML"),
]


@pytest.mark.parametrize(("text", "says"), BAD)
def test_a_bad_file_says_which_key_and_what_was_expected(tmp_path: Path, text: str, says: str) -> None:
    path = _file(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        configfile.check(path)
    assert says in str(err.value) and path in str(err.value)
    configfile.requested(["train", "--config", path])
    with pytest.raises(ConfigError):
        build_parser()  # no role starts from it


def test_an_option_that_names_no_fact_of_the_file_is_refused_when_its_role_declares() -> None:
    """A role's field that says the file gives it (``option(file=...)``) must name one of the facts
    the file has: a typo fails when the role registers, not when a user's file is read."""
    from dataclasses import dataclass, field

    from aurora_store.config.options import option

    @dataclass(kw_only=True, slots=True)
    class Options:
        store: str = field(metadata=option(file="region.url"))
        """Where."""

    schema = configfile.RoleSchema(command="nope", cls=Options, tables=(), regions="each")
    with pytest.raises(TypeError, match=r"store: 'region\.url'"):
        configfile.declare(schema)
    assert "nope" not in configfile.schemas()


def test_every_problem_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = 'run_id = "x"\nhome = "a"\n[regions.a]\nuri = "file:///a"\n'
    text += '[model]\nhiden = 3\n[relay]\nconcurency = 4\n[actor]\nbatch = "x"'
    assert main(["config", "check", _file(tmp_path, text)]) == 1
    err = capsys.readouterr().err
    assert "model.hiden" in err and "relay.concurency" in err and "actor.batch: expected an integer" in err


def test_role_needs_a_region_the_file_has(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _file(tmp_path)
    assert main(["actor", "--config", path, "--worker-id", "w", "--redis", "redis://r"]) == 1
    assert "needs --region (one of: us, eu, ap)" in capsys.readouterr().err
    assert main(["actor", "--config", path, "--region", "eu-west"]) == 1
    assert "no region 'eu-west'" in capsys.readouterr().err
    assert main(["relay", "--config", path, "--region", "us"]) == 1
    assert "us is the home region" in capsys.readouterr().err
    assert main(["config", "check", str(tmp_path / "absent.toml")]) == 1
    assert "cannot read the config file" in capsys.readouterr().err


def test_secrets_in_the_file_are_warned_of_and_never_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = GOOD.replace('home = "us"', 'home = "us"\nredis = "rediss://:hunter2@redis:6379/0"').replace(
        "storage_options = { auto_mkdir = true }", 'storage_options = { secret = "AKIA-hunter3" }'
    )
    path = _file(tmp_path, text)
    assert main(["config", "check", path, "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert any("password" in w for w in doc["warnings"]) and any("credential" in w for w in doc["warnings"])
    assert "hunter2" not in captured.out and "hunter3" not in captured.out
    trainer = next(r for r in doc["roles"] if r["command"] == "train")
    assert trainer["options"]["storage_options"] == {"secret": "***"}
    assert main(["config", "check", path]) == 0
    assert "hunter2" not in capsys.readouterr().out


DEEP = "[regions.eu.storage_options." + ".".join(["a"] * 3000) + "]\nx = 1\n"


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ("[schedule]\nlease_s = " + "9" * 400 + "\n", "schedule.lease_s: expected a number of at most 300 digits"),
        ("[sampling]\ngroup = " + "9" * 5000 + "\n", "not valid TOML: an integer too long to read"),
        (DEEP, "regions.eu.storage_options.a.a.a"),
    ],
    ids=["400-digit float", "5000-digit integer", "tables 3000 deep"],
)
def test_huge_numbers_and_deep_nesting_are_config_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: str, says: str
) -> None:
    """Issue 25, bug 9: these were OverflowError, ValueError and RecursionError tracebacks."""
    path = _file(tmp_path, GOOD + extra)
    assert main(["config", "check", path]) == 1
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and len(err) < 1000, err
    assert main(["train", "--config", path, "--redis", "redis://127.0.0.1:1/0"]) == 1, "a role refuses it too"
    assert says in capsys.readouterr().err


def test_json_options_nested_deep_are_usage_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 25, bug 9: storage options 3000 deep (a flag, or the environment) were a RecursionError."""
    deep = '{"a": ' * 3000 + "1" + "}" * 3000
    base = ["train", "--store", "memory://x/r", "--redis", "redis://x", "--run-id", "r"]
    for argv, env in ((["--storage-options", deep], None), ([], deep)):
        if env is not None:
            monkeypatch.setenv("AURORA_STORAGE_OPTIONS", env)
        with pytest.raises(SystemExit) as usage:
            _args([*base, *argv])
        assert usage.value.code == 2
        assert "--storage-options: nested deeper than 32" in capsys.readouterr().err


def test_a_private_keys_text_is_refused_anywhere_in_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 25: only keys.signing was checked for a private key's text."""
    from aurora_store.format import signing

    pem = signing.generate_keypair()[0].decode().strip()
    eu = 'uri = "file:///buckets/eu/exp1"'
    for where, text in (
        ("keys.verify", GOOD.replace('verify = "keys/run.pub"', f"verify = '''{pem}'''")),
        ("data.system_prompt", GOOD + f"[data]\nsystem_prompt = '''{pem}'''\n"),
        ("regions.eu.storage_options.cert", GOOD.replace(eu, f"{eu}\nstorage_options = {{ cert = '''{pem}''' }}")),
    ):
        path = _file(tmp_path, text)
        assert main(["config", "check", path]) == 1, where
        err = capsys.readouterr().err
        assert f"{where}: holds a private key's text" in err and "PRIVATE KEY" not in err, err


def test_an_azure_connection_string_is_a_credential(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 25: an Azure connection_string was neither flagged nor hidden from --help --config."""
    secret = "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=hunter4secret==;EndpointSuffix=x.net"
    eu = 'uri = "file:///buckets/eu/exp1"'
    path = _file(tmp_path, GOOD.replace(eu, f'{eu}\nstorage_options = {{ connection_string = "{secret}" }}'))
    assert main(["config", "check", path, "--json"]) == 0
    out = capsys.readouterr()
    assert "hunter4secret" not in out.out + out.err
    assert any("regions.eu.storage_options.connection_string" in w for w in json.loads(out.out)["warnings"])
    for argv in (["actor", "--region", "eu"], ["relay", "--region", "eu"], ["train"]):
        with pytest.raises(SystemExit):
            _args([argv[0], "--config", path, *argv[1:], "--help"])
        helped = capsys.readouterr().out
        assert "hunter4secret" not in helped and "connection_string" in helped, argv


TOML_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
KEYS = st.sampled_from(
    [*configfile.COMMON, "trainer", "model", "actor", "relay", "schedule", "uri", "source", "x"]
) | st.text(max_size=8)


@settings(max_examples=120, deadline=None)  # each document is a few ms to build and check: 300 took 9-21 s
@given(doc=st.dictionaries(KEYS, TOML_VALUES | st.dictionaries(KEYS, TOML_VALUES, max_size=5), max_size=8))
def test_hostile_documents_get_a_config_error_or_a_checked_file(doc: dict[str, Any]) -> None:
    try:
        f = configfile.from_doc(doc)
    except ConfigError:
        return
    assert f.home in f.regions and all(isinstance(r.uri, str) for r in f.regions.values())


@settings(max_examples=200, deadline=None)
@given(cut=st.integers(0, len(GOOD)), byte=st.integers(0, 255), at=st.integers(0, len(GOOD) - 1))
def test_damaged_files_get_a_config_error_or_a_checked_file(cut: int, byte: int, at: int) -> None:
    raw = bytearray(GOOD.encode())
    raw[at] = byte
    for data in (bytes(raw), GOOD.encode()[:cut]):
        try:
            f = configfile.parse(data)
        except ConfigError:
            continue
        # what parses is a checked file: its home is one of its regions, each with a URI
        assert isinstance(f.run_id, str) and f.home in f.regions
        assert all(isinstance(r.uri, str) for r in f.regions.values())


@pytest.mark.slow
def test_a_run_from_the_config_file_alone(tmp_path: Path, redis_server: Any) -> None:
    """Trainer, relay and actor started with only --config (and the region): the run reaches eu and audits."""
    home, eu = (tmp_path / "home" / "cfg").as_uri(), (tmp_path / "eu" / "cfg").as_uri()
    text = f"""
run_id = "cfg"
home = "home"
redis = "{redis_server.url}"
[regions.home]
uri = "{home}"
[regions.eu]
uri = "{eu}"
[trainer]
steps = 2
[optim]
sft_steps = 20
lr = 5e-4
[rollout]
prompts = 8
[sampling]
group = 4
max_new_tokens = 4
[schedule]
lease_s = 20.0
[actor]
heartbeat_s = 2.0
[relay]
rescan_s = 1.0
"""
    path = _file(tmp_path, text)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "AURORA_WORKER_ID": "eu-host-1"}
    env.pop("AURORA_REDIS", None)
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(name: str, *argv: str) -> None:
        log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 - the child owns it
        cmd = [sys.executable, "-m", "aurora_store.cli", *argv, "--config", path]
        procs[name] = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)

    def log(name: str) -> str:
        return (tmp_path / f"{name}.log").read_text(errors="replace")[-3000:]

    try:
        spawn("trainer", "train")
        spawn("relay", "relay", "--region", "eu")
        spawn("actor", "actor", "--region", "eu")
        deadline = time.monotonic() + 240
        while procs["trainer"].poll() is None and time.monotonic() < deadline:
            for name in ("relay", "actor"):
                assert procs[name].poll() is None, f"{name} exited:\n{log(name)}"
            time.sleep(0.5)
        assert procs["trainer"].returncode == 0, f"trainer:\n{log('trainer')}\nactor:\n{log('actor')}"

        def eu_has_two() -> bool:
            out = subprocess.run(
                [sys.executable, "-m", "aurora_store.cli", "ls", eu, "--json"], capture_output=True, cwd=REPO
            )
            return out.returncode == 0 and [r["version"] for r in json.loads(out.stdout)] == [0, 1, 2]

        wait_for(eu_has_two, timeout=60, what=f"eu has versions 0-2:\n{log('relay')}")
        audit = subprocess.run(
            [sys.executable, "-m", "aurora_store.cli", "audit", eu, "--json"], capture_output=True, cwd=REPO
        )
        assert audit.returncode == 0, audit.stderr
        assert json.loads(audit.stdout)["ok"] is True
        workers = Coordinator(redis_server.url, "cfg").workers.registrations()
        assert workers["eu-host-1"]["region"] == "eu", "the actor took its id from $AURORA_WORKER_ID"
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
