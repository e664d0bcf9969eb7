"""Speculative decoding: plugd drafting against plugd plain and against mlx-lm's own speculative generation, one run.

    .venv/bin/python bench/speculative.py          # decode.py's 151.8M qwen3 and a draft of its first 2 layers
    .venv/bin/python bench/speculative.py --quick  # a tiny model, a few tokens (the smoke test)

The draft is the target's first 2 of 24 layers with its embedding, final norm and output head (13.4M of 151.8M
parameters, 8.8%). How often it agrees with the target is set by how much the target's later layers write into
the residual stream: their o_proj and down_proj are scaled by SCALES[pair]. "agreeing" (0.03) leaves the target
close to its first layers, and the draft's greedy token is the target's about 9 times in 10; "disagreeing" (1.0,
the target as written) about 1 time in 30. Each pair runs, on the same prompts and rotating which goes first:
plugd with drafting off (the option draft_tokens 0), plugd drafting (its depth adapting), and mlx-lm's
`stream_generate` with the draft at several fixed depths (num_draft_tokens: 3 is what mlx_lm.server and
mlx_lm.generate use unless told otherwise, 2 the library's default). Acceptance is the share of drafted tokens
kept: plugd's from /api/ps, mlx-lm's from its tokens marked from_draft.

Targets: decode >= 1.6x plain where acceptance is >= 80%, never below 0.95x plain where it is low, and >= 1.0x
mlx-lm's speculative rate on the same pair at its default depth. The ratio to mlx-lm at the best of the depths
tried, which its users would have to find for themselves, is reported beside it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import benchlib as bl
import httpx
from decode import write_model
from safetensors.numpy import load_file, save_file

DRAFT_LAYERS = 2
SCALES = {"agreeing": 0.03, "disagreeing": 1.0}
MLX_DEPTHS = (2, 3, 4, 6)
MLX_DEFAULT_DEPTH = 3  # mlx_lm.server's and mlx_lm.generate's --num-draft-tokens


def write_pair(tmp: Path, quick: bool, num_ctx: int) -> tuple[dict[str, Path], Path]:
    """The targets (by pair) and the draft: the base checkpoint's first layers."""
    base = tmp / "base"
    write_model(base, quick, "tiny", num_ctx)
    weights, config = load_file(base / "model.safetensors"), json.loads((base / "config.json").read_text())
    layers = min(DRAFT_LAYERS, config["num_hidden_layers"] - 1)
    draft = Path(shutil.copytree(base, tmp / "draft", ignore=shutil.ignore_patterns("model.safetensors")))
    save_file({name: tensor for name, tensor in weights.items() if _layer(name) < layers}, str(draft / "model.safetensors"))
    (draft / "config.json").write_text(json.dumps(config | {"num_hidden_layers": layers}))
    targets = {}
    for pair, scale in SCALES.items():
        target = targets[pair] = Path(shutil.copytree(base, tmp / pair, ignore=shutil.ignore_patterns("model.safetensors")))
        save_file({name: tensor * scale if _layer(name) >= layers and name.endswith(("o_proj.weight",
                   "down_proj.weight")) else tensor for name, tensor in weights.items()}, str(target / "model.safetensors"))
    draft_params = sum(t.size for name, t in weights.items() if _layer(name) < layers)
    print(f"draft: the first {layers} layers, {draft_params / 1e6:.1f}M parameters "
          f"({draft_params / sum(t.size for t in weights.values()):.1%} of the target's)")
    return targets, draft


def _layer(name: str) -> int:
    """The layer a tensor belongs to (-1 for the embedding, norm and head)."""
    parts = name.split(".")
    return int(parts[2]) if name.startswith("model.layers.") else -1


def drafting(url: str) -> dict[str, int]:
    models = httpx.get(f"{url}/api/ps", timeout=30).json()["models"]
    return models[0].get("drafting", {"drafted": 0, "kept": 0}) if models else {"drafted": 0, "kept": 0}


def run_plugd(url: str, text: str, tokens: int, num_ctx: int, draft_tokens: int) -> dict[str, Any]:
    before = drafting(url)
    options = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": tokens, "num_ctx": num_ctx,
               "draft_tokens": draft_tokens}
    final = bl.plugd_generate(url, "bench", text, options)
    after, client = drafting(url), final["client"]
    drafted = after["drafted"] - before["drafted"]
    return {"decode_client": (final["eval_count"] - 1) / (client["last"] - client["first"]), "text": final["text"],
            "tokens": final["eval_count"], "acceptance": (after["kept"] - before["kept"]) / drafted if drafted else None}


