"""Decode, prefill and time to first token: plugd over HTTP vs mlx-lm in-process vs mlx_lm.server, in one run.

    .venv/bin/python bench/decode.py            # ~150M-parameter Qwen3, 512-token prompts, 128 tokens, 5 repetitions
    .venv/bin/python bench/decode.py --quick    # a tiny model, a few tokens, one repetition (the smoke test)
    .venv/bin/python bench/decode.py --vocab qwen3   # the same body with the real 151k Qwen3 vocabulary (384M)

Every engine gets the same prompts (same token ids, checked) and generates the same number of tokens at
temperature 0 on a checkpoint where no end-of-sequence token can win. A warm-up round (which also loads
plugd's runner) comes first; the repetitions rotate the engines' order, and each prompt starts with a token
of its own so that no prompt cache helps. Figures are medians over the repetitions.

Rates: prefill = prompt tokens / time to first token; decode = (tokens - 1) / (last token - first token),
both seen by the client of each engine (for plugd, up to its final line). plugd's decode is also read from
its own eval_count/eval_duration, and mlx-lm's in-process one from its generation_tps (the same definition:
N tokens over N-1 intervals).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import benchlib as bl

FULL = {"hidden_size": 768, "num_hidden_layers": 24, "num_attention_heads": 12, "num_key_value_heads": 4,
        "head_dim": 64, "intermediate_size": 2048}
QUICK = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 16, "intermediate_size": 128}
TARGETS = {"mlx-lm in-process": 0.95, "mlx_lm.server": 1.0}


def write_model(model_dir: Path, quick: bool, vocab: str, num_ctx: int) -> None:
    """This benchmark's checkpoint (QUICK or FULL) for contexts up to `num_ctx`, described on stdout."""
    shape = (QUICK if quick else FULL) | {"max_position_embeddings": max(4096, num_ctx)}
    info = bl.write_bench_checkpoint(model_dir, "qwen3", shape, vocab)
    print(f"model: {bl.describe(info['config'], vocab)}: {info['params'] / 1e6:.1f}M parameters, "
          f"{bl.mib(info['weight_bytes'])} of weights")


def run_plugd(server, prompt: str, tokens: int, num_ctx: int) -> dict[str, Any]:
    options = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": tokens, "num_ctx": num_ctx}
    final = bl.plugd_generate(server.url, "bench", prompt, options)
    client = final["client"]
    return {"prompt_tokens": final["prompt_eval_count"], "tokens": final["eval_count"], "ttft": client["first"],
            "decode_client": (final["eval_count"] - 1) / (client["done"] - client["first"]),
            "decode_engine": final["eval_count"] / (final["eval_duration"] / 1e9),
            "prefill_engine": final["prompt_eval_count"] / (final["prompt_eval_duration"] / 1e9),
            "overhead": client["done"] - final["total_duration"] / 1e9, "text": final["text"]}


def run_peer(peer: bl.MlxPeer, ids: list[int], tokens: int) -> dict[str, Any]:
    r = peer.ask(tokens=ids, max_tokens=tokens)
    return {"prompt_tokens": r["prompt_tokens"], "tokens": r["tokens"], "ttft": r["first"],
            "decode_client": (r["tokens"] - 1) / (r["last"] - r["first"]),
            "decode_engine": r["generation_tps"], "prefill_engine": r["prompt_tps"], "text": r["text"]}


def run_server(url: str, prompt: str, tokens: int) -> dict[str, Any]:
    r = bl.mlx_server_generate(url, prompt, tokens)
    usage = r["usage"]
    return {"prompt_tokens": usage.get("prompt_tokens"), "tokens": usage.get("completion_tokens"), "ttft": r["first"],
            "decode_client": (usage["completion_tokens"] - 1) / (r["last"] - r["first"]), "text": r["text"]}


