"""``adaptrack bench ff``: fast-forward tokens on MaskBench, ours
(:func:`adaptrack.sampling.fastforward.forced_tokens`, docs/design.md §2) beside llguidance's
own (``LLMatcher.compute_ff_tokens`` with forcing on, as in llguidance's documentation of
fast-forward tokens), on the same grammar and tokenizer. The command line only parses and
prints; the counts are defined here.

For every valid instance of every schema:

* the instance is written as compact JSON (``json.dumps(separators=(",", ":"),
  ensure_ascii=False)``, ASCII escapes only if it holds lone surrogates) and tokenized
  canonically (``Tokenizer.encode_bytes``);
* the grammar is ``adaptrack.constraints.json_schema(schema)`` with ``"x-guidance":
  {"whitespace_flexible": ...}`` set in the schema (llguidance's default, flexible
  whitespace, accepts compact JSON; ``whitespace_flexible=False`` allows none). llguidance's
  matcher runs the very same Lark text, only with forcing on. Schemas llguidance rejects are
  skipped (``skipped_schemas``); instances whose canonical tokens it does not accept as a
  complete text are too (``rejected_instances``);
* *our walk*: at position ``i`` (the first ``i`` canonical tokens consumed), ``F =
  forced_tokens(...)``. ``F ≠ []`` is one *ff sequence*; it is *non-canonical* when it
  differs from the next ``len(F)`` canonical tokens. A canonical ``F`` is skipped over and
  its tokens count as *forced*; otherwise the walk moves one canonical token on.
  ``forced_share`` = forced tokens / canonical tokens. *llguidance's walk* is the same with
  its ff tokens (``llguidance_*`` counts).
* *agreement*: at the positions of our walk where either side has ff tokens, the share
  where both have the same ones (``agreeing_positions / compared_positions``; 1.0 if none).
* an instance where either side's llguidance matcher fails (its resource limits: a
  ``GrammarError`` from ours) counts in ``failed_instances`` and in no other count, and the
  walk goes on with the next one. ``matcher_restarts`` counts the llguidance matchers ours
  made anew on the way after such a failure, which it then got past (``grammar_restarts``
  of ``GrammarMatcher.stats``).
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..errors import GrammarError
from ..limits import loads


class LLGuidanceFailed(RuntimeError):
    """llguidance's own matcher (the side compared against) failed on an instance it had
    accepted as a whole."""

#: How many recent canonical tokens the walk hands to ``forced_tokens`` (it uses at most
#: ``Tokenizer.context_tokens`` of them).
_RECENT = 8


#: The directive :mod:`adaptrack.constraints.grammar` appends to every grammar so that
#: llguidance returns every valid token rather than one forced token (llguidance's
#: documentation of grammar options); llguidance's side of the comparison runs without it.
NO_FORCING = '%llguidance {"no_forcing": true}'


def with_forcing(lark_text: str) -> str:
    """``lark_text`` without the no-forcing directive, so that llguidance forces tokens.

    >>> with_forcing('start: "a"\\n%llguidance {"no_forcing": true}\\n')
    'start: "a"\\n'
    >>> with_forcing('start: "a"')
    Traceback (most recent call last):
    ValueError: the grammar has no '%llguidance {"no_forcing": true}' line to remove
    """
    lines = lark_text.splitlines(keepends=True)
    kept = [line for line in lines if line.strip() != NO_FORCING]
    if len(kept) == len(lines):
        # Comparing against llguidance with forcing still off would count nothing forced.
        raise ValueError(f"the grammar has no {NO_FORCING!r} line to remove")
    return "".join(kept)


def _maybe_json(value: Any) -> Any:
    """A field that some MaskBench exports store as a JSON string."""
    return loads(value, "a MaskBench field") if isinstance(value, str) else value


def read_maskbench(path: str | os.PathLike[str]) -> Iterator[tuple[Any, list[Any]]]:
    """``(schema, valid instances)`` per line of a MaskBench ``.jsonl`` (gzipped or not).

    The schema may be stored as an object or a JSON string (parsed here); so may the list
    of tests. A test's ``"data"`` is the instance itself (a string is a JSON string
    instance, never parsed)."""
    with open(path, "rb") as raw:
        gz = raw.read(2) == b"\x1f\x8b"
    opener = gzip.open if gz else open
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                case = loads(line, f"line {n}")
                schema = case["schema"]
                if isinstance(schema, str):
                    schema = loads(schema, f"the schema of line {n}")
                tests = _maybe_json(case.get("tests", []))
            except (ValueError, KeyError, TypeError) as err:
                raise ValueError(f"{os.fspath(path)}:{n}: not a MaskBench case: {err}") from None
            yield schema, [t["data"] for t in tests if isinstance(t, dict) and t.get("valid")]


def compact_json(instance: Any) -> bytes:
    """The instance as compact JSON bytes (raw UTF-8; ``\\u`` escapes only where the data
    holds lone surrogates, which UTF-8 cannot carry)."""
    text = json.dumps(instance, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(instance, separators=(",", ":")).encode()


def _with_options(schema: Any, whitespace_flexible: bool) -> dict[str, Any] | None:
    """The schema with our llguidance JSON options; ``None`` for ``false`` (nothing valid)."""
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        return None
    options = schema.get("x-guidance")
    options = dict(options) if isinstance(options, dict) else {}
    options["whitespace_flexible"] = whitespace_flexible
    return {**schema, "x-guidance": options}


def bench_ff(
    data: str | os.PathLike[str],
    tokenizer: str | os.PathLike[str],
    *,
    max_tokens: int = 4,
    conservative: bool = False,
    limit: int | None = None,
    whitespace_flexible: bool = True,
    progress: bool = False,
    examples: int = 5,
) -> dict[str, Any]:
    """Fast-forward tokens on a MaskBench file, ours against llguidance's (see the module
    doc for every definition). ``tokenizer`` is a ``tokenizer.json`` or its directory;
    ``limit`` bounds the valid instances walked; ``examples`` disagreements (and
    non-canonical ff sequences) are kept in ``"examples"``."""
    t_start = time.perf_counter()
    bench = _Bench(tokenizer, max_tokens, conservative, whitespace_flexible, examples)
    cases = list(read_maskbench(data))
    total = sum(len(valid) for _, valid in cases)
    if limit is not None:
        total = min(total, limit)
    bar = _progress_bar(total) if progress else None
    done = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for schema, valid in cases:
            if limit is not None and done >= limit:
                break
            if not valid:
                continue
            instances = valid if limit is None else valid[:limit - done]
            bench.schema(schema, instances, bar)
            done += len(instances)
    if bar is not None:
        bar.close()
    return bench.result(time.perf_counter() - t_start)


def _progress_bar(total: int) -> Any:
    """A tqdm bar over ``total`` instances on stderr (None without tqdm)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="instance", file=sys.stderr, leave=False)


