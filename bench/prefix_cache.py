"""Prompt caching over a replayed agent session: plugd (prefix-cache plugin) vs mlx_lm.server, in one run.

    .venv/bin/python bench/prefix_cache.py            # ~150M-parameter Qwen3, 30 turns, ~8k tokens
    .venv/bin/python bench/prefix_cache.py --quick    # a tiny model, the same session shape (the smoke test)

The session is what a coding agent sends: a long system prompt, then per turn the transcript so far plus a
runtime system message that the next turn drops again (it follows each tool result, and only the latest one is
kept), so every prompt departs from the previous one a little before its end. Two turns carry a large tool
result whose first request the client abandons partway through the prefill (a client timeout) and retries.
Both engines get the same raw prompt texts and generate a few tokens at temperature 0.

Reported: prompt tokens plugd evaluated (its prompt_eval_count summed over the answered requests, plus at most
each abandoned request's new tokens, which it cannot report) against the tokens no earlier prompt began with,
median time to first token of each engine, peak memory of plugd's runner and its prompt cache's bytes against
the budget (PLUGD_PREFIX_CACHE_BYTES, set here).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import benchlib as bl
import httpx

FULL = {"hidden_size": 768, "num_hidden_layers": 24, "num_attention_heads": 12, "num_key_value_heads": 4,
        "head_dim": 64, "intermediate_size": 2048}
QUICK = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 16, "intermediate_size": 128}
TURNS = 30
CANCELLED_TURNS = (10, 20)
GENERATED = 8
BUDGET = 512 * 2**20
TARGET_PREFILL_RATIO = 1.1
TARGET_TTFT_RATIO = 0.5


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(bl.WORDS) for _ in range(count))


def session(rng: random.Random) -> list[str]:
    """The prompt texts of every turn, in order."""
    history = "System: you are a coding agent. " + words(rng, 250)
    prompts = []
    for turn in range(TURNS):
        reminder = f"\nSystem reminder {turn}: " + words(rng, 10)
        prompts.append(history + reminder + "\nAssistant:")
        tool_result = words(rng, 300 if turn + 1 in CANCELLED_TURNS else 22)
        history += f"\nAssistant: {words(rng, 8)}\nTool result: {tool_result}"
    return prompts


def _new(token_lists: list[list[int]], turn: int) -> int:
    """Tokens of a turn's prompt that no earlier prompt began with."""
    tokens = token_lists[turn]
    return len(tokens) - max((_common(tokens, earlier) for earlier in token_lists[:turn]), default=0)


def new_tokens(token_lists: list[list[int]]) -> int:
    return sum(_new(token_lists, turn) for turn in range(len(token_lists)))


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def abandon(url: str, path: str, body: dict[str, Any], after_s: float) -> None:
    """Send a streamed request and drop the connection `after_s` seconds in, as a client timeout does."""
    try:
        with httpx.stream("POST", f"{url}{path}", json=body, timeout=httpx.Timeout(after_s)) as response:
            for _ in response.iter_lines():
                pass
    except httpx.TimeoutException:
        pass


def run_plugd(server, prompts: list[str], num_ctx: int, cancel_after: dict[int, float]) -> dict[str, Any]:
    options = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": GENERATED, "num_ctx": num_ctx}
    evaluated, ttfts = 0, []
    for turn, prompt in enumerate(prompts):
        if turn in CANCELLED_TURNS:
            body = {"model": "bench", "prompt": prompt, "raw": True, "stream": True, "options": options}
            abandon(server.url, "/api/generate", body, cancel_after[turn])
        final = bl.plugd_generate(server.url, "bench", prompt, options)
        evaluated += final["prompt_eval_count"]
        ttfts.append(final["client"]["first"])
    return {"evaluated": evaluated, "ttft": bl.median(ttfts)}


def run_mlx_server(url: str, prompts: list[str], cancel_after: dict[int, float]) -> dict[str, Any]:
    ttfts = []
    for turn, prompt in enumerate(prompts):
        if turn in CANCELLED_TURNS:
            body = {"model": "default_model", "prompt": prompt, "max_tokens": GENERATED, "temperature": 0.0,
                    "stream": True}
            abandon(url, "/v1/completions", body, cancel_after[turn])
        ttfts.append(bl.mlx_server_generate(url, prompt, GENERATED)["first"])
    return {"ttft": bl.median(ttfts)}


