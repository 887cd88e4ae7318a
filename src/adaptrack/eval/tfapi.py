"""TensorFlow's public API names, read from the generated modules of a ``tensorflow-cpu`` wheel.

TensorFlow generates its public namespaces: ``tensorflow/__init__.py`` (the ``tf`` module)
and ``tensorflow/_api/v2/**/__init__.py`` consist of lines such as

    from tensorflow.python.ops.math_ops import reduce_sum # line: 2146
    from tensorflow.python.ops.gen_math_ops import floor_mod as floormod
    from tensorflow._api.v2 import math

The name a line binds (``Z`` in ``from X import Y as Z``, else ``Y``) is public unless it
starts with an underscore; a line that imports a generated module (``from
tensorflow._api.v2 import math``, or ``from . import sub``) makes a submodule, whose names
are listed below it (``math.reduce_sum``). Names come back without the ``tf.`` prefix.

What the list holds (decisions):

* everything public, ``compat.v1.*`` and ``compat.v2.*`` included (``compat.v1.placeholder``
  is how TF 1 code spells ``tf.placeholder`` in TF 2; a later filter picks the paper's TFv1
  APIs from them);
* each generated module is listed once, under its shortest path (breadth first):
  TensorFlow also generates nested copies (``compat.v1.compat.v1``, ``compat.v2.compat.v1``,
  …) that import the same submodules again, so ``compat.v1.compat.v1.math`` is listed as a
  name but its contents only as ``compat.v1.math.*`` (the copies' own top-level names,
  such as ``compat.v1.compat.v1.placeholder``, are listed);
* not ``__internal__``, ``__operators__`` or ``__version__`` (leading underscore), and
  nothing under them;
* not Keras: ``tf.keras``, ``tf.losses``, ``tf.metrics``, ``tf.optimizers`` and
  ``tf.initializers`` are attached at import time from the separate ``keras`` package
  (``setattr`` calls, no import lines), so they are not in the wheel's API modules.
  ``compat.v1.losses`` and ``compat.v1.metrics`` are generated, so they are listed; the
  Keras-backed ``compat.v1.layers.*`` (``dense``, ``conv2d``, …; only ``InputSpec`` is
  generated) are filled in from Keras at import time and are not.

:func:`tensorflow_api_names` reads the list shipped in ``adaptrack/eval/data`` (built by
:func:`tensorflow_api` from ``tensorflow-cpu==2.16.1``); other versions are built on
first use (one ``pip download`` of the ~200 MB wheel into the cache directory).
"""

from __future__ import annotations

import ast
import sys
import zipfile
from collections import deque
from importlib import resources
from pathlib import Path

from ..errors import AdaptrackError
from ..lm.default import cache_dir
from .wheels import cached_wheel

DEFAULT_VERSION = "2.16.1"
_ROOT_MODULE = "tensorflow"
_API_PREFIX = "tensorflow/_api/"


class TensorflowApiError(AdaptrackError):
    """The TensorFlow wheel could not be downloaded or holds no generated API modules."""


def wheel_path(version: str = DEFAULT_VERSION, download: bool = True) -> Path:
    """The cached ``tensorflow-cpu==version`` wheel (CPython 3.11, manylinux x86-64),
    downloaded with ``pip download`` into ``cache_dir() / "wheels"`` on first use."""
    # The platform is fixed so that the same wheel comes down on any host; the API modules
    # are the same on every platform.
    return cached_wheel(f"tensorflow-cpu=={version}", f"tensorflow_cpu-{version}-*.whl",
                        size="about 200 MB", error=TensorflowApiError, download=download,
                        pip_args=("--python-version", "3.11", "--platform",
                                  "manylinux2014_x86_64"))