def _llguidance_tokenizer(tokenizer: str | os.PathLike[str], vocab: Any) -> Any:
    """llguidance's own tokenizer from the same file, as ``llguidance.hf.from_tokenizer``
    builds it (the serialized tokenizers backend; padding and truncation off)."""
    from llguidance import LLTokenizer
    from tokenizers import Tokenizer as HFTokenizer

    file = Path(tokenizer)
    backend = HFTokenizer.from_file(str(file / "tokenizer.json" if file.is_dir() else file))
    backend.no_padding()
    backend.no_truncation()
    eos = int(vocab.eos_ids[0]) if len(vocab.eos_ids) else None
    return LLTokenizer(backend.to_str(), n_vocab=vocab.size, eos_token=eos)


#: The counts of :func:`bench_ff` (the module doc defines each).
COUNTS = ("instances", "tokens", "ff_sequences", "forced_tokens", "noncanonical",
          "llguidance_ff_sequences", "llguidance_forced_tokens", "llguidance_noncanonical",
          "compared_positions", "agreeing_positions", "schemas", "skipped_schemas",
          "rejected_instances", "failed_instances", "matcher_restarts")


class _Bench:
    """One :func:`bench_ff` run: the tokenizers, the counts, the examples kept and the
    time each side's ff tokens took."""

    def __init__(self, tokenizer: str | os.PathLike[str], max_tokens: int,
                 conservative: bool, whitespace_flexible: bool, examples: int) -> None:
        from ..tokenization.tokenizer import Tokenizer

        self.tok = Tokenizer.from_file(tokenizer)
        self.vocab = self.tok.vocab
        self.ll_tok = _llguidance_tokenizer(tokenizer, self.vocab)
        self.max_tokens, self.conservative = max_tokens, conservative
        self.whitespace_flexible, self.examples = whitespace_flexible, examples
        self.c: dict[str, Any] = dict.fromkeys(COUNTS, 0)
        self.found: list[dict[str, Any]] = []
        self.ours_s = self.theirs_s = 0.0
        self.ours_calls = self.theirs_calls = 0

    def matcher(self, ll_grammar: str) -> Any:
        """A new llguidance matcher of ``ll_grammar`` (its errors are permanent)."""
        from llguidance import LLMatcher

        return LLMatcher(self.ll_tok, ll_grammar, log_level=0)

    def note(self, kind: str, text: bytes, pos: int, canon: list[int],
             ours: list[int] | None, theirs: list[int] | None, forced: bytes) -> None:
        """Keep an example of ``kind`` at position ``pos`` while fewer than asked are."""
        if len(self.found) >= self.examples:
            return

        def show(ids: list[int] | None) -> list[str] | None:
            return None if ids is None else [self.vocab.decode([t]).decode(errors="replace")
                                             for t in ids]
        width = max(len(ours or ()), len(theirs or ()), 1)
        self.found.append({
            "kind": kind, "instance": self.c["instances"], "position": pos,
            "before": self.vocab.decode(canon[max(0, pos - 3):pos]).decode(errors="replace"),
            "forced_bytes": forced.decode(errors="replace"),
            "canonical": show(canon[pos:pos + width]), "ours": show(ours),
            "llguidance": show(theirs), "text_head": text[:80].decode(errors="replace"),
        })

    def schema(self, schema: Any, instances: list[Any], bar: Any) -> None:
        """Walk ``instances`` of ``schema``, or count the schema skipped where it makes no
        grammar or llguidance refuses it."""
        from ..constraints import json_schema
        from ..constraints.grammar import GrammarMatcher

        self.c["schemas"] += 1
        full = _with_options(schema, self.whitespace_flexible)
        try:
            if full is None:
                raise ValueError("schema false")
            grammar = json_schema(full)
            # Its own compiled grammar: a schema met twice must not time the first's masks.
            matcher = GrammarMatcher(grammar, self.vocab)
            ll_grammar = with_forcing(grammar.lark_text)
            llm = self.matcher(ll_grammar)
            if llm.is_error():
                raise ValueError(llm.get_error())
        except (ValueError, RuntimeError):
            self.c["skipped_schemas"] += 1
            if bar is not None:
                bar.update(len(instances))
            return
        for instance in instances:
            if bar is not None:
                bar.update()
            llm = self.instance(instance, matcher, ll_grammar, llm)

    def instance(self, instance: Any, matcher: Any, ll_grammar: str, llm: Any) -> Any:
        """Count one instance's walks; the llguidance matcher to go on with (a new one
        after a failure)."""
        from ..sampling.fastforward import forced_tokens

        c = self.c
        text = compact_json(instance)
        try:
            canon = self.tok.encode_bytes(text)
        except ValueError:
            c["rejected_instances"] += 1
            return llm
        llm.reset()
        if not (llm.consume_tokens(canon) and llm.is_accepting()):
            c["rejected_instances"] += 1
            return self.matcher(ll_grammar)
        llm.reset()
        restarts = matcher.stats()["grammar_restarts"]
        try:
            stats = _walk(canon, text, self.tok, matcher, llm, forced_tokens, self.max_tokens,
                          self.conservative, self.note)
        except (GrammarError, LLGuidanceFailed):  # either side's resource limits
            c["failed_instances"] += 1
            return self.matcher(ll_grammar)
        finally:
            c["matcher_restarts"] += matcher.stats()["grammar_restarts"] - restarts
        c["instances"] += 1
        c["tokens"] += len(canon)
        for k, v in stats.items():
            if k in c:
                c[k] += v
        self.ours_s += stats["ours_seconds"]
        self.theirs_s += stats["llguidance_seconds"]
        self.ours_calls += stats["ours_calls"]
        self.theirs_calls += stats["llguidance_calls"]
        return llm

    def result(self, seconds: float) -> dict[str, Any]:
        c, tokens = self.c, self.c["tokens"]
        return {
            **c,
            "forced_share": c["forced_tokens"] / tokens if tokens else 0.0,
            "llguidance_forced_share": (c["llguidance_forced_tokens"] / tokens
                                        if tokens else 0.0),
            "llguidance_agreement": (c["agreeing_positions"] / c["compared_positions"]
                                     if c["compared_positions"] else 1.0),
            "ours_ms_per_call": (1e3 * self.ours_s / self.ours_calls
                                 if self.ours_calls else 0.0),
            "llguidance_ms_per_call": (1e3 * self.theirs_s / self.theirs_calls
                                       if self.theirs_calls else 0.0),
            "max_tokens": self.max_tokens,
            "conservative": self.conservative,
            "whitespace_flexible": self.whitespace_flexible,
            "seconds": round(seconds, 2),
            "examples": self.found,
        }


