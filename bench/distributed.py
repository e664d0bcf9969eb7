"""One model over a 2-rank runner group (MLX's ring backend on loopback) vs the same model in one process, in one run.

    .venv/bin/python bench/distributed.py           # bench/decode.py's ~150M Qwen3, 512-token prompts, 128 tokens
    .venv/bin/python bench/distributed.py --quick   # a tiny model, a few tokens, one repetition (the smoke test)

Both are plugd daemons serving the same checkpoint over HTTP; the group's comes from a host file naming this
machine twice. Each gets the same prompts (a first token of their own, so that no prompt cache helps) at
temperature 0, after a warm-up that loads the runners, in alternating order. Figures are medians.

Memory: what MLX holds for each rank once the model is loaded and at the load's peak (the group reports both
in /api/ps), against the weights' bytes, and each rank's peak RSS (its high-water mark, serving included, which
also holds its Python, MLX and HTTP runtime, caches and activations) against the one process's. The target is
memory, not speed: each rank's load peak at most 0.6x of the weights. On one 2-core
machine the two ranks share the cores and talk over loopback, so speed is reported, not targeted: the group
pays for two all_sums per layer and step, and gains nothing it could run in parallel.
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
from decode import write_model
from procfs import proc_status

RANK_MEMORY_TARGET = 0.6  # of the weights' bytes, what MLX holds for a rank at the load's peak


def run(server, prompt: str, tokens: int, num_ctx: int) -> dict[str, float]:
    options = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": tokens, "num_ctx": num_ctx}
    final = bl.plugd_generate(server.url, "bench", prompt, options)
    client = final["client"]
    return {"prefill": final["prompt_eval_count"] / (final["prompt_eval_duration"] / 1e9),
            "decode": final["eval_count"] / (final["eval_duration"] / 1e9),
            "decode_client": (final["eval_count"] - 1) / (client["done"] - client["first"]), "ttft": client["first"],
            "text": final["text"]}


def peaks(server) -> list[int]:
    """The peak RSS of each rank (of the one runner, for a single process), in rank order."""
    model = httpx.get(f"{server.url}/api/ps").json()["models"][0]
    pids = [rank["pid"] for rank in model["group"]] if "group" in model else server.runner_pids()
    return [proc_status(pid)["VmHWM"] for pid in pids]


def loaded(server) -> list[dict[str, int]]:
    """What MLX held for each rank once the model had loaded, and its peak until then (the group reports it)."""
    return httpx.get(f"{server.url}/api/ps").json()["models"][0]["group"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args = bl.parse_run_args(parser, reps=3, tokens=128, prompt_tokens=512)
    reps, tokens, prompt_len = args.reps, args.tokens, args.prompt_tokens
    bl.on_sigterm_exit()

    with tempfile.TemporaryDirectory(prefix="plugd-bench-") as tmp, ExitStack() as stack:
        model_dir = Path(tmp) / "model"
        num_ctx = prompt_len + tokens + 16
        write_model(model_dir, args.quick, "tiny", num_ctx)
        weights = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
        hosts = Path(tmp) / "hosts.json"
        hosts.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * 2))
        print(f"run: prompt {prompt_len} tokens, {tokens} generated tokens, temperature 0, 1 warm-up + {reps} "
              "repetitions; group: 2 ranks, ring backend on loopback")
        prompts = bl.make_prompts(model_dir, reps + 1, prompt_len)
        servers = {
            "one process": stack.enter_context(bl.plugd_server(Path(tmp) / "alone", model_dir, "bench")),
            "2-rank group": stack.enter_context(bl.plugd_server(Path(tmp) / "group", model_dir, "bench",
                                                                env={"PLUGD_HOSTFILE": str(hosts)})),
        }
        results, same = bl.rounds(prompts, {name: (lambda text, ids, s=server: run(s, text, tokens, num_ctx))
                                            for name, server in servers.items()})
        print(f"greedy texts identical in both in {same} of {len(prompts)} rounds")
        report(results, {name: peaks(server) for name, server in servers.items()}, loaded(servers["2-rank group"]),
               weights)
    return 0


def report(results: dict[str, list[dict[str, float]]], rss: dict[str, list[int]], ranks: list[dict[str, int]],
           weights: int) -> None:
    def median(name: str, key: str) -> float:
        return bl.median([r[key] for r in results[name]])

    rows = [[name, f"{median(name, 'prefill'):.1f}", f"{median(name, 'decode'):.1f}",
             f"{median(name, 'ttft') * 1000:.0f}", ", ".join(bl.mib(peak) for peak in rss[name])] for name in results]
    print(bl.table(["engine", "prefill tok/s", "decode tok/s", "TTFT ms", "peak RSS per rank"], rows))
    print(f"weights: {bl.mib(weights)}")
    for key in ("prefill", "decode"):
        print(f"ratio {key} group/one process {median('2-rank group', key) / median('one process', key):.2f} "
              "(reported, not targeted)")
    alone = rss["one process"][0]
    for rank, (peak, held) in enumerate(zip(rss["2-rank group"], ranks, strict=True)):
        print(f"rank {rank}: MLX holds {bl.mib(held['mlx_bytes'])} once loaded, {bl.mib(held['mlx_peak'])} at the "
              f"load's peak; peak RSS {bl.mib(peak)}")
        print(f"ratio rank {rank} load peak/weights {held['mlx_peak'] / weights:.2f} (target <= {RANK_MEMORY_TARGET})")
        print(f"ratio rank {rank} peak RSS/one process's {peak / alone:.2f}")


if __name__ == "__main__":
    sys.exit(main())