def summarize(results: dict[str, list[dict[str, Any]]], prompt_len: int, tokens: int) -> dict[str, dict[str, float]]:
    summary = {}
    for engine, runs in results.items():
        bl.check_token_counts(engine, runs, prompt_len, tokens)
        summary[engine] = {key: bl.median([r[key] for r in runs]) for key in runs[0]
                           if key not in ("prompt_tokens", "tokens", "text")}
        summary[engine]["prefill_client"] = prompt_len / summary[engine]["ttft"]
    return summary


def report(summary: dict[str, dict[str, float]], reps: int) -> None:
    nan = float("nan")
    rows = [[engine, s["decode_client"], s.get("decode_engine", nan), s["prefill_client"], s.get("prefill_engine", nan),
             s["ttft"] * 1000] for engine, s in summary.items()]
    print(f"\nmedians of {reps} repetitions (client-side unless marked 'own'):")
    print(bl.table(["engine", "decode tok/s", "decode own", "prefill tok/s", "prefill own", "TTFT ms"], rows))
    plugd = summary["plugd"]
    print(f"\nplugd decode, own eval_count/eval_duration: {plugd['decode_engine']:.1f} tok/s; "
          f"client-side stream timing: {plugd['decode_client']:.1f} tok/s")
    print(f"plugd HTTP + daemon overhead per request (client wall time - total_duration): {plugd['overhead'] * 1000:.1f} ms")
    print()
    for peer, target in TARGETS.items():
        for kind, key in (("decode (client)", "decode_client"), ("decode (plugd own)", "decode_engine")):
            ratio = plugd[key] / summary[peer]["decode_client"]
            verdict = "OK" if ratio >= target else "BELOW TARGET"
            print(f"ratio {kind:<18} plugd/{peer:<17} {ratio:5.2f}  (target >= {target:.2f}) {verdict}")
        prefill = plugd["prefill_client"] / summary[peer]["prefill_client"]
        ttft = plugd["ttft"] / summary[peer]["ttft"]
        print(f"ratio prefill            plugd/{peer:<17} {prefill:5.2f}  (TTFT ratio {ttft:.2f}, lower is better)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bl.add_vocab_option(parser)
    args = bl.parse_run_args(parser, reps=5, tokens=128, prompt_tokens=512)
    reps, tokens, prompt_len = args.reps, args.tokens, args.prompt_tokens
    bl.on_sigterm_exit()

    with tempfile.TemporaryDirectory(prefix="plugd-bench-") as tmp, ExitStack() as stack:
        model_dir = Path(tmp) / "model"
        num_ctx = prompt_len + tokens + 16
        write_model(model_dir, args.quick, args.vocab, num_ctx)
        print(f"run: prompt {prompt_len} tokens, {tokens} generated tokens, temperature 0, 1 warm-up + {reps} repetitions")
        prompts = bl.make_prompts(model_dir, reps + 1, prompt_len)

        server = stack.enter_context(bl.plugd_server(Path(tmp) / "store", model_dir, "bench"))
        peer = stack.enter_context(bl.MlxPeer(model_dir))
        url, mlx_server = stack.enter_context(bl.mlx_lm_server(model_dir))
        results, same = bl.rounds(prompts, {
            "plugd": lambda text, ids: run_plugd(server, text, tokens, num_ctx),
            "mlx-lm in-process": lambda text, ids: run_peer(peer, ids, tokens),
            "mlx_lm.server": lambda text, ids: run_server(url, text, tokens),
        })
        print(f"greedy texts identical in all three engines in {same} of {len(prompts)} rounds "
              f"(where not, float32 rounding flipped a near tie)")
        runner = server.runner_pids()
        print(f"BLAS: plugd runner {bl.blas_of(runner[0]) if runner else '?'}; mlx-lm in-process {peer.loaded['blas']}; "
              f"mlx_lm.server {bl.blas_of(mlx_server.pid)}")
        report(summarize(results, prompt_len, tokens), reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