def run_peer(peer: bl.MlxPeer, ids: list[int], tokens: int, depth: int) -> dict[str, Any]:
    r = peer.ask(tokens=ids, max_tokens=tokens, num_draft_tokens=depth)
    # Each round yields the drafts kept, then one token of the target's own: the rounds are the tokens not from the
    # draft, and each proposed `depth` (the last perhaps fewer).
    rounds = r["tokens"] - r["from_draft"]
    return {"decode_client": (r["tokens"] - 1) / (r["last"] - r["first"]), "text": r["text"], "tokens": r["tokens"],
            "acceptance": r["from_draft"] / (rounds * depth) if rounds > 0 else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args = bl.parse_run_args(parser, reps=3, tokens=128, prompt_tokens=256)
    reps, tokens, prompt_len = args.reps, args.tokens, args.prompt_tokens
    bl.on_sigterm_exit()
    with tempfile.TemporaryDirectory(prefix="plugd-bench-") as tmp:
        num_ctx = prompt_len + tokens + 16
        targets, draft = write_pair(Path(tmp), args.quick, num_ctx)
        print(f"run: prompt {prompt_len} tokens, {tokens} generated tokens, temperature 0, 1 warm-up + {reps} "
              "repetitions per pair")
        prompts = bl.make_prompts(targets["agreeing"], 2 * (reps + 1), prompt_len)
        summary = {pair: measure(Path(tmp) / f"store-{pair}", target, draft,
                                 prompts[index * (reps + 1) : (index + 1) * (reps + 1)], tokens, num_ctx)
                   for index, (pair, target) in enumerate(targets.items())}
        report(summary, args.quick)
    return 0


def measure(store: Path, target: Path, draft: Path, prompts: list[tuple[str, list[int]]], tokens: int,
            num_ctx: int) -> dict[str, dict[str, float]]:
    """Each engine's median decode rate and acceptance on one pair."""
    print(f"\n{target.name} pair:")
    with bl.plugd_server(store, target, "bench", draft=draft) as server, bl.MlxPeer(target, draft) as peer:
        engines = {"plugd plain": lambda text, ids: run_plugd(server.url, text, tokens, num_ctx, 0),
                   "plugd drafting": lambda text, ids: run_plugd(server.url, text, tokens, num_ctx, 8)}
        engines |= {f"mlx-lm speculative k={k}": lambda text, ids, k=k: run_peer(peer, ids, tokens, k)
                    for k in MLX_DEPTHS}
        results, same = bl.rounds(prompts, engines)
    print(f"greedy texts identical in every engine in {same} of {len(prompts)} rounds")
    return {engine: {key: bl.median([r[key] for r in runs if r[key] is not None]) for key in ("decode_client", "acceptance")}
            for engine, runs in results.items()}


def report(summary: dict[str, dict[str, dict[str, float]]], quick: bool) -> None:
    rows = [[pair, engine, figures["decode_client"], figures["acceptance"] * 100]
            for pair, engines in summary.items() for engine, figures in engines.items()]
    print()
    print(bl.table(["pair", "engine", "decode tok/s", "acceptance %"], rows))
    print()
    for pair, engines in summary.items():
        plugd, plain = engines["plugd drafting"], engines["plugd plain"]["decode_client"]
        best = max((figures["decode_client"], engine) for engine, figures in engines.items() if engine.startswith("mlx"))
        target = 1.6 if plugd["acceptance"] >= 0.8 else 0.95
        ratio = plugd["decode_client"] / plain
        accepted = "nothing drafted" if plugd["acceptance"] != plugd["acceptance"] else f"{plugd['acceptance']:.0%} kept"
        print(f"ratio {pair} plugd drafting/plain {ratio:5.2f} ({accepted})  "
              f"(target >= {target:.2f}) {'OK' if ratio >= target else 'BELOW TARGET'}")
        ratio = plugd["decode_client"] / engines[f"mlx-lm speculative k={MLX_DEFAULT_DEPTH}"]["decode_client"]
        print(f"ratio {pair} plugd drafting/mlx-lm speculative k={MLX_DEFAULT_DEPTH} (mlx-lm's default) {ratio:5.2f}  "
              f"(target >= 1.00) {'OK' if ratio >= 1.0 else 'BELOW TARGET'}")
        print(f"ratio {pair} plugd drafting/{best[1]} (mlx-lm's best) {plugd['decode_client'] / best[0]:5.2f}  "
              "(reported)")
    if quick:
        print("(quick: a tiny model on few tokens; the figures say nothing about speed)")


if __name__ == "__main__":
    sys.exit(main())
