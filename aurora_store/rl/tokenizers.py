"""Tokenizers as trainer and actors use them: a model's own HF tokenizer, or the built-in
character tokenizer of the tiny models (nothing to download).

Both turn a prompt's text into the ids the model sees (the HF one through its chat template,
with an optional system prompt) and a completion's ids back into text, and know their EOS and
padding ids. The trainer attaches a tokenizer's files to the run (:meth:`Tokenizer.files`), so
actors and ``aurora replay`` rebuild exactly the same one from the bucket (:func:`from_files`).
The trainer tokenizes each prompt once and jobs carry the ids, so both sides see the same ids.
"""

from __future__ import annotations

import json
import os
import string
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from aurora_store.format import hostile_json
from aurora_store.rl.errors import ModelError

CHAR_KIND = "aurora-char"
HF_KIND = "hf"
TOKENIZER_FILES = frozenset(
    {
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        "chat_template.json",
        "vocab.json",
        "merges.txt",
        "tokenizer.model",
        "added_tokens.json",
    }
)
"""The files a HF tokenizer directory may hold (what :func:`from_files` writes back)."""


class Tokenizer(Protocol):
    kind: str
    """``"aurora-char"`` or ``"hf"``: how :func:`from_files` rebuilds it."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """Ids that end a completion."""
        ...

    @property
    def pad_id(self) -> int: ...

    def prompt_ids(self, text: str) -> list[int]:
        """The ids a prompt is given to the model as (chat template and specials included)."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """A completion's text, specials dropped."""
        ...

    def completion_ids(self, text: str) -> list[int]:
        """The ids of ``text`` as a completion the model should produce, EOS appended (warm starts)."""
        ...

    def files(self) -> dict[str, bytes]:
        """Name -> bytes of the files that rebuild this tokenizer."""
        ...


PAD, BOS, EOS = 0, 1, 2
_SPECIALS = ("<pad>", "<bos>", "<eos>")