def cold_ttfts(server, prompts: list[str], num_ctx: int) -> dict[int, float]:
    """How long the cancelled turns' prefill takes from scratch: on a copy of the model (its own runner and
    cache), each prompt behind a word of its own so that neither reuses the other."""
    server.cli("cp", "bench", "cold", check=True)
    options = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": 1, "num_ctx": num_ctx}
    bl.plugd_generate(server.url, "cold", "Warm up", options)  # loads the runner
    times = {turn: bl.plugd_generate(server.url, "cold", f"Cold{turn} {prompts[turn]}", options)["client"]["first"]
             for turn in CANCELLED_TURNS}
    server.cli("stop", "cold")
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model")
    args = parser.parse_args()
    bl.on_sigterm_exit()
    os.environ["PLUGD_PREFIX_CACHE_BYTES"] = str(BUDGET)
    os.environ.pop("PLUGD_CACHE_POLICY", None)

    with tempfile.TemporaryDirectory(prefix="plugd-bench-") as tmp, ExitStack() as stack:
        model_dir = Path(tmp) / "model"
        # Room for the whole session: plugd truncates a prompt past the model's context length.
        body = (QUICK if args.quick else FULL) | {"max_position_embeddings": 32768}
        info = bl.write_bench_checkpoint(model_dir, "qwen3", body)
        print(f"model: {bl.describe(info['config'], 'tiny')}: {info['params'] / 1e6:.1f}M parameters")
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        prompts = session(random.Random(7))
        token_lists = [tokenizer.encode(p).ids for p in prompts]
        fresh = new_tokens(token_lists)
        num_ctx = len(token_lists[-1]) + GENERATED + 64
        print(f"session: {TURNS} turns, last prompt {len(token_lists[-1])} tokens, {fresh} new tokens in all, "
              f"turns {CANCELLED_TURNS} abandoned once halfway through their prefill and retried")

        server = stack.enter_context(bl.plugd_server(Path(tmp) / "store", model_dir, "bench"))
        # Halfway through the turn's new tokens, assuming a prefill rate as even as the cold one.
        cancel_at = {turn: seconds * _new(token_lists, turn) / len(token_lists[turn]) / 2
                     for turn, seconds in cold_ttfts(server, prompts, num_ctx).items()}
        plugd = run_plugd(server, prompts, num_ctx, cancel_at)
        runner = server.runner_pids()
        peak = bl.proc_status(runner[0])["VmHWM"] if runner else float("nan")
        cache = httpx.get(f"{server.url}/api/ps").json()["models"][0].get("prompt_cache", {})
        url, _ = stack.enter_context(bl.mlx_lm_server(model_dir))
        peer = run_mlx_server(url, prompts, cancel_at)

        print(bl.table(["engine", "median TTFT ms"], [["plugd", plugd["ttft"] * 1000],
                                                       ["mlx_lm.server", peer["ttft"] * 1000]]))
        # An abandoned request reports nothing; it evaluated at most its turn's new tokens.
        bound = plugd["evaluated"] + sum(_new(token_lists, turn) for turn in CANCELLED_TURNS)
        ratio = bound / fresh
        ttft_ratio = plugd["ttft"] / peer["ttft"]
        print(f"plugd prompt tokens evaluated: {plugd['evaluated']} in answered requests, at most {bound} with the "
              f"abandoned ones, of {fresh} new (ratio <= {ratio:.2f}, target <= {TARGET_PREFILL_RATIO}) "
              f"{_verdict(ratio <= TARGET_PREFILL_RATIO)}")
        print(f"median TTFT plugd/mlx_lm.server: {ttft_ratio:.2f} (target <= {TARGET_TTFT_RATIO}) "
              f"{_verdict(ttft_ratio <= TARGET_TTFT_RATIO)}")
        print(f"plugd runner peak RSS {bl.mib(peak)}; prompt cache {bl.mib(cache.get('bytes', 0))} in "
              f"{cache.get('nodes', 0)} nodes, budget {bl.mib(BUDGET)} {_verdict(cache.get('bytes', 0) <= BUDGET)}")
    return 0


def _verdict(ok: bool) -> str:
    return "OK" if ok else "MISSED"


if __name__ == "__main__":
    sys.exit(main())
