"""Requests a user would send, every method against ``cd`` in one run: JSON schemas (the
MaskBench dev set's smallest of several sources, plus a hand-written one), regexes, choices
and a Lark grammar, after raw and chat prompts, at n = 1 and n = 5, on the default model.

For each request and n the methods run one after another on a fresh tree each (the model's
KV cache is the backend's and shared), so every ratio to ``cd`` comes from the same minute of
the same machine. A search runs with the library's defaults (``end="leave"``, the CD fallback)
and a budget of ``--max-seconds`` (default 120) and ``--max-nodes`` prefixes (default 100 000;
unlike time, the same on any machine and load): a sample the fallback drew counts as not
exact and shows in the ``fallback`` column. Columns per method: CPU time as a ratio to
``cd``'s, model calls, samples complete (of n) and samples the fallback drew; the summary
gives each method's median and worst ratio over the requests. CPU time of the process, not
wall time: with one torch thread (run it with ``OMP_NUM_THREADS=1``) it is the work done,
which other jobs on a shared machine do not inflate; on an idle machine the two agree.
With ``--seeds 0,1,2`` each row sums every method's runs over the seeds (a ratio of sums): one
sample's length decides most of its cost, and it moves cd's time 25x between seeds on one
MaskBench request.

Two request sets: ``--set tuned`` (default), the requests the search's defaults were tuned
on, and ``--set frozen``, ``benchmarks/frozen_requests.json``: 56 requests drawn and written
before the change they measure and never edited since (20 MaskBench schemas by a seeded draw,
each after a raw and a chat prompt, and hand-written JSON, regexes, choices and Lark
grammars); its figures are the ones that say how the searches do on requests nobody tuned on.
Each row also gives the wall time and the forward passes (``lm.forward_calls``) as ratios to
``cd``'s, and the summary each method's share of samples drawn by the fallback.

A third, ``--set holdout`` (``benchmarks/holdout_requests.json``), holds 20 short hand-written
requests where cd answers in a few calls a sample, where a search's fixed costs weigh most
(``--early-floor``: the early hand-over's floor), written before they were first run and
likewise never edited.

Run:  python benchmarks/everyday.py [--set tuned|frozen|holdout] [--quick] [--n 1,5] [--seeds 0]
      [--methods cd,exact] [--early-floor 48]
      [--only TEXT] [--json-whitespace default|flexible] [--end leave|eos] [--max-seconds 120]
      [--max-nodes 100000]
      [--kind json|regex|choice|lark] [--maskbench with|without|only] [--maskbench-tokens N]
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import json
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from machine import cpu_name, load  # benchmarks/machine.py (the script's directory)

import adaptrack as at
from adaptrack.lm.cost import width_for
from adaptrack.sampling import policy
from adaptrack.sampling.policy import EARLY_FLOOR, EARLY_RATIO

MASKBENCH = Path(__file__).resolve().parents[2] / "shared" / "data" / "maskbench-dev.jsonl.gz"
FROZEN = Path(__file__).resolve().parent / "frozen_requests.json"
HOLDOUT = Path(__file__).resolve().parent / "holdout_requests.json"
SETS = {"frozen": FROZEN, "holdout": HOLDOUT}  # --set: the request sets nobody tuned on
METHODS = {  # label: (method, options)
    "unconstrained": ("unconstrained", {}),
    "cd": ("cd", {}),
    "asap": ("asap", {}),
    "adaptrack": ("adaptrack", {}),
    "adaptrack share_q": ("adaptrack", {"share_q": True}),
    "exact": ("exact", {}),
}
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 120}},
    "required": ["name", "age"], "additionalProperties": False}

#: ``benchmarks/serve_load.py``'s request: compact JSON only, as vLLM's
#: ``disable_any_whitespace`` asks; a chat model wants `": "` after every key.
PERSON_STRICT = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "favourite_colour": {"enum": ["red", "green", "blue", "yellow"]}},
    "required": ["name", "age", "favourite_colour"], "additionalProperties": False,
    "x-guidance": {"whitespace_flexible": False}}


@dataclass
class Request:
    """One request: a name, a prompt (raw text, or a chat user message), a constraint."""

    name: str
    prompt: str
    chat: bool
    kind: str  # json, regex, choice, lark
    spec: Any
    max_new_tokens: int
    maskbench: bool = False

    def constraint(self, whitespace: str) -> at.constraints.Constraint:
        c = at.constraints
        if self.kind == "json":
            schema = self.spec
            if whitespace == "flexible" and isinstance(schema, dict):
                schema = {**schema, "x-guidance": {"whitespace_flexible": True}}
            return c.json_schema(schema)
        if self.kind == "regex":
            return c.regex(self.spec)
        if self.kind == "choice":
            return c.choice(self.spec)
        return c.lark(self.spec)


def maskbench_schemas(count: int) -> list[tuple[str, dict[str, Any]]]:
    """The ``count`` smallest object schemas of the dev set with two to five properties, at
    most two per source, skipping those llguidance refuses."""
    if not MASKBENCH.exists():
        print(f"# {MASKBENCH} is absent: MaskBench requests skipped", file=sys.stderr)
        return []
    rows = [json.loads(line) for line in gzip.open(MASKBENCH)]
    rows.sort(key=lambda r: (r["meta"]["stripped_size"], r["name"]))
    out: list[tuple[str, dict[str, Any]]] = []
    per_source: dict[str, int] = {}
    for r in rows:
        schema, source = r["schema"], r["name"].split("---")[0]
        props = schema.get("properties") if isinstance(schema, dict) else None
        if (not isinstance(props, dict) or not 2 <= len(props) <= 5 or "$ref" in json.dumps(schema)
                or per_source.get(source, 0) >= 2):
            continue
        try:
            at.constraints.json_schema(schema)
        except ValueError:
            continue
        per_source[source] = per_source.get(source, 0) + 1
        out.append((r["name"], schema))
        if len(out) == count:
            break
    return out


def requests(quick: bool, maskbench_tokens: int = 160) -> list[Request]:
    out = [
        Request("person (raw)", "A person as JSON: ", False, "json", PERSON, 40),
        Request("person (chat)", "Give me a person as a JSON object with a name and an age.",
                True, "json", PERSON, 40),
        Request("person, colour, strict whitespace (chat)", "Describe fictional person number "
                "0 as JSON with a name, an age and a favourite colour.", True, "json",
                PERSON_STRICT, 48),
        Request("number 1-3 digits (raw)", "Number 3:", False, "regex", "[0-9]{1,3}", 6),
        Request("date (chat)", "What date is Christmas 2025? Answer as YYYY-MM-DD.", True,
                "regex", r"\d{4}-\d{2}-\d{2}", 12),
        Request("email (raw)", "Contact us by email at ", False, "regex",
                r"[a-z]{1,12}@[a-z]{1,12}\.(com|org|net)", 16),
        Request("hex colour (chat)", "What is the hex code of pure red?", True, "regex",
                "#[0-9a-fA-F]{6}", 8),
        Request("phone (raw)", "Call me at ", False, "regex", r"\(\d{3}\) \d{3}-\d{4}", 16),
        Request("yes/no (raw)", "Q: Is the sky blue?\nA:", False, "choice", [" yes", " no"], 4),
        Request("sentiment (chat)", "Is this review positive, negative or neutral? 'The food "
                "was cold and the waiter rude.' Answer with one word.", True, "choice",
                ["positive", "negative", "neutral"], 4),
        Request("colour word (raw)", "My favourite colour is", False, "choice",
                [" red", " green", " blue", " yellow", " purple"], 4),
        Request("arithmetic (raw, Lark)", "Two plus three, as an expression: ", False, "lark",
                'start: NUM (OP NUM)*\nNUM: /[0-9]{1,4}/\nOP: "+" | "-" | "*"', 12),
        Request("arithmetic (chat, Lark)", "Write 12 times 7 as an arithmetic expression.",
                True, "lark", 'start: NUM (" "? OP " "? NUM)*\nNUM: /[0-9]{1,4}/\nOP: "+" | "-" '
                '| "*"', 12),
    ]
    for k, (name, schema) in enumerate(maskbench_schemas(4 if quick else 12)):
        chat = k % 2 == 1
        prompt = ("Fill in this JSON schema with an example: " + json.dumps(schema)
                  if chat else "An example of a JSON object matching the schema "
                  + json.dumps(schema) + ":\n")
        out.append(Request(f"{name} ({'chat' if chat else 'raw'})", prompt, chat, "json",
                           schema, maskbench_tokens, maskbench=True))
    return out[:6] if quick else out


def frozen_requests(path: Path = FROZEN) -> list[Request]:
    """A frozen set (``FROZEN``, ``HOLDOUT``): its MaskBench schemas read from the dev set by
    name and checked against the sha256 written when they were drawn; absent ones skipped,
    saying so."""
    doc = json.loads(path.read_text())
    rows: dict[str, Any] = {}
    if MASKBENCH.exists():
        rows = {r["name"]: r["schema"] for r in map(json.loads, gzip.open(MASKBENCH))}
    elif any("maskbench" in r for r in doc["requests"]):
        print(f"# {MASKBENCH} is absent: the frozen set's MaskBench requests skipped",
              file=sys.stderr)
    out = []
    for r in doc["requests"]:
        spec, prompt = r.get("spec"), r.get("prompt")
        if "maskbench" in r:
            spec = rows.get(r["maskbench"])
            if spec is None:
                continue
            digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()
            if digest[:16] != r["sha256"]:
                sys.exit(f"{r['maskbench']}: the dev set's schema is not the one drawn")
            form = doc["maskbench_prompts"]["chat" if r["chat"] else "raw"]
            prompt = form.format(schema=json.dumps(spec))
        out.append(Request(r["name"], prompt, r["chat"], r["kind"], spec, r["max_new_tokens"],
                           maskbench="maskbench" in r))
    return out


def crossing(lm: at.LanguageModel, prompt: str | list[int], constraint: Any,
             tokens: tuple[int, ...]) -> float:
    """Of the mass with which the model stops continuing a sample's final text, the share
    the whole-token ``leave`` policy drops: tokens whose first bytes continue the text and a
    later byte does not (docs/design.md §2), over those plus the tokens that leave."""
    m = constraint.bind(lm.vocab)
    state = m.start()
    for t in tokens[:-1]:
        state = m.advance(state, t)
    ids = lm.encode(prompt) if isinstance(prompt, str) else list(prompt)
    logp = lm.next_logprobs([tuple(ids) + tuple(tokens[:-1])])[0]
    p = np.exp(logp - logp.max())
    p /= p.sum()
    allowed, leaving = m.allowed(state), m.leaving(state)
    leave = p[leaving].sum() + p[np.intersect1d(lm.vocab.eos_ids, allowed)].sum()
    cross = max(0.0, 1.0 - p[allowed].sum() - p[leaving].sum())
    return float(cross / (cross + leave)) if cross + leave > 0 else 0.0


def run(lm: at.LanguageModel, req: Request, n: int, label: str, whitespace: str, end: str,
        max_seconds: float | None, chat: Any, seed: int = 0,
        max_nodes: int = 100_000, search_budget: float | None = at.SEARCH_BUDGET,
        early_handover: float | None = EARLY_RATIO) -> dict[str, Any]:
    method, options = METHODS[label]
    prompt = chat([{"role": "user", "content": req.prompt}]) if req.chat else req.prompt
    started, cpu = time.perf_counter(), time.process_time()
    passes = getattr(lm, "forward_calls", 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            res = at.generate(lm, prompt, req.constraint(whitespace), method=method, n=n, seed=seed,
                              max_new_tokens=req.max_new_tokens, max_seconds=max_seconds,
                              max_nodes=max_nodes, search_budget=search_budget, end=end,
                              early_handover=early_handover,
                              **options)
        except at.AdaptrackError as err:
            return {"s": time.perf_counter() - started, "cpu": time.process_time() - cpu,
                    "passes": getattr(lm, "forward_calls", 0) - passes,
                    "error": type(err).__name__}
    out = {"s": time.perf_counter() - started, "cpu": time.process_time() - cpu,
           "passes": getattr(lm, "forward_calls", 0) - passes,
           "calls": res.stats["lm_calls"],
           "complete": sum(s.complete for s in res.samples),
           "fallback": res.stats["fallback_samples"], "texts": res.texts,
           # Samples that used every token allowed: the fallback's and the search's apart.
           "long": [sum(len(s.tokens) >= req.max_new_tokens for s in res.samples
                        if s.fallback == fell) for fell in (False, True)],
           "tokens": sum(len(s.tokens) for s in res.samples)}
    if label == "cd" and end == "leave":
        c = req.constraint(whitespace)
        out["crossing"] = [crossing(lm, prompt, c, s.tokens) for s in res.samples if s.complete]
    return out


def pooled(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One method's runs of a request over several seeds as one: times, calls, complete and
    fallback samples summed; an error if any seed's run raised (its name, the first one)."""
    out: dict[str, Any] = {k: sum(r[k] for r in runs) for k in ("s", "cpu", "passes")}
    errors = [r["error"] for r in runs if "error" in r]
    if errors:
        return {**out, "error": errors[0]}
    for k in ("calls", "complete", "fallback", "tokens"):
        out[k] = sum(r[k] for r in runs)
    out["long"] = [sum(r["long"][i] for r in runs) for i in (0, 1)]
    out["texts"] = [t for r in runs for t in r["texts"]]
    out["runs"] = runs
    out["crossing"] = [x for r in runs for x in r.get("crossing", [])]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", choices=("tuned", *SETS), default="tuned",
                        help="the requests the defaults were tuned on, or a set nobody tuned "
                             "on: frozen (benchmarks/frozen_requests.json) or holdout "
                             "(benchmarks/holdout_requests.json)")
    parser.add_argument("--quick", action="store_true", help="six requests, n = 1")
    parser.add_argument("--n", default="1,5", help="sample counts, comma-separated")
    parser.add_argument("--methods", default=",".join(m for m in METHODS if m != "unconstrained"),
                        help="comma-separated labels of METHODS (default: all but "
                             "unconstrained, which no constraint holds)")
    parser.add_argument("--json-whitespace", choices=("default", "flexible"), default="default")
    parser.add_argument("--end", choices=("leave", "eos"), default="leave")
    parser.add_argument("--max-seconds", type=float, default=120.0,
                        help="a search's time budget (0: none), past which the CD fallback "
                             "draws its remaining samples")
    parser.add_argument("--max-nodes", type=int, default=100_000,
                        help="a search's budget in prefixes of its tree (those it asked the "
                             "model about and those the constraint ruled out without a "
                             "call): unlike time, the same on any machine and load")
    parser.add_argument("--search-budget", type=float, default=at.SEARCH_BUDGET,
                        help="a search's model calls as a multiple of n x max_new_tokens "
                             f"(0: none; default: the library's, {at.SEARCH_BUDGET:g})")
    parser.add_argument("--early-handover", type=float, default=EARLY_RATIO,
                        help="a search's early hand-over as a multiple of CD's estimated "
                             f"cost (0: none, only the budget; default: the library's, "
                             f"{EARLY_RATIO:g})")
    parser.add_argument("--early-floor", type=int, default=EARLY_FLOOR, metavar="K",
                        help="the prefixes a sample's search may always use before the early "
                             f"hand-over (default: the library's, {EARLY_FLOOR}); a "
                             "benchmark's knob, not an option of the library")
    parser.add_argument("--row-cost", type=float, default=None, metavar="C",
                        help="the model's cost of a row (lm/cost.py) instead of timing it: "
                             "exact's width, and so its calls, the same in every run "
                             "(default: timed, printed at the end)")
    parser.add_argument("--only", default=None, help="requests whose name contains this")
    parser.add_argument("--kind", choices=("json", "regex", "choice", "lark"),
                        help="requests of this kind only")
    parser.add_argument("--maskbench", choices=("with", "without", "only"), default="with",
                        help="the MaskBench requests too, not, or alone")
    parser.add_argument("--maskbench-tokens", type=int, default=160, metavar="N",
                        help="max_new_tokens of the MaskBench requests (default: 160; at 64 "
                             "cd walks into the length limit on most of them)")
    parser.add_argument("--texts", action="store_true", help="print every sample's text")
    parser.add_argument("--seeds", default="0",
                        help="comma-separated seeds; a row sums each method's CPU time, calls "
                             "and samples over them (one sample's length moves cd's time 25x "
                             "between seeds on a MaskBench request)")
    args = parser.parse_args()
    labels = [m for m in args.methods.split(",") if m]
    if "cd" not in labels:
        labels.insert(0, "cd")
    ns = [1] if args.quick else [int(x) for x in args.n.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    policy.EARLY_FLOOR = args.early_floor  # read by BudgetPolicy at each check
    lm = at.load_model()
    if args.row_cost is not None:
        lm.row_cost = args.row_cost  # declared: nothing is timed
    from adaptrack.serve.preprocess import hf_chat_template

    chat = hf_chat_template(lm)
    pool = (frozen_requests(SETS[args.set]) if args.set in SETS
            else requests(args.quick, args.maskbench_tokens))
    reqs = [r for r in pool
            if (args.only is None or args.only in r.name) and args.kind in (None, r.kind)
            and {"with": True, "without": not r.maskbench, "only": r.maskbench}[args.maskbench]]
    print(f"# everyday requests, {datetime.date.today()}; default model, CPU: {cpu_name()}; "
          f"load average at start: {load()}; JSON whitespace: {args.json_whitespace}; "
          f"end: {args.end}; max_seconds: {args.max_seconds:g}; max_nodes: {args.max_nodes}; "
          f"search_budget: {args.search_budget:g}; early_handover: {args.early_handover:g} "
          f"(floor {args.early_floor}); "
          f"set: {args.set}; "
          f"seeds: {args.seeds}\n")
    # One-off costs (the canonical tokenizer of fast-forward, llguidance's view of the
    # vocabulary) are paid here, not by the first request's cd.
    for kind in ("json", "regex"):
        warm = Request("warm-up", "Hello", False, kind, {"type": "object"} if kind == "json"
                       else "[a-z]+", 4)
        at.generate(lm, "Hello", warm.constraint(args.json_whitespace), method="cd",
                    max_new_tokens=4)
    head = " | ".join(f"{m}: × cd CPU, wall, passes; calls, done, fb" for m in labels)
    print(f"| request | n | cd CPU s | cd wall s | cd passes | {head} |")
    print("|---|--:|--:|--:|--:|" + "---|" * len(labels))
    ratios: dict[tuple[str, int], list[float]] = {(m, n): [] for m in labels for n in ns}
    walls: dict[tuple[str, int], list[float]] = {(m, n): [] for m in labels for n in ns}
    passes: dict[tuple[str, int], list[float]] = {(m, n): [] for m in labels for n in ns}
    fell: dict[str, list[int]] = {m: [0, 0] for m in labels}  # by the fallback, drawn
    crossed: list[tuple[str, float]] = []
    short: dict[str, int] = {m: 0 for m in labels}
    # Samples at max_new_tokens (the method's own, the fallback's) and tokens of all samples.
    long: dict[str, list[int]] = {m: [0, 0, 0] for m in labels}
    for n in ns:  # every request at the first n before the next n: a cut run has one n whole
        for req in reqs:
            # The prompt's KV state is kept by the backend: prefilled here, untimed, so that
            # the first method of the row does not pay for it alone.
            at.generate(lm, chat([{"role": "user", "content": req.prompt}]) if req.chat
                        else req.prompt, None, method="unconstrained", max_new_tokens=1)
            got = {m: pooled([run(lm, req, n, m, args.json_whitespace, args.end,
                                      args.max_seconds or None, chat, seed, args.max_nodes,
                                      args.search_budget or None,
                                      args.early_handover or None)
                              for seed in seeds])
                   for m in labels}
            base = got["cd"]["cpu"]
            crossed += [(req.name, x) for x in got["cd"].get("crossing", [])]
            cells = []
            for m in labels:
                r = got[m]
                ratio = r["cpu"] / base
                wall, fwd = r["s"] / got["cd"]["s"], r["passes"] / max(got["cd"]["passes"], 1)
                ratios[m, n].append(ratio)
                walls[m, n].append(wall)
                passes[m, n].append(fwd)
                if "error" in r:
                    cells.append(f"{ratio:.1f} {r['error']}")
                    short[m] += n * len(seeds)
                    continue
                short[m] += n * len(seeds) - r["complete"] if m != "unconstrained" else 0
                long[m][0] += r["long"][0]
                long[m][1] += r["long"][1]
                long[m][2] += r["tokens"]
                fell[m][0] += r["fallback"]
                fell[m][1] += n * len(seeds)
                cells.append(f"{ratio:.2f}, {wall:.2f}, {fwd:.2f}; {r['calls']}, "
                             f"{r['complete']}, {r['fallback']}")
            print(f"| {req.name} | {n} | {base:.1f} | {got['cd']['s']:.1f} | "
                  f"{got['cd']['passes']} | "
                  + " | ".join(cells) + " |", flush=True)
            if args.texts:
                for m in labels:
                    for seed, r in zip(seeds, got[m].get("runs", []), strict=False):
                        print(f"    {m}, seed {seed}: CPU {r['cpu']:.1f} s, {r.get('calls')} "
                              f"calls, {r.get('fallback')} by the fallback: {r.get('texts')}",
                              file=sys.stderr)
    # The early hand-over's aim (docs/design.md §6): about 3x cd at most before it answers.
    print("\n| method | n | requests | median × cd | worst × cd | wall: median | worst "
          "| over 3× cd's wall | passes: median | worst | by the fallback |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for m in labels:
        for n in ns:
            if ratios[m, n]:
                share = f"{fell[m][0]} of {fell[m][1]}"
                print(f"| {m} | {n} | {len(ratios[m, n])} | {statistics.median(ratios[m, n]):.2f} "
                      f"| {max(ratios[m, n]):.2f} | {statistics.median(walls[m, n]):.2f} "
                      f"| {max(walls[m, n]):.2f} | {sum(w > 3 for w in walls[m, n])} "
                      f"| {statistics.median(passes[m, n]):.2f} "
                      f"| {max(passes[m, n]):.2f} | {share} |")
    print("\n| method | samples not complete |")
    print("|---|--:|")
    for m in labels:
        print(f"| {m} | {short[m]} |")
    print("\nSamples that used every token `max_new_tokens` allows, by whoever drew them, "
          "and the tokens of a sample on average:\n")
    print("| method | at the limit: its own | the fallback's | tokens a sample |")
    print("|---|--:|--:|--:|")
    for m in labels:
        searched, fallen, tokens = long[m]
        print(f"| {m} | {searched} | {fallen} | {tokens / max(fell[m][1], 1):.1f} |")
    if crossed:
        print("\nMass the whole-token `leave` drops at the end of cd's samples (tokens that "
              "cross the end, over those plus the tokens that leave):\n")
        print("| request | samples | mean | max |")
        print("|---|--:|--:|--:|")
        for name in dict.fromkeys(n for n, _ in crossed):
            xs = [x for n, x in crossed if n == name]
            print(f"| {name} | {len(xs)} | {statistics.mean(xs):.3f} | {max(xs):.3f} |")
    if lm.row_cost is not None:
        # exact's width comes from the row cost (lm/cost.py): timed, it moves between runs,
        # and with it exact's model calls and where it hands over; cd's and adaptrack's do not.
        how = "given" if args.row_cost is not None else "measured"
        print(f"\nrow cost {how}: {lm.row_cost:.3f} (exact's width "
              f"{width_for(lm.row_cost)}; --row-cost repeats it)")
    print(f"\nload average at end: {load()}")


if __name__ == "__main__":
    sys.exit(main())
