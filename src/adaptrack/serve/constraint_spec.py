"""One description of a constraint for the edges that read one from their users: the
server's ``guided_*`` and ``response_format`` fields and the command line's ``--choices``,
``--api-names``, ``--regex``, ``--json-schema``, ``--lark`` and ``--gbnf`` both make a
:class:`ConstraintSpec`, which builds the constraint (:mod:`adaptrack.constraints`) and
says what identifies it (the server's tree cache keys on it). Plain data: neither pydantic
nor argparse.

>>> spec = ConstraintSpec.grammar('root ::= "yes" | "no"')
>>> spec.kind, spec.key[0]
('gbnf', 'gbnf')
>>> ConstraintSpec("choice", ("yes", "no")).build().strings
[b'no', b'yes']
"""

from __future__ import annotations

import json
import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import constraints
from ..constraints.base import Constraint

#: The kinds of constraint a spec describes (each a builder of :mod:`adaptrack.constraints`).
KINDS = ("choice", "api_names", "regex", "json_schema", "lark", "gbnf")
#: A GBNF rule line (``name ::= ...``); Lark writes ``name: ...`` and never ``::=``.
GBNF_RULE = re.compile(r"(?m)^\s*[A-Za-z_][A-Za-z0-9_-]*\s*::=")


@dataclass(frozen=True)
class ConstraintSpec:
    """A constraint as its users give it: ``kind`` (one of :data:`KINDS`) and ``source``
    (the strings of a choice or of API names, else the pattern, schema or grammar text);
    ``terminators`` end a choice's strings (characters kept in the text)."""

    kind: str
    source: str | tuple[str, ...]
    terminators: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        strings = self.kind in ("choice", "api_names")
        if strings != isinstance(self.source, tuple):
            raise TypeError(f"a {self.kind} spec takes "
                            f"{'a tuple of strings' if strings else 'a string'}, got "
                            f"{type(self.source).__name__}")
        if self.terminators is not None and self.kind != "choice":
            raise ValueError(f"terminators apply to a choice, not to {self.kind}")

    @classmethod
    def json(cls, schema: Any) -> ConstraintSpec:
        """A JSON schema given as an object (or as its JSON text)."""
        return cls("json_schema", schema if isinstance(schema, str) else json.dumps(schema))

    @classmethod
    def grammar(cls, text: str) -> ConstraintSpec:
        """A grammar: GBNF when a line defines a rule with ``::=``, else Lark."""
        return cls("gbnf" if GBNF_RULE.search(text) else "lark", text)

    @classmethod
    def strings(cls, kind: str, items: Sequence[str],
                terminators: str | None = None) -> ConstraintSpec:
        """A choice or API names from a list of strings."""
        return cls(kind, tuple(items), terminators)

    @property
    def key(self) -> Hashable:
        """What identifies the constraint: equal keys build the same constraint."""
        return (self.kind, self.source, self.terminators)

    def build(self) -> Constraint:
        """The constraint (``GrammarError``, ``ValueError`` or ``TypeError`` when the source
        is not one)."""
        if isinstance(self.source, tuple):
            if self.kind == "choice":
                return constraints.choice(list(self.source), terminators=self.terminators)
            return constraints.api_names(list(self.source))
        build = {"regex": constraints.regex, "json_schema": constraints.json_schema,
                 "lark": constraints.lark, "gbnf": constraints.gbnf}[self.kind]
        return build(self.source)
