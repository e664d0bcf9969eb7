"""Structured output's cost, for each grammar engine: constrained vs free decode, time to first token with a cold vs
a cached schema, and the compile time of every reference JSON schema, in one run.

    .venv/bin/python bench/constrained.py            # bench/decode.py's ~150M-parameter Qwen3, 128 tokens, 5 reps
    .venv/bin/python bench/constrained.py --quick    # a tiny model, a few tokens, one repetition (the smoke test)
    .venv/bin/python bench/constrained.py --vocab qwen3   # the same body with the real 151k Qwen3 vocabulary

(a) Decode: the same request (raw prompt, temperature 0, fixed num_predict) with no format and with a JSON
schema whose array needs more items than fit in num_predict, so the grammar is in force for every token;
constrained / free tok/s, client-side and from plugd's own eval_count/eval_duration (target >= 0.95).
(b) Time to first token, each on a prompt of its own: free; the runner's first structured request (it imports
the engine and reads the vocabulary); a schema the runner has not seen; a schema it has compiled before.
Compilation runs while the prompt is prefilled, so it shows only where it takes longer than the prefill.
(c) Compile time per schema of tests/reference/json_schemas, in this process on the bench checkpoint's
vocabulary (compiled and refused ones apart): median and max.
Each engine (plugd-llguidance, plugd-xgrammar) gets a daemon of its own (PLUGD_GRAMMAR_ENGINES names it alone).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchlib as bl
import ollama
from decode import FULL, QUICK

from plugd.runner.grammar import GrammarRefused, GrammarVocabulary
from plugd.tokenizer import Tokenizer

SCHEMAS = Path(__file__).resolve().parents[1] / "tests/reference/json_schemas"
DECODE_TARGET = 0.95
# Each engine's compiler, imported only when its figures are taken (xgrammar imports torch).
ENGINES = {"llguidance": ("plugd_llguidance.engine", "LLGuidanceEngine"),
           "xgrammar": ("plugd_xgrammar.engine", "XGrammarEngine")}


def rows_schema(field: str = "name") -> dict[str, Any]:
    """An array of records that cannot end within any num_predict used here; `field` names a fresh schema."""
    record = {"type": "object", "additionalProperties": False, "required": [field, "age", "tags"],
              # a pattern bounds the name, since xgrammar refuses length bounds on strings
              "properties": {field: {"type": "string", "pattern": "^[A-Za-z ]{0,12}$"}, "age": {"type": "integer"},
                             "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3}}}
    return {"type": "array", "minItems": 100000, "items": record}


def stream(client: ollama.Client, prompt: str, tokens: int, fmt: Any = None) -> dict[str, float]:
    """One streamed raw generation: client-side first token / done times and plugd's own decode rate."""
    options = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": tokens, "num_ctx": 4096}
    started = time.perf_counter()
    first = None
    for chunk in client.generate(model="bench", prompt=prompt, raw=True, stream=True, format=fmt, options=options):
        now = time.perf_counter() - started
        if chunk.done:
            rate = chunk.eval_count / (chunk.eval_duration / 1e9)
            client_rate = (chunk.eval_count - 1) / (now - first) if chunk.eval_count > 1 else float("nan")
            return {"ttft": first or now, "tokens": chunk.eval_count, "own": rate, "client": client_rate}
        first = first or now
    raise RuntimeError("the stream ended without a final chunk")


def decode_figures(client: ollama.Client, prompts: list[str], tokens: int, engine: str) -> None:
    runs: dict[str, list[dict[str, float]]] = {"free": [], "constrained": []}
    for i, prompt in enumerate(prompts):
        kinds = ["free", "constrained"] if i % 2 else ["constrained", "free"]
        for kind in kinds:
            runs[kind].append(stream(client, prompt, tokens, rows_schema() if kind == "constrained" else None))
        print(f"round {i + 1}: " + ", ".join(f"{k} {runs[k][-1]['own']:.1f} tok/s" for k in runs), flush=True)
    for kind, results in runs.items():
        if any(r["tokens"] != tokens for r in results):
            print(f"WARNING: {kind} generated {sorted({r['tokens'] for r in results})} tokens, not {tokens}")
    medians = {kind: {key: bl.median([r[key] for r in results]) for key in ("own", "client")}
               for kind, results in runs.items()}
    print("\n" + bl.table(["decode", "tok/s (own)", "tok/s (client)"],
                          [[kind, m["own"], m["client"]] for kind, m in medians.items()]))
    for key, label in (("client", "client"), ("own", "plugd own")):
        ratio = medians["constrained"][key] / medians["free"][key]
        verdict = "OK" if ratio >= DECODE_TARGET else "BELOW TARGET"
        print(f"ratio decode ({label}, {engine}) constrained/free {ratio:5.2f}  (target >= {DECODE_TARGET:.2f}) "
              f"{verdict}")