def _walk(canon: list[int], text: bytes, tok: Any, matcher: Any, llm: Any,
          forced_tokens: Callable[..., tuple[list[int], bytes]], max_tokens: int,
          conservative: bool, note: Callable[..., None]) -> dict[str, Any]:
    """Both walks over one instance's canonical tokens (see the module doc).

    Our matcher is a ``GrammarMatcher``, whose states are token tuples: the state after the
    first ``i`` canonical tokens is ``tuple(canon[:i])`` (valid: llguidance accepted the
    whole sequence), which spares a mask per position. llguidance's matcher only moves
    forward; its ff tokens are computed on a copy (forcing pushes bytes into the parser)."""
    n = len(canon)
    s: dict[str, Any] = {k: 0 for k in (
        "ff_sequences", "forced_tokens", "noncanonical", "llguidance_ff_sequences",
        "llguidance_forced_tokens", "llguidance_noncanonical", "compared_positions",
        "agreeing_positions", "ours_calls", "llguidance_calls")}
    s["ours_seconds"] = s["llguidance_seconds"] = 0.0
    at = 0  # tokens llm has consumed
    ours_pos = ll_pos = 0
    while ours_pos < n or ll_pos < n:
        i = min(ours_pos, ll_pos)
        if i > at:
            if not llm.consume_tokens(canon[at:i]):
                raise LLGuidanceFailed(llm.get_error())
            at = i
        t0 = time.perf_counter()
        theirs = llm.deep_copy().compute_ff_tokens()
        s["llguidance_seconds"] += time.perf_counter() - t0
        s["llguidance_calls"] += 1
        if ours_pos == i:
            state = tuple(canon[:i])
            t0 = time.perf_counter()
            ours, _ = forced_tokens(tok, matcher, state, canon[max(0, i - _RECENT):i],
                                    max_tokens=max_tokens, conservative=conservative)
            s["ours_seconds"] += time.perf_counter() - t0
            s["ours_calls"] += 1
            if ours or theirs:
                s["compared_positions"] += 1
                if ours == theirs:
                    s["agreeing_positions"] += 1
                else:
                    note("disagreement", text, i, canon, ours, theirs,
                         matcher.forced_bytes(state))
            step = _count_forced(s, "", canon, i, ours)
            if ours and canon[i:i + len(ours)] != ours:
                note("noncanonical", text, i, canon, ours, None, matcher.forced_bytes(state))
            ours_pos += step
        if ll_pos == i:
            ll_pos += _count_forced(s, "llguidance_", canon, i, theirs)
    return s


def _count_forced(s: dict[str, Any], side: str, canon: list[int], i: int,
                  forced: list[int]) -> int:
    """Count one side's forced tokens at position ``i`` of the walk; the positions to move:
    past them when they are the canonical tokens, else one canonical token."""
    if not forced:
        return 1
    s[side + "ff_sequences"] += 1
    if canon[i:i + len(forced)] == forced:
        s[side + "forced_tokens"] += len(forced)
        return len(forced)
    s[side + "noncanonical"] += 1
    return 1
