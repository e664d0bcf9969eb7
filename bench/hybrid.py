"""Decode and prefill of a hybrid (Mamba2 + attention) model: plugd over HTTP vs mlx-lm in-process, in one run.

    .venv/bin/python bench/hybrid.py            # ~150M-parameter Nemotron-H, 512-token prompts, 64 tokens, 12 rounds
    .venv/bin/python bench/hybrid.py --quick    # a tiny Nemotron-H, a few tokens, one repetition (the smoke test)

The checkpoint is a float32 nemotron_h generated here: hidden 768, 33 layers in the Nemotron-H pattern
(Mamba2 and relu^2 MLP layers alternating, an attention layer every ninth), 24 Mamba2 heads of 64 with a
state of 128 in 8 groups, 12 attention heads (4 KV heads) of 64, MLP width 3072. As in bench/decode.py no
end-of-sequence token can win (benchlib.write_bench_checkpoint, completed here for Nemotron-H's names),
every engine gets the same prompts, a warm-up round comes first, and each prompt starts with a token of its
own. The engines are interleaved: each round runs one request on each, back to back, alternating which goes
first (ABBAAB...), so slow spells on a shared machine hit both sides alike.

Rates: prefill = prompt tokens / time to first token; decode = (tokens - 1) / (last token - first token),
both seen by each engine's client; plugd's also from its own eval_count / eval_duration and
prompt_eval_count / prompt_eval_duration (as Ollama clients read them), mlx-lm's from its generation_tps and
prompt_tps. Each is reported as the median and range over the rounds, and plugd/mlx-lm both as the ratio of
the medians and as the median of the rounds' own ratios; the target counts as met when both reach it.
Beside them, each side's CPU seconds per request (plugd: daemon and runner together), which other load on
the machine disturbs far less than wall-clock rates.

On a shared machine those rates swing from round to round, so the script also compares the two models
step by step in one process (OpenBLAS preloaded, the same weights): a prompt prefill per engine per
repetition, then decode steps alternating between the engines; the fastest step of each (least disturbed
by other load) and the median are compared.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import benchlib as bl
from decode import run_peer, run_plugd
from safetensors.numpy import load_file, save_file

FULL = {"hidden_size": 768, "hybrid_override_pattern": "M-M-M-M*-" * 3 + "M-M-M-", "num_attention_heads": 12,
        "num_key_value_heads": 4, "head_dim": 64, "mamba_num_heads": 24, "mamba_head_dim": 64, "ssm_state_size": 128,
        "n_groups": 8, "intermediate_size": 3072}
# The tiny base config of plugd.testing, with every kind of Nemotron-H layer but the MoE.
QUICK = {"hybrid_override_pattern": "M-M*M-"}
TARGET = 0.95


def guard_nemotron_names(model_dir: Path) -> None:
    """Complete benchlib's end-of-sequence guard for Nemotron-H's tensor names: the embedding sets hidden
    dimension 0, the final norm keeps it, and the Mamba2 output projections leave it alone as the attention
    and MLP output projections (already zeroed there) do."""
    file = model_dir / "model.safetensors"
    tensors = load_file(file)
    tensors["backbone.embeddings.weight"][:, 0] = 0.2
    tensors["backbone.norm_f.weight"][0] = 1.0
    for name, tensor in tensors.items():
        if name.endswith("mixer.out_proj.weight"):
            tensor[0, :] = 0.0
    save_file(tensors, file, metadata={"format": "pt"})


def compare_steps(model_dir: Path, prompt: list[int], steps: int, reps: int) -> dict[str, dict[str, list[float]]]:
    """Seconds per prefill and per decode step of plugd's and mlx-lm's model, measured in a child process
    with OpenBLAS preloaded (this script run with --compare-steps)."""
    command = [sys.executable, __file__, "--compare-steps", str(model_dir), json.dumps(prompt), str(steps), str(reps)]
    done = subprocess.run(command, env=bl.openblas_env(), capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def _timed_steps(model_dir: str, prompt: list[int], steps: int, reps: int) -> None:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model as load_reference

    from plugd import plugins
    from plugd.runner.loading import load_model

    ours = load_model(Path(model_dir), importlib.import_module(plugins.load().architectures()["nemotron_h"].module))
    theirs, _ = load_reference(Path(model_dir))
    engines = {"plugd": (ours, ours.make_cache), "mlx-lm": (theirs, lambda: make_prompt_cache(theirs))}
    times: dict[str, dict[str, list[float]]] = {name: {"prefill": [], "decode": []} for name in engines}

    def timed(name: str, model, tokens: mx.array, cache) -> mx.array:
        started = time.perf_counter()
        logits = model(tokens[None], cache)
        mx.eval(logits)
        if rep >= 0:  # repetition -1 warms up (compiles, allocates)
            times[name]["prefill" if tokens.size > 1 else "decode"].append(time.perf_counter() - started)
        return logits

    ids = mx.array(prompt, mx.int32)
    for rep in range(-1, reps):
        order = list(engines) if rep % 2 == 0 else list(reversed(engines))
        caches = {name: engines[name][1]() for name in order}
        next_token = {name: mx.argmax(timed(name, engines[name][0], ids, caches[name])[0, -1:], axis=-1)
                      for name in order}
        for _ in range(steps):
            for name in order:
                next_token[name] = mx.argmax(timed(name, engines[name][0], next_token[name], caches[name])[0], axis=-1)
    print(json.dumps(times))


def report_steps(times: dict[str, dict[str, list[float]]], prompt_len: int) -> None:
    rows, rates = [], {}
    for name, kinds in times.items():
        rates[name] = {f"{kind} ({how})": (prompt_len if kind == "prefill" else 1) / pick(kinds[kind])
                       for kind in ("decode", "prefill") for how, pick in (("fastest", min), ("median", statistics.median))}
        rows.append([name, *rates[name].values()])
    print("\nthe two models step by step in one process, tok/s:")
    print(bl.table(["engine", *rates["plugd"]], rows))
    print()
    for key in rates["plugd"]:
        ratio = rates["plugd"][key] / rates["mlx-lm"][key]
        print(f"ratio step {key:<17} plugd/mlx-lm in-process {ratio:5.2f}  (target >= {TARGET:.2f}) "
              f"{'OK' if ratio >= TARGET else 'BELOW TARGET'}")


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes have used so far (Linux /proc)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def with_cpu(engine: bl.Engine, pids: Callable[[], list[int]]) -> bl.Engine:
    """`engine`, its results extended by "cpu": the CPU seconds the processes `pids()` used while it ran."""

    def measured(text: str, ids: list[int]) -> dict[str, Any]:
        started = cpu_seconds(pids())
        return engine(text, ids) | {"cpu": cpu_seconds(pids()) - started}

    return measured


def spread(values: list[float], digits: int = 1) -> str:
    """Median with the lowest and highest value: how far the rounds swung."""
    return f"{bl.median(values):.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]" if values else "-"


RATES = (("decode (client)", "decode_client"), ("decode (own)", "decode_engine"),
         ("prefill (client)", "prefill_client"), ("prefill (own)", "prefill_engine"))


def report(results: dict[str, list[dict[str, Any]]], prompt_len: int, tokens: int, reps: int) -> None:
    """Per engine the median and range of each rate over the rounds, then plugd/mlx-lm ratios: of the medians,
    and the median of each round's own ratio (the two engines ran back to back, so a round's ratio sees the
    same machine load on both sides)."""
    for engine, runs in results.items():
        bl.check_token_counts(engine, runs, prompt_len, tokens)
        for r in runs:
            r["prefill_client"] = prompt_len / r["ttft"]
    print(f"\n{reps} rounds, tok/s as median [lowest-highest] (client-side unless marked 'own'):")
    headers = ["engine", *(kind for kind, _ in RATES)]
    print(bl.table(headers, [[engine, *(spread([r[key] for r in runs]) for _, key in RATES)]
                             for engine, runs in results.items()]))
    plugd, peer = results["plugd"], results["mlx-lm in-process"]
    print()
    for kind, key in RATES:
        of_medians = bl.median([r[key] for r in plugd]) / bl.median([r[key] for r in peer])
        paired = [a[key] / b[key] for a, b in zip(plugd, peer, strict=True)]
        verdict = "OK" if of_medians >= TARGET and bl.median(paired) >= TARGET else "BELOW TARGET"
        print(f"ratio {kind:<16} plugd/mlx-lm in-process {of_medians:5.2f} of medians, {spread(paired, 2)} per round "
              f"(target >= {TARGET:.2f}) {verdict}")
    cpu = [b["cpu"] / a["cpu"] for a, b in zip(plugd, peer, strict=True)]
    print(f"CPU seconds per request (prompt and decode; plugd: daemon and runner): plugd "
          f"{spread([r['cpu'] for r in plugd], 2)}, mlx-lm {spread([r['cpu'] for r in peer], 2)}")
    print(f"ratio CPU per request    mlx-lm/plugd {spread(cpu, 2)} per round (above 1: plugd used less; "
          f"load on a shared machine slows both sides' wall time far more than their CPU time)")
    own, client = bl.median([r["decode_engine"] for r in plugd]), bl.median([r["decode_client"] for r in plugd])
    print(f"plugd decode through HTTP vs its runner's own timing: {client / own:5.2f} "
          f"({(1 / client - 1 / own) * 1000:+.2f} ms per token); time after the runner's total_duration, median "
          f"{bl.median([r['overhead'] for r in plugd]) * 1000:.1f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare-steps", nargs=4, metavar=("MODEL_DIR", "PROMPT", "STEPS", "REPS"), help=argparse.SUPPRESS)
    args = bl.parse_run_args(parser, reps=12, tokens=64, prompt_tokens=512)
    if args.compare_steps:
        model_dir, prompt, steps, step_reps = args.compare_steps
        _timed_steps(model_dir, json.loads(prompt), int(steps), int(step_reps))
        return 0
    reps, tokens, prompt_len = args.reps, args.tokens, args.prompt_tokens
    bl.on_sigterm_exit()

    with tempfile.TemporaryDirectory(prefix="plugd-bench-") as tmp, ExitStack() as stack:
        model_dir = Path(tmp) / "model"
        info = bl.write_bench_checkpoint(model_dir, "nemotron_h", QUICK if args.quick else FULL)
        guard_nemotron_names(model_dir)
        config = info["config"]
        print(f"model: nemotron_h, float32, hidden {config['hidden_size']}, pattern {config['hybrid_override_pattern']}, "
              f"vocab {config['vocab_size']}: {info['params'] / 1e6:.1f}M parameters, {bl.mib(info['weight_bytes'])}")
        print(f"run: prompt {prompt_len} tokens, {tokens} generated tokens, temperature 0, 1 warm-up + {reps} repetitions")
        prompts = bl.make_prompts(model_dir, reps + 1, prompt_len)
        num_ctx = prompt_len + tokens + 16

        server = stack.enter_context(bl.plugd_server(Path(tmp) / "store", model_dir, "bench"))
        peer = stack.enter_context(bl.MlxPeer(model_dir))
        # The processes are looked up at each request: plugd's runner starts with the first one.
        results, same = bl.rounds(prompts, {
            "plugd": with_cpu(lambda text, ids: run_plugd(server, text, tokens, num_ctx),
                              lambda: [server.process.pid, *server.runner_pids()]),
            "mlx-lm in-process": with_cpu(lambda text, ids: run_peer(peer, ids, tokens), lambda: [peer.process.pid]),
        })
        print(f"greedy texts identical in both engines in {same} of {len(prompts)} rounds")
        runner = server.runner_pids()
        print(f"BLAS: plugd runner {bl.blas_of(runner[0]) if runner else '?'}; mlx-lm in-process {peer.loaded['blas']}")
        report(results, prompt_len, tokens, reps)
        report_steps(compare_steps(model_dir, prompts[0][1], tokens, reps), prompt_len)
    return 0


if __name__ == "__main__":
    sys.exit(main())