def ttft_figures(client: ollama.Client, prompts: list[str], reps: int, engine: str) -> None:
    """`prompts` holds 1 + 3 * reps prompts, none sharing a first token with another."""
    first = stream(client, prompts[0], 2, rows_schema("first"))["ttft"]
    ttft: dict[str, list[float]] = {"free": [], "new schema": [], "cached schema": []}
    for i in range(reps):
        formats = {"free": None, "new schema": rows_schema(f"new{i}"), "cached schema": rows_schema("first")}
        kinds = list(formats)[i % 3:] + list(formats)[: i % 3]  # rotate who goes first
        for kind, prompt in zip(kinds, prompts[1 + 3 * i : 4 + 3 * i]):
            ttft[kind].append(stream(client, prompt, 2, formats[kind])["ttft"])
    medians = {kind: bl.median(times) for kind, times in ttft.items()}
    rows = [["first structured request in the runner", first * 1000]] + [[k, v * 1000] for k, v in medians.items()]
    print("\n" + bl.table(["time to first token", "ms"], rows))
    print(f"ratio TTFT ({engine}) new schema/free {medians['new schema'] / medians['free']:5.2f}, "
          f"cached schema/free {medians['cached schema'] / medians['free']:5.2f}, "
          f"first structured/free {first / medians['free']:5.2f}  (lower is better)")


def compile_figures(model_dir: Path, width: int, name: str) -> None:
    module, factory = ENGINES[name]
    started = time.perf_counter()
    engine = getattr(importlib.import_module(module), factory)(GrammarVocabulary.of(Tokenizer.from_dir(model_dir), width))
    setup = time.perf_counter() - started
    times: dict[str, list[float]] = {"compiled": [], "refused": []}
    for path in sorted(SCHEMAS.glob("*.json")):
        schema = json.loads(path.read_text())
        started = time.perf_counter()
        try:
            engine.compile("json_schema", schema)
            outcome = "compiled"
        except GrammarRefused:
            outcome = "refused"
        times[outcome].append(time.perf_counter() - started)
    print(f"\n{name}: vocabulary + compiler set-up: {setup * 1000:,.0f} ms (once per runner)")
    print(bl.table(["schemas", "count", "median ms", "max ms"],
                   [[kind, str(len(t)), bl.median(t) * 1000, max(t, default=float("nan")) * 1000]
                    for kind, t in times.items()]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bl.add_vocab_option(parser)
    args = bl.parse_run_args(parser, reps=5, tokens=128, prompt_tokens=128)
    reps, tokens, prompt_len = args.reps, args.tokens, args.prompt_tokens
    bl.on_sigterm_exit()

    with tempfile.TemporaryDirectory(prefix="plugd-bench-") as tmp:
        model_dir = Path(tmp) / "model"
        info = bl.write_bench_checkpoint(model_dir, "qwen3", QUICK if args.quick else FULL, args.vocab)
        print(f"model: {bl.describe(info['config'], args.vocab)}: {info['params'] / 1e6:.1f}M parameters")
        print(f"run: prompt {prompt_len} tokens, {tokens} generated tokens, temperature 0, {reps} repetitions")
        prompts = [text for text, _ in bl.make_prompts(model_dir, 2 + 4 * reps, prompt_len)]
        for engine in ENGINES:
            print(f"\n=== {engine}")
            env = {"PLUGD_GRAMMAR_ENGINES": engine}
            with bl.plugd_server(Path(tmp) / f"store-{engine}", model_dir, "bench", env=env) as server:
                client = ollama.Client(host=server.url)
                stream(client, prompts[0], 2)  # loads the runner
                ttft_figures(client, prompts[1 : 2 + 3 * reps], reps, engine)
                decode_figures(client, prompts[2 + 3 * reps :], tokens, engine)
            compile_figures(model_dir, info["config"]["vocab_size"], engine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