class CharTokenizer:
    """One id per character; ``<pad>``, ``<bos>``, ``<eos>`` first."""

    kind = CHAR_KIND

    def __init__(self, chars: str = string.printable[:95]) -> None:
        if len(set(chars)) != len(chars) or not chars:
            raise ModelError("a character tokenizer needs distinct characters")
        self.chars = chars
        self.ids = {c: i + len(_SPECIALS) for i, c in enumerate(chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars) + len(_SPECIALS)

    def encode(self, text: str, *, bos: bool = True) -> list[int]:
        try:
            ids = [self.ids[c] for c in text]
        except KeyError as exc:
            raise ModelError(f"character {exc.args[0]!r} is not in the tokenizer's alphabet") from None
        return [BOS, *ids] if bos else ids

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return (EOS,)

    @property
    def pad_id(self) -> int:
        return PAD

    def prompt_ids(self, text: str) -> list[int]:
        return self.encode(text)

    def completion_ids(self, text: str) -> list[int]:
        return [*self.encode(text, bos=False), EOS]

    def files(self) -> dict[str, bytes]:
        return {"tokenizer.json": self.to_json()}

    def decode(self, ids: Sequence[int]) -> str:
        """Text up to the first ``<eos>``; specials are dropped."""
        out = []
        for i in ids:
            if i == EOS:
                break
            if i >= len(_SPECIALS):
                out.append(self.chars[i - len(_SPECIALS)])
        return "".join(out)

    def to_json(self) -> bytes:
        return json.dumps({"type": CHAR_KIND, "specials": list(_SPECIALS), "chars": self.chars}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> CharTokenizer:
        try:
            doc = hostile_json.loads(data)
        except ValueError as exc:
            raise ModelError(f"tokenizer.json is not JSON: {exc}") from None
        if not isinstance(doc, dict) or doc.get("type") != CHAR_KIND or not isinstance(doc.get("chars"), str):
            raise ModelError("tokenizer.json is not an aurora character tokenizer")
        if doc.get("specials") != list(_SPECIALS):
            raise ModelError(f"tokenizer.json: specials must be {list(_SPECIALS)}")
        return cls(doc["chars"])


class HFTokenizer:
    """A transformers tokenizer, with the chat template applied to prompts when it has one."""

    kind = HF_KIND

    def __init__(
        self,
        tok: Any,
        *,
        chat_template: bool = True,
        system_prompt: str | None = None,
        eos_ids: Sequence[int] = (),
    ) -> None:
        self.tok = tok
        self.chat_template = bool(chat_template and getattr(tok, "chat_template", None))
        self.system_prompt = system_prompt
        ids = [*eos_ids, *([tok.eos_token_id] if tok.eos_token_id is not None else [])]
        self._eos = tuple(dict.fromkeys(int(i) for i in ids))
        if not self._eos:
            raise ModelError("the tokenizer has no EOS token and the model's generation config names none")
        self._pad = int(tok.pad_token_id) if tok.pad_token_id is not None else self._eos[0]

    @classmethod
    def load(cls, path: str, **kw: Any) -> HFTokenizer:
        """``AutoTokenizer.from_pretrained(path)`` (a local directory is read offline)."""
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(path, local_files_only=os.path.isdir(path))
        except Exception as exc:
            # (AttributeError on a field of the wrong type, a bare Exception from the Rust parser,
            # RecursionError): every one of them means "not a tokenizer", and a role must not die of it
            raise ModelError(f"cannot load a tokenizer from {path!r}: {type(exc).__name__}: {exc}"[:500]) from None
        return cls(tok, **kw)

    @property
    def vocab_size(self) -> int:
        return len(self.tok)

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return self._eos

    @property
    def pad_id(self) -> int:
        return self._pad

    def prompt_ids(self, text: str) -> list[int]:
        if not self.chat_template:
            return list(self.tok(text, add_special_tokens=True)["input_ids"])
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": text})
        out = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if isinstance(out, Mapping) else out)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tok.decode(list(ids), skip_special_tokens=True))

    def completion_ids(self, text: str) -> list[int]:
        return [*self.tok(text, add_special_tokens=False)["input_ids"], self._eos[0]]

    def files(self) -> dict[str, bytes]:
        with tempfile.TemporaryDirectory(prefix="aurora-tokenizer-") as d:
            self.tok.save_pretrained(d)
            return {p.name: p.read_bytes() for p in sorted(Path(d).iterdir()) if p.name in TOKENIZER_FILES}


def from_files(
    kind: str,
    files: Mapping[str, bytes],
    *,
    chat_template: bool = True,
    system_prompt: str | None = None,
    eos_ids: Sequence[int] = (),
) -> Tokenizer:
    """The tokenizer a run's attached files describe (``kind`` from the run's spec)."""
    if kind == CHAR_KIND:
        if "tokenizer.json" not in files:
            raise ModelError("the run has no tokenizer.json")
        return CharTokenizer.from_json(files["tokenizer.json"])
    if kind != HF_KIND:
        raise ModelError(f"tokenizer kind {kind!r}, expected {CHAR_KIND!r} or {HF_KIND!r}")
    mine = {n: b for n, b in files.items() if n in TOKENIZER_FILES}
    if "tokenizer_config.json" not in mine:
        raise ModelError("the run has no tokenizer_config.json: not a HF tokenizer")
    for name, data in mine.items():  # checked here, before transformers and tokenizers parse them
        if name.endswith(".json"):
            try:
                doc = hostile_json.loads(data)
            except ValueError as exc:
                raise ModelError(f"{name} is not JSON: {exc}"[:300]) from None
            if not isinstance(doc, dict):
                raise ModelError(f"{name} must be a JSON object")
    with tempfile.TemporaryDirectory(prefix="aurora-tokenizer-") as d:
        for name, data in mine.items():
            Path(d, name).write_bytes(data)
        return HFTokenizer.load(d, chat_template=chat_template, system_prompt=system_prompt, eos_ids=eos_ids)
