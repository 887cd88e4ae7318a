"""How a sampling option is spelled on the command line (docs/design.md §4): each field of
:class:`~adaptrack.options.SamplingOptions` declares its :class:`Flag` in its metadata, and
``adaptrack.cli.common`` makes the argparse flags of ``generate`` and of the evaluation
tasks from them.

>>> Flag("-n", "count", "number of samples (default: {default})").describe(1)
'number of samples (default: 1)'
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

__all__ = ["NONE_SPELLING", "PARSED", "Flag", "flag"]

#: The words of :attr:`Flag.reads` that name a parser of the text (``adaptrack.cli.common.
#: PARSERS``), as an evaluation task's own flags do; the others are choice, switch, negated.
PARSED = ("count", "natural", "non_negative", "positive", "probability", "fraction", "limit",
          "walks")

#: How a flag's help spells a default of None, by what the flag reads (else ``none``).
NONE_SPELLING = {"choice": "none", "limit": "inf", "walks": "auto"}


@dataclass(frozen=True)
class Flag:
    """How an option is spelled on the command line; ``adaptrack.cli.common`` makes the
    argparse flag from it, for ``generate`` and for the evaluation tasks' flags that are
    sampling options. ``reads`` says what the flag takes: ``"count"`` (an int >= 1),
    ``"natural"`` (an int >= 0), ``"non_negative"`` (a finite number >= 0), ``"positive"``
    (a finite number > 0), ``"probability"`` (in (0, 1]), ``"fraction"`` (in [0, 1]),
    ``"limit"`` (a budget: > 0, ``inf`` for None), ``"choice"`` (one of ``choices``, read
    when a parser is made; ``"none"`` stands for None), ``"walks"`` (``auto``, ``on``,
    ``off`` or a count), ``"switch"`` (present: True) or ``"negated"`` (present: False).
    ``help`` writes the default as ``{default}`` (a format spec applies to a number), so a
    task with a default of its own shows it; ``note`` ends ``generate``'s help (what the
    command does with the value), where a task says what the value is to it instead."""

    name: str
    reads: str
    help: str
    metavar: str | None = None
    choices: Collection[str] = ()
    note: str = ""

    def describe(self, default: Any, note: str | None = None) -> str:
        """The help of this flag with ``default``, then ``note`` (None: :attr:`note`).

        >>> flag = Flag("--max-seconds", "limit", "budget (default: {default:g})", note="x")
        >>> flag.describe(600.0), flag.describe(None, "past it, a miss")
        ('budget (default: 600); x', 'budget (default: inf); past it, a miss')
        """
        text = self.help.format(default=_Default(default, self.reads))
        note = self.note if note is None else note
        return f"{text}; {note}" if note else text


class _Default:
    """A default in a flag's help, spelled as the flag reads it."""

    def __init__(self, value: Any, reads: str) -> None:
        self.value, self.reads = value, reads

    def __format__(self, spec: str) -> str:
        if self.value is None:
            return NONE_SPELLING.get(self.reads, "none")
        return format(self.value, spec)


def flag(name: str, reads: str, help: str, *, metavar: str | None = None,
         choices: Collection[str] = (), note: str = "") -> dict[str, Flag]:
    """A dataclass field's metadata that declares its :class:`Flag`."""
    return {"flag": Flag(name, reads, help, metavar, choices, note)}
