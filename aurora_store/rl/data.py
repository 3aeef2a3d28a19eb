"""Data sets of prompts with verifiable answers: JSONL, Parquet or CSV, read with pyarrow.

``read_records`` reads a file or a directory of them into (prompt, gold answer) records, every
bad row a clear :class:`DataError` naming the file and row. Presets name the columns and how the
gold answer is found: GSM8K (``question``; ``answer`` ending in ``#### N``), MATH (``problem``;
the last ``\\boxed{}`` of ``solution``), DeepScaleR (``problem``; ``answer``).

:class:`PromptPool` is the order a run trains on them: each epoch a shuffle fixed by the seed,
step ``t`` taking the prompts at positions ``[(t-1)·n, t·n)`` of the epochs laid end to end, so a
restarted trainer continues exactly where its steps stopped, with no prompt of an epoch skipped
or repeated. Prompts longer than the limit are dropped once, at load, and counted.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from aurora_store.rl.errors import RLError
from aurora_store.rl.tasks import Prompt

SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}
MAX_FIELD_CHARS = 1 << 20


class DataError(RLError):
    """A data set is missing, unreadable, or has a bad row."""


@dataclass(frozen=True, slots=True)
class Preset:
    prompt_field: str
    answer_field: str
    gold: Callable[[str], str | None]
    """The gold answer in the answer column's text (None: the row has none)."""


def _after_hashes(text: str) -> str | None:
    _, sep, tail = text.rpartition("####")
    return tail.strip().replace(",", "") or None if sep else None


def last_boxed(text: str) -> str | None:
    """The contents of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced; None if none."""
    for m in reversed(list(re.finditer(r"\\(?:boxed|fbox)\s*\{", text))):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[m.end() : i - 1].strip() or None
    return None


def _as_is(text: str) -> str | None:
    return text.strip() or None


PRESETS = {
    "gsm8k": Preset("question", "answer", _after_hashes),
    "math": Preset("problem", "solution", last_boxed),
    "deepscaler": Preset("problem", "answer", _as_is),
}


@dataclass(frozen=True, slots=True)
class Record:
    """One usable row: where it came from, its prompt and its gold answer."""

    file: str
    row: int
    """0-based row of ``file``."""
    prompt: str
    answer: str


def data_files(path: str) -> list[str]:
    """``path`` itself, or every data file below the directory ``path`` (sorted, by suffix)."""
    if os.path.isdir(path):
        found = sorted(
            os.path.join(d, n)
            for d, _, names in os.walk(path)
            for n in names
            if os.path.splitext(n)[1].lower() in SUFFIXES and not n.startswith(".")
        )
        if not found:
            raise DataError(f"{path}: no data files ({', '.join(SUFFIXES)}) in the directory")
        return found
    if not os.path.exists(path):
        raise DataError(f"{path}: no such file or directory")
    if os.path.splitext(path)[1].lower() not in SUFFIXES:
        raise DataError(f"{path}: unknown data file type; expected one of {', '.join(SUFFIXES)}")
    return [path]


def _table(path: str, columns: Sequence[str]) -> Any:
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.json as pjson
    import pyarrow.parquet as pq

    kind = SUFFIXES[os.path.splitext(path)[1].lower()]
    try:
        if kind == "json":
            table = pjson.read_json(path, read_options=pjson.ReadOptions(block_size=1 << 24))
        elif kind == "csv":
            table = pcsv.read_csv(  # one thread: then pyarrow names the row of a malformed line
                path,
                read_options=pcsv.ReadOptions(use_threads=False),
                convert_options=pcsv.ConvertOptions(strings_can_be_null=False),
            )
        else:
            table = pq.read_table(path)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read it as {kind}: {exc}"[:500]) from None
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise DataError(f"{path}: no column {missing[0]!r} (columns: {', '.join(table.column_names[:20])})")
    return table


