"""The argument parser every ``aurora`` command uses: no abbreviations, short errors, a did-you-mean.

argparse's defaults surprise on a long-running command: ``--step 10`` is silently taken as
``--steps 10`` (prefix matching), a misspelt flag prints the top-level usage instead of the
subcommand's, and a missing required flag prints the whole usage block (dozens of lines) above the
one line that says what is wrong. :class:`Parser` takes flags only as spelt, prints the error first
and then one line that points to ``--help``, and for a flag it does not know names the closest one it
does.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn


class Parser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` without prefix matching and with short errors; the
    subcommand parsers it makes are of this class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._given: list[str] = []

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._given = [str(a) for a in (sys.argv[1:] if args is None else args)]  # for the hints of an error
        return super().parse_known_args(args, namespace)

    def subcommand(self, name: str | None) -> Parser:
        """The parser of subcommand ``name`` (this one where it has none by that name)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                got = action.choices.get(name) if name is not None else None
                if isinstance(got, Parser):
                    return got
        return self

    def flags(self) -> list[str]:
        """Every option string this parser takes."""
        return [s for action in self._actions for s in action.option_strings]

    def unknown(self, rest: list[str]) -> NoReturn:
        """Refuse arguments this parser does not take."""
        self.error(f"unrecognized arguments: {' '.join(rest)}")

    def hints(self) -> list[str]:
        """For each flag given that this parser does not take, the closest one it does."""
        known, out = set(self.flags()), []
        for arg in self._given:
            flag = arg.split("=", 1)[0]
            if flag.startswith("--") and flag not in known:
                close = difflib.get_close_matches(flag, sorted(known), n=1, cutoff=0.6)
                if close:
                    out.append(f"{flag}: did you mean {close[0]}?")
        return out

    def error(self, message: str) -> NoReturn:
        """The error first, a did-you-mean for each misspelt flag, and where the flags are listed
        (argparse prints the whole usage block above the error)."""
        hints = "".join(f"\n  {h}" for h in self.hints())
        sys.stderr.write(f"{self.prog}: error: {message}{hints}\n(see `{self.prog} --help` for its flags)\n")
        sys.exit(2)
