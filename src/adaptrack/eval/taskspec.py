"""A task's declaration (docs/design.md §4, ``eval/``): its options, which make the flags
of ``adaptrack eval NAME``; how it is built from them; the fields of its header and the
check of its records, which the runner applies when it reads a results file; and its
report section. The registry (:mod:`~adaptrack.eval.registry`) lists the declarations, so
adding a task is one module and one registry line.

A flag that is a sampling option (``-n``, ``--temperature``, ``--max-new-tokens``, ...) is
a :class:`Sampling`: ``generate``'s flag, declared once with the field of
:class:`~adaptrack.options.SamplingOptions`, with the task's default and a note. A flag of
the task's own is an :class:`Option`, which names its parser by a word of
:data:`~adaptrack.flags.PARSED` (the command line's checks of numbers live with the
command line) or gives one of its own; ``names`` makes a comma-separated list of names
among those given.

>>> size = Option(("--size",), type="count", default=3, help="how many")
>>> size.dest, size.value({"size": 5})
('size', ('size', 5))
>>> n = Sampling("n", 20, note="per problem")
>>> n.flags, n.help, n.value({"n": 4})
(('-n',), 'number of samples (default: 20); per problem', ('n', 4))
>>> spec = TaskSpec("toy", "a toy", "A toy task.", (size,), task=dict,
...                 report=lambda header, records, plots: "# toy")
>>> spec.build({"size": 5})
{'size': 5}
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..flags import PARSED, Flag
from ..generate import METHODS
from ..lm.load import BACKENDS, DEVICES, DTYPES
from ..options import option_flags
from .checks import Check
from .jobs import Record, Task

__all__ = ["Option", "Report", "Sampling", "TaskOption", "TaskSpec", "loading_options",
           "methods_option", "model_options"]

#: A :class:`Sampling`'s default until it is read from the field.
_FIELD: Any = object()

#: A report section: (header, records, plots directory or None) -> markdown.
Report = Callable[[dict[str, Any], list[Record], Any], str]


@dataclass(frozen=True)
class Option:
    """One option of a task: a flag of ``adaptrack eval NAME`` and a keyword of the task.

    ``type``: a word of :data:`~adaptrack.flags.PARSED` or a function of the text (raising
    ``argparse.ArgumentTypeError`` or ``ValueError``); ``names``: the value is a
    comma-separated list of these names, read when a value is parsed (the method
    registry's view takes in a method registered later); ``flag``: a switch
    (``store_true``).
    ``keyword``: the task's keyword (default: the option's ``dest``); ``convert`` maps
    the parsed value to it (a unit, a negation, a file read).
    """

    flags: tuple[str, ...]
    help: str | None = None
    type: str | Callable[[str], Any] | None = None
    default: Any = None
    metavar: str | None = None
    choices: Sequence[Any] | None = None
    names: Collection[str] | None = None
    required: bool = False
    flag: bool = False
    keyword: str | None = None
    convert: Callable[[Any], Any] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.type, str) and self.type not in PARSED:
            raise ValueError(f"option {self.flags[0]}: type {self.type!r} is not one of "
                             f"{', '.join(PARSED)}")

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
class Sampling:
    """A task's flag that is the sampling option ``name`` (a field of
    :class:`~adaptrack.options.SamplingOptions`): ``generate``'s flag, its spelling, parser
    and help (:class:`~adaptrack.flags.Flag`), with the task's ``default`` (the field's
    unless given) and a ``note`` on what the value is to the task, in place of
    ``generate``'s. The task's keyword is ``name``; a ``ValueError`` for a name that is no
    field, or a default that the flag's help cannot show.

    >>> top_p = Sampling("top_p", 0.95)
    >>> top_p.flags, top_p.dest, top_p.default, top_p.help
    (('--top-p',), 'top_p', 0.95, 'nucleus sampling mass in (0, 1] (default: 0.95)')
    """

    name: str
    default: Any = _FIELD
    note: str = ""

    def __post_init__(self) -> None:
        declared = {name: (flag, default) for name, flag, default in option_flags()}
        if self.name not in declared:
            raise ValueError(f"{self.name!r} is not a sampling option; the flags of the "
                             "others are task options (Option)")
        flag, default = declared[self.name]
        if self.default is _FIELD:
            object.__setattr__(self, "default", default)  # the field's, once it is known
        elif self.default != default and "{default" not in flag.help:
            raise ValueError(f"the help of {flag.name} cannot show the default "
                             f"{self.default!r}: write it as {{default}} there")

    @property
    def flag(self) -> Flag:
        """The option's flag, as ``generate`` has it."""
        return next(f for name, f, _ in option_flags() if name == self.name)

    @property
    def flags(self) -> tuple[str, ...]:
        return (self.flag.name,)

    @property
    def dest(self) -> str:
        return self.name

    @property
    def help(self) -> str:
        """The flag's help with the task's default and note."""
        return self.flag.describe(self.default, self.note)

    def value(self, values: Mapping[str, Any]) -> tuple[str, Any]:
        """The task's keyword and value from the parsed ``values`` (a choice's ``none``:
        None, as for ``generate``)."""
        got = values[self.name]
        return self.name, None if self.flag.reads == "choice" and got == "none" else got


#: A task's flag: a sampling option's or one of the task's own.
TaskOption = Option | Sampling


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
    options: tuple[TaskOption, ...]
    task: Callable[..., Task]
    report: Report
    model_options: tuple[TaskOption, ...] = ()
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


#: What a task that samples at a temperature says of it (its checks refuse 0).
SAMPLES_NEED = "the samples need > 0"


def model_options(backend: str = "auto", dtype: bool = True,
                  temperature: str | None = SAMPLES_NEED) -> tuple[TaskOption, ...]:
    """The options of a task that samples from a model (:class:`~adaptrack.eval.modeltask.
    ModelTask`): the model, its backend (default ``backend``), device, weight precision
    (unless ``dtype`` is False: a study that needs float32), one sampling temperature, its
    help ending with the note ``temperature`` (None: the task declares its own), and the
    seed of the run.

    >>> [o.dest for o in model_options(backend="transformers", dtype=False)]
    ['model', 'backend', 'device', 'temperature', 'seed']
    """
    out: list[TaskOption] = list(loading_options(
        backend, backend_help=_BACKEND_HELP, dtype=dtype,
        dtype_note="; a value other than auto is in the results header"))
    if temperature is not None:  # 0 passes here and the task refuses it, saying why
        out.append(Sampling("temperature", note=temperature))
    out.append(Sampling("seed", 0,
                        note="each job's own seed is made from it and the job's identity"))
    return tuple(out)


def methods_option(default: Sequence[str], inside: str = "", after: str = "") -> Option:
    """``--methods``: comma-separated methods of ``generate`` (those registered when a value
    is parsed), ``default`` unless given; the help says more ``inside`` its bracket and
    ``after`` it."""
    return Option(("--methods",), names=METHODS.keys(), metavar="M,M",
                  default=",".join(default),
                  help=f"comma-separated methods (default: {','.join(default)}{inside})"
                       f"{after}")
