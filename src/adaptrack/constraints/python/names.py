"""Names in generated Python: module chains that must exist, and names nothing binds
(see :func:`adaptrack.constraints.python.python`)."""

from __future__ import annotations

import builtins
import importlib
import re
import symtable
import sys
from collections.abc import Iterable
from types import ModuleType

from ...cache import LRU
from .syntax import SCAN, open_end

_IMPORT = re.compile(r"^[ \t]*import[ \t]+([\w. \t,]+?)[ \t]*(?:;|#|$)", re.MULTILINE)
_FROM = re.compile(r"^[ \t]*from[ \t]+([\w.]+)[ \t]+import[ \t]+\(?([\w \t,]+?)\)?[ \t]*(?:;|#|$)",
                   re.MULTILINE)
_MODULE_NAMES = frozenset({"__name__", "__file__", "__doc__", "__builtins__", "__spec__",
                           "__loader__", "__package__", "__annotations__", "__path__"})
_BUILTINS = frozenset(dir(builtins)) | _MODULE_NAMES
#: Standard modules whose import does something (opens a browser, prints, starts a GUI):
#: left out of the default allowlist even when the prefix imports them.
_SIDE_EFFECTS = frozenset({"antigravity", "this", "__hello__", "__phello__", "idlelib",
                           "tkinter", "turtle", "turtledemo", "__main__"})



class Names:
    """Module chains and undefined names (see :func:`python`)."""

    def __init__(self, prefix: str, modules: Iterable[str] | None) -> None:
        prefix_imports = _imports(_code_only(prefix))
        if modules is None:
            allowed = set(sys.stdlib_module_names)
            allowed |= {m.split(".")[0] for m, _ in prefix_imports.values()}
            allowed -= _SIDE_EFFECTS
        else:
            allowed = {m.split(".")[0] for m in modules}
        self.allowed = frozenset(allowed)
        self.prefix_aliases = prefix_imports
        self.scan_from = open_end(prefix)
        self._modules: LRU[str, ModuleType | None] = LRU(limit=1024)

    def __getstate__(self) -> dict[str, object]:
        # Modules do not pickle; a copy in a worker process imports them again.
        return {**self.__dict__, "_modules": LRU(limit=1024)}

    def module(self, name: str) -> ModuleType | None:
        """The module ``name`` if its top-level package is allowlisted and imports, else None.

        Importing runs the module's code, hence the allowlist."""
        if name in self._modules:
            return self._modules.get(name)
        found = None
        if name.split(".")[0] in self.allowed:
            try:
                found = importlib.import_module(name)
            except Exception:  # a module that fails to import is unchecked
                found = None
        self._modules.put(name, found)
        return found

    def _root(self, alias: tuple[str, str | None]) -> object | None:
        mod = self.module(alias[0])
        if mod is None or alias[1] is None:
            return mod
        sub = getattr(mod, alias[1], None)
        if isinstance(sub, ModuleType):
            return sub
        return self.module(f"{alias[0]}.{alias[1]}")

    def chains_ok(self, code: str, final: bool) -> bool:
        """Whether every module chain in the generated part of ``code`` exists; the one
        ending the text may end in an unfinished name unless ``final``."""
        aliases = self.prefix_aliases
        generated = code[self.scan_from:]
        if "import" in generated:
            aliases = {**aliases, **_imports(_code_only(generated), complete_lines=not final)}
        if not aliases:
            return True
        for m in SCAN.finditer(code, self.scan_from):
            chain = m.group("chain")
            if not chain or "." not in chain:
                continue
            parts = [p.strip() for p in chain.split(".")]
            alias = aliases.get(parts[0])
            if alias is None:
                continue
            obj = self._root(alias)
            at_end = m.end() == len(code)
            for k, part in enumerate(parts[1:], start=1):
                if not isinstance(obj, ModuleType):
                    break
                last = k == len(parts) - 1
                if last and at_end and not final:
                    if not any(n.startswith(part) for n in dir(obj)) and not hasattr(obj, part):
                        return False
                    break
                try:
                    obj = getattr(obj, part)
                except AttributeError:
                    obj = self.module(f"{obj.__name__}.{part}")
                    if obj is None:
                        return False
                except Exception:  # a lazy attribute that fails: unchecked
                    break
        return True

    def undefined(self, code: str, functions: bool) -> bool:
        """Whether ``code`` (a complete program) reads a name nothing binds: at module level
        only, or in functions and classes too."""
        if re.search(r"^[ \t]*from[ \t]+[\w.]+[ \t]+import[ \t]+\*", code, re.MULTILINE):
            return False
        try:
            top = symtable.symtable(code, "<python>", "exec")
        except (SyntaxError, ValueError):
            return False
        bound = {s.get_name() for s in top.get_symbols()
                 if s.is_assigned() or s.is_imported() or s.is_namespace()
                 or s.is_parameter()}
        tables = [top]
        for table in tables:
            tables.extend(table.get_children())
            if table is top:
                continue
            bound |= {s.get_name() for s in table.get_symbols()
                      if s.is_declared_global() and s.is_assigned()}
        for table in tables if functions else [top]:
            for s in table.get_symbols():
                name = s.get_name()
                if (s.is_referenced() and (table is top or s.is_global())
                        and name not in bound and name not in _BUILTINS):
                    return True
        return False


def _code_only(text: str) -> str:
    """``text`` with strings and comments blanked (lengths kept), for the import scan."""
    return SCAN.sub(lambda m: " " * len(m.group()) if m.group("skip") else m.group(), text)


def _imports(code: str, complete_lines: bool = False) -> dict[str, tuple[str, str | None]]:
    """``alias -> (module, attribute or None)`` for the imports in ``code``; with
    ``complete_lines``, only lines that end with a newline."""
    if complete_lines:
        code = code[: code.rfind("\n") + 1]
    found: dict[str, tuple[str, str | None]] = {}
    for m in _IMPORT.finditer(code):
        for item in m.group(1).split(","):
            words = item.split()
            if len(words) == 3 and words[1] == "as":
                found[words[2]] = (words[0], None)
            elif len(words) == 1:
                found[words[0].split(".")[0]] = (words[0].split(".")[0], None)
    for m in _FROM.finditer(code):
        for item in m.group(2).split(","):
            words = item.split()
            if len(words) == 3 and words[1] == "as":
                found[words[2]] = (m.group(1), words[0])
            elif len(words) == 1:
                found[words[0]] = (m.group(1), words[0])
    return found