def _column(path: str, table: Any, name: str, *, numbers: bool) -> Iterator[str | None]:
    """Each row's value as text, decoded strictly: bad UTF-8 or a value of the wrong type names its row."""
    import pyarrow as pa

    col = table.column(name)
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        raw = col.cast(pa.large_binary())
    elif numbers and (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
        yield from (None if v is None else _number(v) for v in col.to_pylist())
        return
    elif pa.types.is_null(col.type):
        yield from (None for _ in range(len(col)))
        return
    else:
        raise DataError(f"{path}: column {name!r} holds {col.type}, expected text")
    for row, value in enumerate(raw.to_pylist()):
        if value is None:
            yield None
            continue
        try:
            yield value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(f"{path}: row {row}: column {name!r} is not valid UTF-8 ({exc.reason})") from None


def _number(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(v)


def read_records(
    path: str,
    *,
    data_format: str | None = None,
    prompt_field: str | None = None,
    answer_field: str | None = None,
) -> list[Record]:
    """Every row of the data set at ``path`` as a record; the first bad row is a DataError."""
    preset = PRESETS.get(data_format or "")
    if data_format is not None and preset is None:
        raise DataError(f"data format {data_format!r}; known: {', '.join(PRESETS)}")
    prompt_col = prompt_field or (preset.prompt_field if preset else None)
    answer_col = answer_field or (preset.answer_field if preset else None)
    if not prompt_col or not answer_col:
        raise DataError("name the prompt and answer columns (--prompt-field, --answer-field) or a --data-format")
    gold = preset.gold if preset else _as_is
    out: list[Record] = []
    for path_ in data_files(path):
        table = _table(path_, (prompt_col, answer_col))
        prompts = _column(path_, table, prompt_col, numbers=False)
        answers = _column(path_, table, answer_col, numbers=True)
        for row, (prompt, answer) in enumerate(zip(prompts, answers, strict=True)):
            where = f"{path_}: row {row}"
            if prompt is None or not prompt.strip():
                raise DataError(f"{where}: empty prompt in column {prompt_col!r}")
            if answer is None:
                raise DataError(f"{where}: no answer in column {answer_col!r}")
            if len(prompt) > MAX_FIELD_CHARS or len(answer) > MAX_FIELD_CHARS:
                raise DataError(f"{where}: a field is over {MAX_FIELD_CHARS} characters")
            found = gold(answer)
            if found is None:
                how = {"gsm8k": "'#### N'", "math": "a \\boxed{}"}.get(data_format or "", "a non-empty answer")
                raise DataError(f"{where}: column {answer_col!r} has no gold answer ({how} expected)")
            out.append(Record(path_, row, prompt, found))
    if not out:
        raise DataError(f"{path}: the data set has no rows")
    return out


def fingerprint(records: Sequence[Record]) -> str:
    """Identifies the data set's content and order (a resumed run must train on the same one)."""
    h = hashlib.sha256()
    for r in records:
        h.update(b"%d\0%d\0" % (len(r.prompt), len(r.answer)))
        h.update(r.prompt.encode())
        h.update(r.answer.encode())
    return h.hexdigest()[:32]


class PromptPool:
    """The prompts of a data set, tokenized once, in the order a run's steps take them."""

    def __init__(
        self,
        records: Sequence[Record],
        encode: Callable[[str], list[int]],
        *,
        max_prompt_tokens: int,
        seed: int,
    ) -> None:
        self.fingerprint = fingerprint(records)
        self.seed = seed
        kept: list[Prompt] = []
        self.skipped = 0
        """Prompts dropped for being longer than ``max_prompt_tokens``."""
        for i, r in enumerate(records):
            ids = encode(r.prompt)
            if len(ids) > max_prompt_tokens:
                self.skipped += 1
                continue
            kept.append(Prompt(f"d{i}", r.prompt, r.answer, tuple(ids)))
        if not kept:
            raise DataError(f"every one of {len(records)} prompts is longer than {max_prompt_tokens} tokens")
        self.prompts = kept
        self._orders: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        order = self._orders.get(epoch)
        if order is None:
            order = list(range(len(self.prompts)))
            random.Random(f"aurora-data:{self.seed}:{epoch}").shuffle(order)
            self._orders = {epoch: order}  # one epoch's order is held at a time
        return order

    def for_step(self, step: int, n: int) -> list[Prompt]:
        """Step ``step``'s ``n`` prompts (steps count from 1), ids unique per epoch."""
        out = []
        for pos in range((step - 1) * n, step * n):
            epoch, i = divmod(pos, len(self.prompts))
            p = self.prompts[self._order(epoch)[i]]
            out.append(Prompt(f"{p.id}e{epoch}", p.text, p.answer, p.ids))
        return out

    def position(self, step: int, n: int) -> dict[str, int | str]:
        """Where the run is in the data after ``step`` steps of ``n`` prompts, for the trainer state."""
        epoch, index = divmod(step * n, len(self.prompts))
        return {"epoch": epoch, "index": index, "prompts": len(self.prompts), "fingerprint": self.fingerprint}