def api_from_wheel(path: str | Path) -> list[str]:
    """The sorted public dotted names (without ``tf.``) of a TensorFlow wheel's API modules.

    >>> import io, zipfile
    >>> buf = io.BytesIO()
    >>> with zipfile.ZipFile(buf, "w") as z:
    ...     z.writestr("tensorflow/__init__.py", "from tensorflow._api.v2 import math\\n"
    ...                "from tensorflow.python.ops.math_ops import add # line: 3\\n"
    ...                "from tensorflow._api.v2 import __internal__\\n")
    ...     z.writestr("tensorflow/_api/v2/math/__init__.py",
    ...                "import sys as _sys\\nfrom tensorflow.python.ops import x as reduce_sum\\n")
    ...     z.writestr("tensorflow/_api/v2/__internal__/__init__.py", "from a import b\\n")
    >>> api_from_wheel(buf)
    ['add', 'math', 'math.reduce_sum']
    """
    try:
        with zipfile.ZipFile(path) as whl:
            sources = {
                _module_of(m): whl.read(m).decode("utf-8")
                for m in whl.namelist()
                if (m.startswith(_API_PREFIX) and m.endswith("/__init__.py"))
                or m == f"{_ROOT_MODULE}/__init__.py"
            }
    except (OSError, zipfile.BadZipFile) as err:
        raise TensorflowApiError(f"cannot read the TensorFlow wheel {path}: {err}") from None
    if _ROOT_MODULE not in sources or len(sources) < 2:
        raise TensorflowApiError(
            f"{path} holds no generated API modules (tensorflow/__init__.py and "
            f"{_API_PREFIX}**/__init__.py); is it a TensorFlow 2 wheel?"
        )
    bindings = {mod: _bindings(mod, src, sources) for mod, src in sources.items()}
    names: set[str] = set()
    # Breadth first, so each generated module is entered once, under its shortest path;
    # other paths to it (TensorFlow's nested copies such as ``compat.v1.compat.v1.math``,
    # import cycles) list the name but not its contents again.
    entered = {_ROOT_MODULE}
    queue: deque[tuple[str, str]] = deque([(_ROOT_MODULE, "")])
    while queue:
        mod, rel = queue.popleft()
        for name, sub in sorted(bindings[mod]):
            full = f"{rel}.{name}" if rel else name
            names.add(full)
            if sub is not None and sub not in entered:
                entered.add(sub)
                queue.append((sub, full))
    return sorted(names)


def _module_of(member: str) -> str:
    """``tensorflow/_api/v2/math/__init__.py`` → ``tensorflow._api.v2.math``."""
    return member.removesuffix("/__init__.py").replace("/", ".")


def _bindings(module: str, source: str, modules: dict[str, str]) -> list[tuple[str, str | None]]:
    """(public name, generated submodule it is or None) for the top-level import lines."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        raise TensorflowApiError(f"cannot parse the generated module {module}: {err}") from None
    out: list[tuple[str, str | None]] = []
    for node in tree.body:
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:  # from . import sub: relative to this package
            base = ".".join(module.split(".")[: len(module.split(".")) - node.level + 1])
            source_mod = f"{base}.{node.module}" if node.module else base
        else:
            source_mod = node.module or ""
        for alias in node.names:
            bound = alias.asname or alias.name
            if bound == "*" or bound.startswith("_") or not bound.isidentifier():
                continue
            candidate = f"{source_mod}.{alias.name}"
            out.append((bound, candidate if candidate in modules else None))
    return out


def tensorflow_api(version: str = DEFAULT_VERSION) -> list[str]:
    """Every public dotted name of TensorFlow ``version``'s ``tf`` namespace, sorted,
    without the ``tf.`` prefix (``"math.reduce_sum"``, ``"compat.v1.placeholder"``).

    Downloads the ``tensorflow-cpu`` wheel once into the cache directory (see
    :func:`wheel_path`); raises :class:`TensorflowApiError` with pip's output when that
    fails. The module docstring says which names are in the list.
    """
    return api_from_wheel(wheel_path(version))


def data_file(version: str = DEFAULT_VERSION) -> Path:
    """Where the shipped list for ``version`` lives inside the package (may not exist)."""
    return Path(str(resources.files("adaptrack.eval") / "data" / f"tf-{version}-api.txt"))


def tensorflow_api_names(version: str = DEFAULT_VERSION) -> list[str]:
    """The public TensorFlow API names of ``version`` (see :func:`tensorflow_api`).

    Reads the list shipped with adaptrack for 2.16.1; other versions are built from the
    wheel on first use and kept in the cache directory.

    >>> names = tensorflow_api_names()
    >>> "math.reduce_sum" in names, "compat.v1.placeholder" in names, "keras" in names
    (True, True, False)
    """
    for path in (data_file(version), cache_dir() / "api" / f"tf-{version}-api.txt"):
        if path.is_file():
            return path.read_text(encoding="utf-8").split()
    names = tensorflow_api(version)
    write_names(names, cache_dir() / "api" / f"tf-{version}-api.txt")
    return names


def write_names(names: list[str], path: Path) -> None:
    """Write one name a line (atomically, so a reader never sees half a list)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(n + "\n" for n in names), encoding="utf-8")
    tmp.replace(path)


if __name__ == "__main__":  # python -m adaptrack.eval.tfapi [VERSION]: rebuild a shipped list
    ver = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_VERSION
    out = data_file(ver)
    api = tensorflow_api(ver)
    write_names(api, out)
    print(f"{len(api)} names -> {out} ({out.stat().st_size} bytes)")
