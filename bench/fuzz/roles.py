"""The role-facing targets of ``aurora bench fuzz`` (see :mod:`bench.fuzz.targets`): Redis entries as
the roles parse them (:mod:`aurora_store.coord.wire` and every module-level ``parse_*`` of
``aurora_store.coord``), and the run's attachments as an actor builds from them (:mod:`actor.assemble`)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import random
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench.fuzz.mutate import mutate_bytes, mutate_fields, mutate_json
from bench.fuzz.seeds import published
from bench.fuzz.target import Target, hexed

GOLDEN = Path(__file__).resolve().parents[2] / "tests" / "data" / "golden"
HF_RATE = 0.01
"""Share of the mutants of a HF tokenizer's files loaded as one (the rest feed the cheap parsers)."""


# ---------------------------------------------------------------- Redis entries

Fields = dict[str, Any]
_ARGS: dict[str, Callable[[Fields], Any]] = {
    **dict.fromkeys(("fields", "f", "entry", "mapping", "h"), lambda f: f),
    **dict.fromkeys(("v", "version", "expect_version"), lambda f: 1),
    **dict.fromkeys(("eid", "entry_id", "id"), lambda f: "1767225600000-0"),
    "what": lambda f: "fuzz",
    "raw": lambda f: next(iter(f.values()), ""),
    "doc": lambda f: f.get("doc", next(iter(f.values()), "")),
}
"""How to fill each parameter of a ``parse_*`` function of the coordination layer, by its name."""


