"""Tokenizers the built-in models use: one id per character, nothing to download.

The trainer attaches ``tokenizer.json`` to every run, so an actor tokenizes exactly as the
trainer does. The character tokenizer maps each printable ASCII character to one id after
three specials.
"""

from __future__ import annotations

import json
import string
from collections.abc import Sequence

from aurora_store.rl.errors import ModelError

PAD, BOS, EOS = 0, 1, 2
_SPECIALS = ("<pad>", "<bos>", "<eos>")


class CharTokenizer:
    """One id per character; ``<pad>``, ``<bos>``, ``<eos>`` first."""

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
        return json.dumps({"type": "aurora-char", "specials": list(_SPECIALS), "chars": self.chars}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> CharTokenizer:
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ModelError(f"tokenizer.json is not JSON: {exc}") from None
        if not isinstance(doc, dict) or doc.get("type") != "aurora-char" or not isinstance(doc.get("chars"), str):
            raise ModelError("tokenizer.json is not an aurora character tokenizer")
        if doc.get("specials") != list(_SPECIALS):
            raise ModelError(f"tokenizer.json: specials must be {list(_SPECIALS)}")
        return cls(doc["chars"])
