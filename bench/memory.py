"""Runner memory: peak RSS of a qwen3_moe load against its weight bytes, and RSS over a 2,000-token generation.

    .venv/bin/python bench/memory.py            # ~630 MB float32 MoE checkpoint, 2,000 generated tokens
    .venv/bin/python bench/memory.py --quick    # a tiny MoE, 50 tokens (the smoke test)

(a) plugd loads the checkpoint in its runner process; the runner's VmHWM (peak resident set, from
/proc/<pid>/status) right after the load is set against the checkpoint's weight bytes (target <= 1.15x),
next to mlx-lm's `load` of the same checkpoint in a child process of its own, and the VmHWM of a bare
interpreter that imported MLX (what no load can avoid).
(b) The runner's VmRSS is sampled every 10 ms while it generates 2,000 tokens at temperature 0.8 (a warm-up
generation first); the target is that it stays flat within 5% (max / min - 1 over the samples taken after
the first token). Both processes run with OpenBLAS preloaded.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import benchlib as bl

FULL = {"hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64,
        "intermediate_size": 1536, "num_experts": 32, "num_experts_per_tok": 4, "moe_intermediate_size": 384,
        "max_position_embeddings": 4096}
QUICK = {"num_experts": 8, "moe_intermediate_size": 64}
LOAD_TARGET, FLAT_TARGET = 1.15, 0.05
BARE = "import json, mlx.core, procfs; print(json.dumps(procfs.proc_status()))"


class RssSampler(threading.Thread):
    """Samples a process's VmRSS every `period` seconds, with the number of tokens streamed so far."""

    def __init__(self, pid: int, period: float = 0.01):
        super().__init__(daemon=True)
        self.pid, self.period = pid, period
        self.tokens = 0
        self.samples: list[tuple[int, int]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            self.samples.append((self.tokens, bl.proc_status(self.pid)["VmRSS"]))
            time.sleep(self.period)

    def stop(self) -> list[tuple[int, int]]:
        self.stopping.set()
        self.join()
        return self.samples


def load_figures(server, model_dir: Path, weight_bytes: int) -> int:
    """(a): returns the runner's pid."""
    started = time.perf_counter()
    bl.plugd_generate(server.url, "bench", "", {})  # Ollama's way to load a model without generating
    load_s = time.perf_counter() - started
    (runner,) = server.runner_pids()
    plugd = bl.proc_status(runner)
    with bl.MlxPeer(model_dir) as peer:
        peer_status = peer.loaded
    bare = json.loads(subprocess.run([sys.executable, "-c", BARE], env=bl.openblas_env(), cwd=bl.BENCH_DIR,
                                     capture_output=True, text=True, check=True).stdout)
    print(f"\n(a) load: weights {bl.mib(weight_bytes)}; bare interpreter with MLX imported: VmHWM {bl.mib(bare['VmHWM'])}")
    rows = [[name, bl.mib(hwm), bl.mib(hwm - weight_bytes), bl.mib(rss), f"{hwm / weight_bytes:.2f}", f"{seconds:.1f}"]
            for name, hwm, rss, seconds in (("plugd runner", plugd["VmHWM"], plugd["VmRSS"], load_s),
                                            ("mlx-lm load", peer_status["vmhwm"], peer_status["rss"], peer_status["load_s"]))]
    print(bl.table(["process", "VmHWM", "VmHWM-weights", "VmRSS", "VmHWM/weights", "load s"], rows))
    print(f"plugd runner after load: RssAnon {bl.mib(plugd['RssAnon'])}, RssFile {bl.mib(plugd['RssFile'])}; "
          f"BLAS: plugd runner {bl.blas_of(runner)}, mlx-lm {peer_status['blas']}")
    ratio = plugd["VmHWM"] / weight_bytes
    verdict = "OK" if ratio <= LOAD_TARGET else "ABOVE TARGET"
    print(f"ratio load peak RSS plugd/weights {ratio:5.2f}  (target <= {LOAD_TARGET:.2f}) {verdict}")
    print(f"ratio load peak RSS plugd/mlx-lm  {plugd['VmHWM'] / peer_status['vmhwm']:5.2f}")
    return runner


def generation_figures(server, runner: int, tokens: int, config: dict) -> None:
    """(b): RSS while generating `tokens` tokens after a warm-up generation."""
    options = {"temperature": 0.8, "seed": 7, "num_predict": tokens, "num_ctx": 4096}
    bl.plugd_generate(server.url, "bench", "Warm up the runner with", options | {"num_predict": 64})
    sampler = RssSampler(runner)
    sampler.start()
    try:
        final = bl.plugd_generate(server.url, "bench", "Once upon a time", options,
                                  on_token=lambda n: setattr(sampler, "tokens", n))
    finally:
        samples = sampler.stop()
    after = [rss for streamed, rss in samples if streamed >= 1]
    if not after:
        raise RuntimeError("no RSS sample was taken during generation")
    low, high = min(after), max(after)
    kv = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * config["head_dim"] * 4 * final["eval_count"]
    print(f"\n(b) generation: {final['eval_count']} tokens ({final['done_reason']}) at "
          f"{final['eval_count'] / (final['eval_duration'] / 1e9):.1f} tok/s, {len(after)} RSS samples after the first token")
    print(f"runner VmRSS: first {bl.mib(after[0])}, last {bl.mib(after[-1])}, min {bl.mib(low)}, max {bl.mib(high)}; "
          f"VmHWM after {bl.mib(bl.proc_status(runner)['VmHWM'])}; the KV cache of {final['eval_count']} tokens "
          f"holds {bl.mib(kv)}")
    if final["eval_count"] != tokens:
        print(f"WARNING: generated {final['eval_count']} tokens, not {tokens}")
    growth = high / low - 1
    verdict = "OK" if growth <= FLAT_TARGET else "ABOVE TARGET"
    print(f"ratio generation RSS max/min {1 + growth:5.3f}  (target <= {1 + FLAT_TARGET:.2f}) {verdict}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny MoE, 50 generated tokens")
    parser.add_argument("--tokens", type=int, help="tokens generated in (b) (default 2000, quick 50)")
    parser.add_argument("--layers", type=int, help="decoder layers of the full model (default 8: ~630 MB; 24: ~1.9 GB)")
    bl.add_vocab_option(parser)
    args = parser.parse_args()
    tokens = args.tokens or (50 if args.quick else 2000)
    bl.on_sigterm_exit()
    with tempfile.TemporaryDirectory(prefix="plugd-bench-") as tmp, ExitStack() as stack:
        model_dir = Path(tmp) / "model"
        shape = QUICK if args.quick else FULL | ({"num_hidden_layers": args.layers} if args.layers else {})
        info = bl.write_bench_checkpoint(model_dir, "qwen3_moe", shape, args.vocab)
        print(f"model: {bl.describe(info['config'], args.vocab)}: {info['params'] / 1e6:.1f}M parameters, "
              f"{bl.mib(info['weight_bytes'])} of weights")
        server = stack.enter_context(bl.plugd_server(Path(tmp) / "store", model_dir, "bench"))
        runner = load_figures(server, model_dir, info["weight_bytes"])
        generation_figures(server, runner, tokens, info["config"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