def redis_parsers(topic: str) -> tuple[list[tuple[str, Callable[[Fields], object]]], list[str]]:
    """The module-level ``parse_*`` functions of ``aurora_store.coord`` (wire, jobs, results, coordinator) about
    ``topic`` (event, result, else docs) but parse_segment_event (called as the roles call it), and
    those skipped because a parameter cannot be filled."""
    from aurora_store.coord import coordinator, jobs, results, wire

    calls: list[tuple[str, Callable[[Fields], object]]] = []
    skipped = []
    for module in (wire, jobs, results, coordinator):
        for fname, fn in sorted(vars(module).items()):
            if not (fname.startswith("parse_") and inspect.isfunction(fn) and fn.__module__ == module.__name__):
                continue
            about = "event" if "event" in fname else "result" if "result" in fname else "docs"
            if about != topic or fname == "parse_segment_event":
                continue
            name = f"{module.__name__.removeprefix('aurora_store.')}.{fname}"
            params = [p for p in inspect.signature(fn).parameters.values() if p.default is p.empty]
            if any(p.name not in _ARGS or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
                skipped.append(f"{name}{inspect.signature(fn)}")
                continue
            calls.append((name, functools.partial(_call, fn, params)))
    return calls, skipped


def _call(fn: Callable[..., object], params: list[inspect.Parameter], fields: Fields) -> object:
    return fn(**{p.name: _ARGS[p.name](fields) for p in params})


def _each(calls: list[Callable[[], object]]) -> str | None:
    """Run every call: the project's errors are expected of hostile input (the first one labels the outcome)."""
    from aurora_store.errors import AuroraError

    first = None
    for call in calls:
        try:
            call()
        except AuroraError as exc:
            first = first or type(exc).__name__
    return first


def _redis(
    name: str, topic: str, seeds: list[Fields], fixed: Callable[[Fields], list[Callable[[], object]]]
) -> Target[Fields]:
    """A target running ``fixed(fields)`` (the wire calls a role makes on such an entry) and ``topic``'s parsers."""
    found, skipped = redis_parsers(topic)

    def execute(fields: Fields) -> str | None:
        return _each([*fixed(fields), *(functools.partial(call, fields) for _, call in found)])

    def show(fields: Fields) -> str:
        text = json.dumps({str(k): v if isinstance(v, (str, int, type(None))) else repr(v) for k, v in fields.items()})
        return text[:1024] + ("..." if len(text) > 1024 else "")

    wire_calls = {"event": "version, parse_segment_event, hex64", "result": "format.results.decode"}
    names = (f"coord.wire: {wire_calls.get(topic, 'json_object, name, uint')}", *(n for n, _ in found))
    return Target(name, seeds, mutate_fields, execute, show, (*names, *(f"skipped: {s}" for s in skipped)))


def redis_events(seed: int) -> Target[Fields]:
    from aurora_store.coord import wire

    seeds: list[Fields] = []
    for p in published(seed)[:8]:
        m = p.manifest
        for s in (*m.segments, *([m.index] if m.index else [])):
            seeds.append(
                {"type": "segment", "version": str(m.version), "key": s.key, "size": str(s.size), "sha256": s.sha256}
            )
        seeds.append({"type": "commit", "version": str(m.version), "version_hash": m.version_hash, "kind": m.kind})

    def fixed(f: Fields) -> list[Callable[[], object]]:  # as Coordinator._event checks an event
        v = 1
        with contextlib.suppress(wire.BadEntry):
            v = wire.version(f.get("version"))
        calls: list[Callable[[], object]] = [lambda: wire.version(f.get("version"))]
        if f.get("type") != "commit":
            calls.append(lambda: wire.parse_segment_event(f, v))
        if f.get("type") != "segment":
            calls.append(lambda: wire.hex64(f.get("version_hash"), "version_hash"))
        return calls

    return _redis("redis_events", "event", seeds, fixed)


def redis_results(seed: int) -> Target[Fields]:
    """Result entries as an actor writes them (inline payload or a bucket reference), read as the
    trainer reads them: the entry's fields, then the payload's bytes."""
    from aurora_store.coord import results
    from aurora_store.errors import PayloadError
    from aurora_store.format import results as payloads

    rows = [([5, 9, 2], [-0.5, -1.25, -0.01], "stop", 1.0), ([7], [-0.0], "length", 0.0)]
    data = payloads.encode(rows, failures={"timeout": 1}, weights_digest="0" * 32)
    h = published(seed)[1].manifest.version_hash
    sha = payloads.payload_digest(data)
    seeds: list[Fields] = [
        {"job": f"t:{s}:{i}", "token": str(7 + i), "actor": f"actor-eu-{i:08x}", "version": "1", "version_hash": h}
        | ({"bin": data} if i == 0 else {"ref": f"results/{sha}.bin", "sha256": sha, "size": str(len(data))})
        | ({} if i == 0 else {"region": "eu"})
        for s, i in ((3, 0), (4, 12))
    ]

    def fixed(f: Fields) -> list[Callable[[], object]]:  # as the trainer reads an entry, then its payload
        def payload() -> object:
            res = results.parse_result("1767225600000-0", f)
            if res.inline is None:
                return res
            try:
                return payloads.decode(res.inline, group=2, vocab=16, max_tokens=8)
            except PayloadError as exc:
                if exc.reason not in payloads.REASONS:
                    raise AssertionError(f"a reason no reader counts: {exc.reason}") from None
                raise

        return [payload]

    return _redis("redis_results", "result", seeds, fixed)


def redis_docs(seed: int) -> Target[Fields]:
    """Worker registrations, telemetry notes, job records and inbox entries."""
    from aurora_store.coord import wire

    worker = {"role": "actor", "region": "eu", "started_ms": 1767225600000, "version": 3, "version_hash": "ab" * 32}
    prompt = {"ids": [1, 40, 41, 42], "text": "What is 2 + 3?", "answer": "5"}
    job = {"step": "3", "version": "2", "actor": "actor-eu-1a2b3c4d", "deadline_ms": "1767225660000", "token": "12"}
    seeds: list[Fields] = [
        {"wid": "actor-eu-1a2b3c4d", "doc": json.dumps(worker)},
        {"doc": json.dumps({"actor": "actor-eu-1a2b3c4d", "region": "eu", "version": 3, "ms": 1767225600000})},
        {**job, "state": "leased", "prompt": json.dumps(prompt)},
        {"entry": "t:3:0|12", "tau": "431.25"},
    ]

    def fixed(f: Fields) -> list[Callable[[], object]]:
        calls: list[Callable[[], object]] = []
        for k, v in f.items():
            if k in ("doc", "prompt", "payload") or (isinstance(v, str) and v[:1] == "{"):
                calls.append(functools.partial(wire.json_object, v, "doc"))
            elif k in ("wid", "actor", "state", "entry"):
                calls.append(functools.partial(wire.name, v, "name"))
            else:
                calls.append(functools.partial(wire.uint, v, "number"))
        return calls

    return _redis("redis_docs", "docs", seeds, fixed)


# ---------------------------------------------------------------- attachments


def _hf_files() -> dict[str, bytes]:
    """A tiny HF tokenizer's files, as the trainer attaches them (HFTokenizer.files)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from aurora_store.rl.tokenizers import HFTokenizer

    vocab = {t: i for i, t in enumerate(["<pad>", "<unk>", "<|im_end|>", "What", "is", "2", "+", "3", "?", "5"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<pad>", unk_token="<unk>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}<|im_end|>{% endfor %}"
    return HFTokenizer(fast).files()


def attachments(seed: int) -> Target[tuple[str, bytes]]:
    from actor import assemble
    from aurora_store.rl.models import tiny_config
    from aurora_store.rl.runspec import RunSpec
    from aurora_store.rl.sampling import SamplingConfig
    from aurora_store.rl.tokenizers import CharTokenizer

    run: Any = SimpleNamespace(uri="memory://aurora-fuzz/attachments")
    char = RunSpec(
        tokenizer="aurora-char",
        chat_template=False,
        system_prompt=None,
        sampling=SamplingConfig(),
        reward="task:arith",
        reward_timeout_s=10.0,
        eos_ids=(2,),
    )
    sampling = SamplingConfig(group=4, max_new_tokens=64, temperature=0.7, top_p=0.95)
    hf = replace(char, tokenizer="hf", chat_template=True, system_prompt="Be brief.", sampling=sampling, eos_ids=(2, 7))
    hf_files = _hf_files()
    golden = GOLDEN / "run" / "files"
    seeds = [
        ("aurora_run.json", char.to_bytes()),
        ("aurora_run.json", hf.to_bytes()),
        ("task.json", b'{"task": "arith"}'),
    ]
    seeds += [
        ("config.json", json.dumps(tiny_config(98), indent=2).encode()),
        ("config.json", (golden / "config.json").read_bytes()),
    ]
    seeds += [
        ("tokenizer.json", CharTokenizer().to_json()),
        ("tokenizer.json", (golden / "tokenizer.json").read_bytes()),
    ]
    seeds += [(f"hf/{n}", b) for n, b in hf_files.items() if n.endswith(".json")]
    cheap = ("aurora_run.json", "task.json", "config.json", "tokenizer.json")

    def mutate(rng: random.Random, case: tuple[str, bytes]) -> tuple[str, bytes]:
        name, data = case
        if name.startswith("hf/") and rng.random() > HF_RATE:
            name = rng.choice(cheap)
        return name, mutate_json(rng, data) if rng.random() < 0.6 else mutate_bytes(rng, data)

    def execute(case: tuple[str, bytes]) -> None:
        name, data = case
        if name == "config.json":
            assemble.vocab_size(run, {"config.json": data})
        elif name == "tokenizer.json":
            assemble.tokenizer(char, {"tokenizer.json": data})
        elif name.startswith("hf/"):
            assemble.tokenizer(hf, {**hf_files, name[3:]: data})
        else:
            assemble.run_spec(run, {name: data})

    def show(case: tuple[str, bytes]) -> str:
        return f"{case[0]}: {hexed(case[1])}"

    calls = ("run_spec (RunSpec.from_bytes)", "vocab_size (check_config)", "tokenizer (tokenizers.from_files)")
    return Target("attachments", seeds, mutate, execute, show, tuple(f"actor.assemble.{c}" for c in calls))
