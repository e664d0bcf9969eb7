"""Concurrent streams: plugd batching vs plugd one request at a time vs mlx_lm.server (its batching on), in one run.

    .venv/bin/python bench/concurrency.py           # bench/decode.py's ~150M Qwen3, 1/4/8/16 streams
    .venv/bin/python bench/concurrency.py --quick   # a tiny model, 1/2/4 streams, a few tokens (the smoke test)

For each engine and each number of streams N, N clients start together, each with a prompt of its own (a
different first token, so no prompt cache helps), and stream the same number of tokens at temperature 0 on a
checkpoint where no end-of-sequence token can win. Engines run one after the other, never at once.

Aggregate decode = the tokens after each stream's first, summed over the streams, over the time from the first
stream's first token to the last stream's last; burst = every token of every stream over the time from the start
to the last stream's last token (prefills included, however an engine orders them); TTFT is per stream, from its
start. Peak RSS is the serving
process's high-water mark (plugd's runner; mlx_lm.server's one process) after all its runs.

plugd batching runs with PLUGD_NUM_PARALLEL set to the most streams, plugd one-at-a-time with 1 (the engine as it
was before batching: each request waits for the ones before it). mlx_lm.server runs with its defaults
(--decode-concurrency 32, --prompt-concurrency 8).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import benchlib as bl
from decode import write_model

TARGETS_AT = 8  # the number of streams the targets are read at


def plugd_stream(url: str, prompt: str, tokens: int, num_ctx: int) -> dict[str, Any]:
    options = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": tokens, "num_ctx": num_ctx}
    final = bl.plugd_generate(url, "bench", prompt, options)
    return {"tokens": final["eval_count"], "first": final["client"]["first"], "last": final["client"]["last"]}


def server_stream(url: str, prompt: str, tokens: int) -> dict[str, Any]:
    r = bl.mlx_server_generate(url, prompt, tokens)
    return {"tokens": r["usage"]["completion_tokens"], "first": r["first"], "last": r["last"]}


def burst(stream, prompts: list[str]) -> dict[str, float]:
    """All prompts streamed at once, one thread each; the burst's aggregate decode and TTFTs."""
    results: list[dict[str, Any] | BaseException] = [None] * len(prompts)
    go = threading.Barrier(len(prompts) + 1)

    def client(i: int) -> None:
        go.wait()
        started = time.perf_counter()
        try:
            r = stream(prompts[i])
            results[i] = r | {"first": started + r["first"], "last": started + r["last"]}
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            results[i] = exc

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    began = time.perf_counter()
    go.wait()
    for thread in threads:
        thread.join()
    for r in results:
        if isinstance(r, BaseException):
            raise r
    last = max(r["last"] for r in results)
    span = last - min(r["first"] for r in results)
    ttfts = sorted(r["first"] - began for r in results)
    return {"decode": sum(r["tokens"] - 1 for r in results) / span, "burst": sum(r["tokens"] for r in results) / (
            last - began), "ttft_p50": percentile(ttfts, 50),
            "ttft_p99": percentile(ttfts, 99), "tokens": [r["tokens"] for r in results]}


