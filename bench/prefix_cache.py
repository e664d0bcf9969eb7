"""Prompt caching over a replayed agent session: plugd (prefix-cache plugin) vs mlx_lm.server, in one run.

    .venv/bin/python bench/prefix_cache.py            # ~150M-parameter Qwen3, 30 turns, ~8k tokens
    .venv/bin/python bench/prefix_cache.py --quick    # a tiny model, the same session shape (the smoke test)
    .venv/bin/python bench/prefix_cache.py --quick --policy single-slot   # plugd's built-in policy instead

The session is what a coding agent sends: a long system prompt, then per turn the transcript so far plus a
runtime system message that the next turn drops again (it follows each tool result, and only the latest one is
kept), so every prompt departs from the previous one a little before its end. Two turns carry a large tool
result whose first request the client abandons partway through the prefill (a client timeout) and retries.
Both engines get the same raw prompt texts and generate a few tokens at temperature 0.

Both engines run side by side and get every turn one after the other, the first alternating, so that a
machine whose load swings weighs on both alike; each is warmed up first. mlx_lm.server keeps its own prompt
cache (on by default: it reuses the nearest cached prefix, trimming a longer one), and an abandoned request is
dropped the same way for both (the client closes the connection at the same moment). mlx_lm.server finishes an
abandoned prefill (it notices the closed connection at its next write) and caches it; plugd stops it at the next
chunk and keeps what it computed.

Reported: prompt tokens each engine evaluated in its answered requests (plugd's prompt_eval_count,
mlx_lm.server's prompt tokens less its cached_tokens), and plugd's bound with the abandoned requests (each
evaluated at most its turn's new tokens) against the tokens no earlier prompt began with; median time to first
token of each engine, plugd's split into the engine's share (prompt_eval_duration) and the rest (HTTP, daemon,
tokenizing); peak RSS of plugd's runner and of mlx_lm.server, and plugd's prompt cache bytes against the budget
(PLUGD_PREFIX_CACHE_BYTES, set here).
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

from plugd.runner.cache_policy import common_prefix

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
    return len(tokens) - max((common_prefix(tokens, earlier) for earlier in token_lists[:turn]), default=0)


def abandon(url: str, path: str, body: dict[str, Any], after_s: float) -> None:
    """Send a streamed request and drop the connection `after_s` seconds in, as a client timeout does."""
    try:
        with httpx.stream("POST", f"{url}{path}", json=body, timeout=httpx.Timeout(after_s)) as response:
            for _ in response.iter_lines():
                pass
    except httpx.TimeoutException:
        pass


def plugd_turn(server, prompt: str, options: dict[str, Any], cancel_after: float | None) -> dict[str, float]:
    """One turn against plugd (abandoned once first when `cancel_after` is set): client TTFT, the engine's own
    share of it (resume, prefill, first token: prompt_eval_duration), and the prompt tokens it evaluated."""
    if cancel_after is not None:
        body = {"model": "bench", "prompt": prompt, "raw": True, "stream": True, "options": options}
        abandon(server.url, "/api/generate", body, cancel_after)
    final = bl.plugd_generate(server.url, "bench", prompt, options)
    return {"ttft": final["client"]["first"], "engine": final["prompt_eval_duration"] / 1e9,
            "evaluated": final["prompt_eval_count"]}


def mlx_server_turn(url: str, prompt: str, cancel_after: float | None) -> dict[str, float]:
    """The same turn against mlx_lm.server (its own prompt cache on, as by default): client TTFT and the prompt
    tokens it evaluated (prompt tokens less the cached ones its usage reports)."""
    if cancel_after is not None:
        body = {"model": "default_model", "prompt": prompt, "max_tokens": GENERATED, "temperature": 0.0,
                "stream": True}
        abandon(url, "/v1/completions", body, cancel_after)
    answer = bl.mlx_server_generate(url, prompt, GENERATED)
    usage = answer["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"ttft": answer["first"], "evaluated": usage["prompt_tokens"] - cached}


def replay(server, mlx_url: str, prompts: list[str], num_ctx: int,
           new: list[int]) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """Every turn to both engines, one after the other, the first alternating: a machine whose load swings (a
    shared one) weighs on both alike. Each engine is warmed up first on a prompt of its own. An abandoned turn is
    dropped by both at the same moment: halfway through its `new` tokens at plugd's prefill rate so far."""
    options = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": GENERATED, "num_ctx": num_ctx}
    bl.plugd_generate(server.url, "bench", "Warm up", options)
    bl.mlx_server_generate(mlx_url, "Warm up", GENERATED)
    ours, theirs = [], []
    for turn, prompt in enumerate(prompts):
        cancel_after = None
        if turn in CANCELLED_TURNS:
            rate = sum(done["evaluated"] for done in ours) / sum(done["engine"] for done in ours)
            cancel_after = new[turn] / rate / 2
        plugd_first = turn % 2 == 0
        if plugd_first:
            ours.append(plugd_turn(server, prompt, options, cancel_after))
        theirs.append(mlx_server_turn(mlx_url, prompt, cancel_after))
        if not plugd_first:
            ours.append(plugd_turn(server, prompt, options, cancel_after))
    return ours, theirs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model")
    parser.add_argument("--policy", help="plugd's cache policy (PLUGD_CACHE_POLICY); default: the plugin's")
    args = parser.parse_args()
    bl.on_sigterm_exit()
    os.environ["PLUGD_PREFIX_CACHE_BYTES"] = str(BUDGET)
    os.environ.pop("PLUGD_CACHE_POLICY", None)
    if args.policy:
        os.environ["PLUGD_CACHE_POLICY"] = args.policy

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
        new = [_new(token_lists, turn) for turn in range(TURNS)]
        fresh = sum(new)
        num_ctx = len(token_lists[-1]) + GENERATED + 64
        print(f"session: {TURNS} turns, last prompt {len(token_lists[-1])} tokens, {fresh} new tokens in all, "
              f"turns {CANCELLED_TURNS} abandoned once halfway through their prefill and retried; plugd's cache policy: "
              f"{args.policy or 'the default (prefix-cache when installed)'}")

        server = stack.enter_context(bl.plugd_server(Path(tmp) / "store", model_dir, "bench"))
        url, peer_process = stack.enter_context(bl.mlx_lm_server(model_dir))
        ours, theirs = replay(server, url, prompts, num_ctx, new)
        runner = server.runner_pids()
        peak = bl.proc_status(runner[0])["VmHWM"] if runner else float("nan")
        peer_peak = bl.proc_status(peer_process.pid)["VmHWM"]
        cache = httpx.get(f"{server.url}/api/ps").json()["models"][0].get("prompt_cache", {})

        ttft, peer_ttft = (bl.median([turn["ttft"] for turn in runs]) for runs in (ours, theirs))
        engine = bl.median([turn["engine"] for turn in ours])
        outside = bl.median([turn["ttft"] - turn["engine"] for turn in ours])
        print(bl.table(["engine", "median TTFT ms", "prompt tokens evaluated", "peak RSS MiB"], [
            ["plugd", ttft * 1000, sum(turn["evaluated"] for turn in ours), peak / 2**20],
            ["mlx_lm.server", peer_ttft * 1000, sum(turn["evaluated"] for turn in theirs), peer_peak / 2**20]]))
        print(f"plugd per turn, median: {engine * 1000:,.1f} ms in the engine (resume, prefill, first token), "
              f"{outside * 1000:,.1f} ms outside it (HTTP, daemon, tokenizing); "
              f"evaluated tokens are in answered requests only")
        # An abandoned request reports nothing; it evaluated at most its turn's new tokens.
        evaluated = sum(turn["evaluated"] for turn in ours)
        bound = evaluated + sum(new[turn] for turn in CANCELLED_TURNS)
        ratio = bound / fresh
        ttft_ratio = ttft / peer_ttft
        print(f"plugd prompt tokens evaluated: {evaluated} in answered requests, at most {bound} with the "
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
