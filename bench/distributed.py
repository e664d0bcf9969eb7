"""One model over a 2-rank runner group, split by tensors and into a pipeline, vs the same model in one process.

    .venv/bin/python bench/distributed.py           # an 813M Qwen3 (3.0 GiB), 128-token prompts, 16 tokens
    .venv/bin/python bench/distributed.py --quick   # a tiny model, a few tokens, one repetition (the smoke test)

Three plugd daemons serve the same checkpoint over HTTP in one run: in one process, and over two groups whose
host file names this machine twice (MLX's ring backend on loopback), one split by tensors and one into a
pipeline (PLUGD_GROUP_SPLIT). Each gets the same prompts (a first token of their own, so that no prompt cache
helps) at temperature 0, after a warm-up that loads the runners, in rotating order. Figures are medians.

Memory, the target: each rank's peak RSS (its high-water mark, loading and serving included) at most 0.6x of
the weights' bytes, which one process holds whole. RSS also holds what does not split: each process's Python,
MLX and HTTP runtime, the caches and activations of its layers, and the tensors every rank keeps whole; so the
checkpoint is large enough for half its weights to dominate. Reported beside it: what MLX holds for each rank
once loaded and at the load's peak (the group reports both in /api/ps), and the rest of the peak RSS. On one
2-core machine the two ranks share the cores and talk over loopback, so speed is reported, not targeted.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

import benchlib as bl
import httpx
from decode import QUICK
from procfs import proc_status

# 24 layers as bench/decode.py's checkpoint, twice as wide and with three times its MLP.
FULL = {"hidden_size": 1536, "num_hidden_layers": 24, "num_attention_heads": 24, "num_key_value_heads": 4,
        "head_dim": 64, "intermediate_size": 6144}
RANK_RSS_TARGET = 0.6  # of the weights' bytes, a rank's peak RSS
ALONE = "one process"
GROUPS = {"tensor group": "tensor", "pipeline group": "pipeline"}  # engine -> PLUGD_GROUP_SPLIT


def run(server, prompt: str, tokens: int, num_ctx: int) -> dict[str, float]:
    options = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": tokens, "num_ctx": num_ctx}
    final = bl.plugd_generate(server.url, "bench", prompt, options)
    client = final["client"]
    return {"prefill": final["prompt_eval_count"] / (final["prompt_eval_duration"] / 1e9),
            "decode": final["eval_count"] / (final["eval_duration"] / 1e9),
            "decode_client": (final["eval_count"] - 1) / (client["done"] - client["first"]), "ttft": client["first"],
            "text": final["text"]}


def ranks(server) -> list[dict[str, int]]:
    """Each rank's peak RSS and what MLX held for it once the model had loaded and at the load's peak; for one
    process, its runner's peak RSS."""
    model = httpx.get(f"{server.url}/api/ps").json()["models"][0]
    if "group" not in model:
        return [{"rss_peak": proc_status(pid)["VmHWM"]} for pid in server.runner_pids()]
    return [rank | {"rss_peak": proc_status(rank["pid"])["VmHWM"]} for rank in model["group"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args = bl.parse_run_args(parser, reps=2, tokens=16, prompt_tokens=128)
    reps, tokens, prompt_len = args.reps, args.tokens, args.prompt_tokens
    bl.on_sigterm_exit()

    with tempfile.TemporaryDirectory(prefix="plugd-bench-") as tmp, ExitStack() as stack:
        model_dir = Path(tmp) / "model"
        num_ctx = prompt_len + tokens + 16
        shape = (QUICK if args.quick else FULL) | {"max_position_embeddings": max(4096, num_ctx)}
        info = bl.write_bench_checkpoint(model_dir, "qwen3", shape)
        weights = info["weight_bytes"]
        print(f"model: {bl.describe(info['config'], 'tiny')}: {info['params'] / 1e6:.1f}M parameters, "
              f"{bl.mib(weights)} of weights")
        hosts = Path(tmp) / "hosts.json"
        hosts.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * 2))
        print(f"run: prompt {prompt_len} tokens, {tokens} generated tokens, temperature 0, 1 warm-up + {reps} "
              "repetitions; groups: 2 ranks, ring backend on loopback")
        prompts = bl.make_prompts(model_dir, reps + 1, prompt_len)
        servers = {ALONE: stack.enter_context(bl.plugd_server(Path(tmp) / "alone", model_dir, "bench"))}
        for engine, split in GROUPS.items():
            env = {"PLUGD_HOSTFILE": str(hosts), "PLUGD_GROUP_SPLIT": split}
            servers[engine] = stack.enter_context(bl.plugd_server(Path(tmp) / split, model_dir, "bench", env=env))
        results, same = bl.rounds(prompts, {name: (lambda text, ids, s=server: run(s, text, tokens, num_ctx))
                                            for name, server in servers.items()})
        print(f"greedy texts identical in all three in {same} of {len(prompts)} rounds")
        report(results, {name: ranks(server) for name, server in servers.items()}, weights)
    return 0


def report(results: dict[str, list[dict[str, float]]], memory: dict[str, list[dict[str, int]]], weights: int) -> None:
    def median(name: str, key: str) -> float:
        return bl.median([r[key] for r in results[name]])

    def held(rank: dict[str, int]) -> str:
        return f"{bl.mib(rank['mlx_bytes'])} ({bl.mib(rank['mlx_peak'])})" if "mlx_bytes" in rank else "-"

    rows = [[name, f"{median(name, 'prefill'):.1f}", f"{median(name, 'decode'):.1f}",
             f"{median(name, 'ttft') * 1000:.0f}", ", ".join(held(rank) for rank in memory[name]),
             ", ".join(bl.mib(rank["rss_peak"]) for rank in memory[name])] for name in results]
    print(bl.table(["engine", "prefill tok/s", "decode tok/s", "TTFT ms", "MLX holds per rank (load peak)",
                    "peak RSS per rank"], rows))
    print(f"weights: {bl.mib(weights)}")
    alone = memory[ALONE][0]["rss_peak"]
    print(f"{ALONE}: peak RSS {bl.mib(alone)}, {bl.mib(alone - weights)} beyond the weights")
    for engine in GROUPS:
        for key in ("prefill", "decode"):
            print(f"ratio {key} {engine}/{ALONE} {median(engine, key) / median(ALONE, key):.2f} "
                  "(reported, not targeted)")
        for number, rank in enumerate(memory[engine]):
            print(f"{engine} rank {number}: peak RSS {bl.mib(rank['rss_peak'])}, of which MLX's load peak "
                  f"{bl.mib(rank['mlx_peak'])} and {bl.mib(rank['rss_peak'] - rank['mlx_peak'])} besides")
            print(f"ratio {engine} rank {number} peak RSS/weights {rank['rss_peak'] / weights:.2f} "
                  f"(target <= {RANK_RSS_TARGET})")
            print(f"ratio {engine} rank {number} load peak/weights {rank['mlx_peak'] / weights:.2f}")


if __name__ == "__main__":
    sys.exit(main())
