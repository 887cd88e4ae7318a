"""A task's declaration (docs/design.md §4, ``eval/``): its options, which make the flags
of ``adaptrack eval NAME``; how it is built from them; the fields of its header and the
check of its records, which the runner applies when it reads a results file; and its
report section. The registry (:mod:`~adaptrack.eval.registry`) lists the declarations, so
adding a task is one module and one registry line.

An :class:`Option` names its parser by a word of :data:`TYPES` (the command line's checks
of numbers live with the command line) or gives one of its own; ``names`` makes a
comma-separated list of names among those given.

>>> size = Option(("--size",), type="positive_int", default=3, help="how many")
>>> size.dest, size.value({"size": 5})
('size', ('size', 5))
>>> spec = TaskSpec("toy", "a toy", "A toy task.", (size,), task=dict,
...                 report=lambda header, records, plots: "# toy")
>>> spec.build({"size": 5})
{'size': 5}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..generate import METHODS
from ..lm.load import BACKENDS, DEVICES, DTYPES
from .checks import Check
from .jobs import Record, Task

__all__ = ["TYPES", "Option", "Report", "TaskSpec", "loading_options", "methods_option",
           "model_options"]

#: The parsers an option may name (``adaptrack.cli.common``'s argument types).
TYPES = ("positive_int", "non_negative_int", "non_negative_float", "positive_float",
         "probability", "seconds")

#: A report section: (header, records, plots directory or None) -> markdown.
Report = Callable[[dict[str, Any], list[Record], Any], str]


@dataclass(frozen=True)
class Option:
    """One option of a task: a flag of ``adaptrack eval NAME`` and a keyword of the task.

    ``type``: a word of :data:`TYPES` or a function of the text (raising
    ``argparse.ArgumentTypeError`` or ``ValueError``); ``names``: the value is a
    comma-separated list of these names; ``flag``: a switch (``store_true``).
    ``keyword``: the task's keyword (default: the option's ``dest``); ``convert`` maps
    the parsed value to it (a unit, a negation, a file read).
    """

    flags: tuple[str, ...]
    help: str | None = None
    type: str | Callable[[str], Any] | None = None
    default: Any = None
    metavar: str | None = None
    choices: Sequence[Any] | None = None
    names: tuple[str, ...] | None = None
    required: bool = False
    flag: bool = False
    keyword: str | None = None
    convert: Callable[[Any], Any] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.type, str) and self.type not in TYPES:
            raise ValueError(f"option {self.flags[0]}: type {self.type!r} is not one of "
                             f"{', '.join(TYPES)}")

    @property
    def dest(self) -> str:
        """The parsed value's name, as argparse makes it (the first long flag)."""
        long = [f for f in self.flags if f.startswith("--")]
        return (long or list(self.flags))[0].lstrip("-").replace("-", "_")

    def value(self, values: Mapping[str, Any]) -> tuple[str, Any]:
        """The task's keyword and value from the parsed ``values``."""
        got = values[self.dest]
        return self.keyword or self.dest, self.convert(got) if self.convert else got


@dataclass(frozen=True)
class TaskSpec:
    """A task's declaration: ``name`` (the subcommand and the header's ``task``), the
    subcommand's ``help`` and ``description``; ``options`` (its own) and
    ``model_options`` (the model's, :func:`model_options`), flags in that order around
    the results file's; ``task`` builds it from the options' keywords; ``header``: the
    header fields' checks; ``record``: what is wrong with a record (None: only its
    ``key`` is checked); ``report``: its section of ``adaptrack report``; ``plots``:
    whether that section draws any."""

    name: str
    help: str
    description: str
    options: tuple[Option, ...]
    task: Callable[..., Task]
    report: Report
    model_options: tuple[Option, ...] = ()
    header: Mapping[str, Check] = field(default_factory=dict)
    record: Callable[[Record], str | None] | None = None
    scores: Callable[[list[Record]], dict[str, Any]] | None = None
    plots: bool = True

    def build(self, values: Mapping[str, Any]) -> Task:
        """The task from the parsed option values (keyed by each option's ``dest``)."""
        return self.task(**dict(o.value(values) for o in (*self.options,
                                                          *self.model_options)))


_BACKEND_HELP = ("model backend (default: auto; transformers for binary, whose KL to an "
                 "enumerated target needs log-probs that do not change between prefix "
                 "trees, which llama.cpp's float16 KV reuse does not give)")


def loading_options(backend: str | None = "auto", *, auto: str | None = "auto",
                    dtype: bool = True, purpose: str = "", backend_help: str | None = None,
                    dtype_note: str = "") -> tuple[Option, ...]:
    """The flags of every command that loads a model (``adaptrack eval``'s tasks,
    ``generate``, ``serve``, ``demo``: ``adaptrack.cli.model``), written once: ``--model``,
    ``--backend`` (default ``backend``), ``--device`` and, with ``dtype``, ``--dtype``
    (default ``auto``: ``"auto"``, or None where a command must tell a flag left out).
    ``purpose`` ends each help line.

    >>> [(o.dest, o.default) for o in loading_options(backend=None, auto=None)]
    [('model', None), ('backend', None), ('device', None), ('dtype', None)]
    """
    out = [Option(("--model",), metavar="SPEC",
                  help=f"a .gguf path, a Hugging Face model id or a local model directory"
                       f"{purpose} (default: the default model, see `adaptrack setup`)"),
           Option(("--backend",), choices=BACKENDS, default=backend,
                  help=backend_help or f"model backend{purpose} (default: auto: llama.cpp "
                                       "for a .gguf when installed)"),
           Option(("--device",), choices=DEVICES, default=auto,
                  help=f"device{purpose} (default: auto: CUDA when available)")]
    if dtype:
        out.append(Option(("--dtype",), choices=DTYPES, default=auto,
                          help=f"weight precision{purpose}, transformers only (default: "
                               "auto: float16 on CUDA, float32 on a CPU; bfloat16 is about "
                               "1.9x faster on CPUs with AVX-512 BF16 and samples a nearby "
                               f"model; float16 is slow on a CPU){dtype_note}"))
    return tuple(out)


def model_options(backend: str = "auto", dtype: bool = True,
                  temperature: bool = True) -> tuple[Option, ...]:
    """The options of a task that samples from a model (:class:`~adaptrack.eval.modeltask.
    ModelTask`): the model, its backend (default ``backend``), device, weight precision
    (unless ``dtype`` is False: a study that needs float32), one sampling temperature
    (unless the task declares its own) and the seed.

    >>> [o.dest for o in model_options(backend="transformers", dtype=False)]
    ['model', 'backend', 'device', 'temperature', 'seed']
    """
    out = list(loading_options(backend, backend_help=_BACKEND_HELP, dtype=dtype,
                               dtype_note="; a value other than auto is in the results "
                                          "header"))
    if temperature:  # 0 passes here and the task refuses it, saying why
        out.append(Option(("--temperature",), type="non_negative_float", default=1.0,
                          metavar="T", help="sampling temperature, > 0 (default: 1.0)"))
    out.append(Option(("--seed",), type="non_negative_int", default=0, metavar="INT",
                      help="random seed, >= 0 (default: 0)"))
    return tuple(out)


def methods_option(default: Sequence[str], inside: str = "", after: str = "") -> Option:
    """``--methods``: comma-separated methods of ``generate``, ``default`` unless given;
    the help says more ``inside`` its bracket and ``after`` it."""
    return Option(("--methods",), names=tuple(METHODS), metavar="M,M",
                  default=",".join(default),
                  help=f"comma-separated methods (default: {','.join(default)}{inside})"
                       f"{after}")