def percentile(sorted_values: list[float], q: float) -> float:
    """The nearest-rank percentile."""
    rank = max(1, -(-len(sorted_values) * q // 100))
    return sorted_values[int(rank) - 1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bl.add_vocab_option(parser)
    args = bl.parse_run_args(parser, reps=1, tokens=64, prompt_tokens=256)
    counts = [1, 2, 4] if args.quick else [1, 4, 8, 16]
    tokens, prompt_len = args.tokens, args.prompt_tokens
    bl.on_sigterm_exit()

    with tempfile.TemporaryDirectory(prefix="plugd-bench-") as tmp, ExitStack() as stack:
        model_dir = Path(tmp) / "model"
        num_ctx = prompt_len + tokens + 16
        write_model(model_dir, args.quick, args.vocab, num_ctx)
        print(f"run: {counts} concurrent streams, prompts of {prompt_len} tokens, {tokens} tokens each, temperature 0")
        # The same prompts for each engine (each has its own server and caches), all different within one.
        texts = [text for text, _ in bl.make_prompts(model_dir, 1 + sum(counts), prompt_len)]

        def measure(name: str, stream, pid_of) -> tuple[dict[int, dict[str, float]], int]:
            prompts = iter(texts)
            burst(stream, [next(prompts)])  # warm-up: loads the model
            figures = {}
            for n in counts:
                figures[n] = burst(stream, [next(prompts) for _ in range(n)])
                if any(count != tokens for count in figures[n]["tokens"]):
                    raise RuntimeError(f"{name}: streams ended early: {figures[n]['tokens']}")
            return figures, bl.proc_status(pid_of())["VmHWM"]

        results = {}
        for name, parallel in (("plugd batching", max(counts)), ("plugd one at a time", 1)):
            with bl.plugd_server(Path(tmp) / f"store-{parallel}", model_dir, "bench",
                                 env={"PLUGD_NUM_PARALLEL": str(parallel)}) as server:
                results[name] = measure(name, lambda prompt, url=server.url: plugd_stream(url, prompt, tokens, num_ctx),
                                        lambda server=server: server.runner_pids()[0])
        url, process = stack.enter_context(bl.mlx_lm_server(model_dir))
        results["mlx_lm.server"] = measure("mlx_lm.server", lambda prompt: server_stream(url, prompt, tokens),
                                           lambda: process.pid)
        report(results, counts, args.quick)
    return 0


def report(results: dict[str, tuple[dict[int, dict[str, float]], int]], counts: list[int], quick: bool) -> None:
    rows = [[name, str(n), figures[n]["decode"], figures[n]["burst"], figures[n]["ttft_p50"] * 1000,
             figures[n]["ttft_p99"] * 1000, bl.mib(peak) if n == counts[-1] else ""]
            for name, (figures, peak) in results.items() for n in counts]
    print()
    headers = ["engine", "streams", "aggregate decode tok/s", "burst tok/s", "TTFT p50 ms", "TTFT p99 ms", "peak RSS"]
    print(bl.table(headers, rows))
    at = TARGETS_AT if TARGETS_AT in counts else counts[-1]
    batched, single, peer = (results[name][0] for name in ("plugd batching", "plugd one at a time", "mlx_lm.server"))
    print()
    checks = [
        (f"aggregate decode at {at} streams plugd/plugd single stream", batched[at]["decode"] / single[1]["decode"], 3.0),
        (f"aggregate decode at {at} streams plugd/mlx_lm.server", batched[at]["decode"] / peer[at]["decode"], 1.1),
        ("single-stream decode plugd batching/one at a time", batched[1]["decode"] / single[1]["decode"], 0.95),
    ]
    for label, ratio, target in checks:
        print(f"ratio {label:<58} {ratio:5.2f}  (target >= {target:.2f}) {'OK' if ratio >= target else 'BELOW TARGET'}")
    burst = batched[at]["burst"] / peer[at]["burst"]
    print(f"ratio {f'burst tok/s at {at} streams plugd/mlx_lm.server':<58} {burst:5.2f}  (reported, no target)")
    ttft = batched[at]["ttft_p99"] / peer[at]["ttft_p99"]
    print(f"ratio {f'TTFT p99 at {at} streams plugd/mlx_lm.server':<58} {ttft:5.2f}  (target <= 1.50) "
          f"{'OK' if ttft <= 1.5 else 'ABOVE TARGET'}")
    runner = results["plugd batching"][1] / results["mlx_lm.server"][1]
    print(f"ratio {'peak RSS plugd runner/mlx_lm.server':<58} {runner:5.2f}")
    if quick:
        print("(quick: a tiny model on few tokens; the figures say nothing about speed)")


if __name__ == "__main__":
    sys.exit(main())
