"""What the benchmarks share: checkpoints that cannot stop early, prompts, the processes under test, /proc readings.

Every process started here is a context manager that kills and reaps it on the way out, failure or not.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from procfs import blas_of, proc_status  # noqa: F401  (re-exported for the scripts)

from plugd.blas import with_openblas
from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.server import LiveServer, free_port

BENCH_DIR = Path(__file__).resolve().parent
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec "
         "romeo sierra tango uniform victor whiskey xray yankee zulu").split()
EOS_GUARD = 1e4  # weight that keeps end-of-sequence tokens out of reach (see `write_bench_checkpoint`)
HTTP = httpx.Client(timeout=None)  # one client, kept: making one costs tens of milliseconds (SSL context)


def on_sigterm_exit() -> None:
    """Turn SIGTERM into SystemExit, so the `finally` blocks that stop child processes run."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def openblas_env() -> dict[str, str]:
    """This environment with the system OpenBLAS set up as plugd does for its runners."""
    return with_openblas(os.environ)


def _die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM when the benchmark dies, even by SIGKILL (Linux)."""
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


# ---- checkpoints -------------------------------------------------------------------------------------------------

def _tensors(path: Path) -> tuple[int, dict[str, dict[str, Any]]]:
    """(data start, header) of a .safetensors file."""
    with path.open("rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return 8 + size, header


def write_bench_checkpoint(path: Path, model_type: str, overrides: dict[str, Any], vocab: str = "tiny") -> dict[str, Any]:
    """A random float32 checkpoint on which no end-of-sequence token can ever be sampled.

    Hidden dimension 0 carries a constant: the embedding sets it, no layer writes to it (its rows of every
    o_proj and down_proj are zero), so after the final norm it is positive for every token. The lm_head rows
    of the EOS ids weigh it by -EOS_GUARD, which puts their logits hundreds below the rest: generation runs to
    its token limit at any temperature, in every engine alike. The ids past the tokenizer's vocabulary (the
    model's vocab_size rounds it up) are kept out the same way, since engines write them differently (plugd
    and `tokenizers` as "", mlx-lm's streaming detokenizer as "!"). Returns sizes for the report.
    """
    from tokenizers import Tokenizer

    write_checkpoint(path, model_type, seed=0, dtype="float32", tokenizer=vocab, overrides=overrides)
    config = json.loads((path / "config.json").read_text())
    generation = json.loads((path / "generation_config.json").read_text())
    known = Tokenizer.from_file(str(path / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    eos = {config["eos_token_id"], *generation["eos_token_id"]}
    guarded = eos | set(range(known, config["vocab_size"]))
    file = path / "model.safetensors"
    start, header = _tensors(file)
    data = np.memmap(file, dtype=np.uint8, mode="r+")
    params = 0
    for name, info in header.items():
        assert info["dtype"] == "F32", name
        begin, end = info["data_offsets"]
        tensor = data[start + begin : start + end].view(np.float32).reshape(info["shape"])
        params += tensor.size
        if name == "model.embed_tokens.weight":
            tensor[:, 0] = 0.2
        elif name == "model.norm.weight":
            tensor[0] = 1.0
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            tensor[0, :] = 0.0
        elif name == "lm_head.weight":
            tensor[sorted(guarded), 0] = -EOS_GUARD
    data.flush()
    del data
    return {"params": params, "weight_bytes": params * 4, "eos": sorted(eos), "config": config}


def describe(config: dict[str, Any], vocab: str) -> str:
    tokenizer = "the small BPE plugd.testing trains" if vocab == "tiny" else f"the real {vocab} vocabulary (qwen_vocab)"
    keys = ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "num_experts", "num_experts_per_tok", "moe_intermediate_size", "vocab_size"]
    shape = ", ".join(f"{k.replace('num_', '').replace('_size', '')}={config[k]}" for k in keys if k in config)
    return f"{config['model_type']}, float32, {shape}; tokenizer: {tokenizer}"


# ---- prompts ------------------------------------------------------------------------------------------------------

def make_prompts(model_dir: Path, count: int, length: int) -> list[tuple[str, list[int]]]:
    """`count` (text, token ids) prompts of exactly `length` tokens whose text tokenizes back to the same ids.

    Each starts with a different first token, so no engine can reuse another prompt's cached prefix.
    """
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    prompts: list[tuple[str, list[int]]] = []
    rng = random.Random(1234)
    while len(prompts) < count:
        opener = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(3)).capitalize()
        text = opener + " " + " ".join(rng.choice(WORDS) for _ in range(length))
        ids = tokenizer.encode(text).ids[:length]
        text = tokenizer.decode(ids)
        if len(ids) == length and tokenizer.encode(text).ids == ids and all(ids[0] != p[1][0] for p in prompts):
            prompts.append((text, ids))
    return prompts


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [headers] + [[v if isinstance(v, str) else "-" if v != v else f"{v:,.1f}" for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in cells]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


# ---- command line and rounds -------------------------------------------------------------------------------------------

def add_vocab_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vocab", choices=["tiny", "qwen3"], default="tiny",
                        help="tokenizer: plugd.testing's small BPE (default) or the real 151k Qwen3 vocabulary")


def parse_run_args(parser: argparse.ArgumentParser, reps: int, tokens: int, prompt_tokens: int) -> argparse.Namespace:
    """Adds --quick, --reps, --tokens and --prompt-tokens to `parser`, parses the command line and fills in
    args.reps, args.tokens and args.prompt_tokens: the given full-run defaults, or 1, 8 and 32 with --quick."""
    parser.add_argument("--quick", action="store_true", help="tiny model, few tokens, one repetition")
    parser.add_argument("--reps", type=int, help=f"repetitions after the warm-up (default {reps}, quick 1)")
    parser.add_argument("--tokens", type=int, help=f"tokens generated per request (default {tokens}, quick 8)")
    parser.add_argument("--prompt-tokens", type=int, help=f"prompt length in tokens (default {prompt_tokens}, quick 32)")
    args = parser.parse_args()
    args.reps = args.reps or (1 if args.quick else reps)
    args.tokens = args.tokens or (8 if args.quick else tokens)
    args.prompt_tokens = args.prompt_tokens or (32 if args.quick else prompt_tokens)
    return args


Engine = Callable[[str, list[int]], dict[str, Any]]


def rounds(prompts: list[tuple[str, list[int]]], engines: dict[str, Engine]) -> tuple[dict[str, list[dict[str, Any]]], int]:
    """Each (text, ids) prompt through every engine, rotating which goes first; round 0 is a warm-up whose results
    are dropped. Returns each engine's results, and in how many rounds all engines generated the same text."""
    names = list(engines)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    same = 0
    for i, (text, ids) in enumerate(prompts):
        outputs = {}
        for name in names[i % len(names):] + names[: i % len(names)]:
            result = engines[name](text, ids)
            outputs[name] = result["text"].removeprefix(" ")  # mlx-lm's detokenizer drops a leading space
            if i:
                results[name].append(result)
        same += len(set(outputs.values())) == 1
        rates = ", ".join(f"{name} {results[name][-1]['decode_client']:.1f} tok/s" for name in names) if i else "done"
        print(f"round {i}{' (warm-up)' if i == 0 else ''}: {rates}", flush=True)
    return results, same


def check_token_counts(engine: str, runs: list[dict[str, Any]], prompt_len: int, tokens: int) -> None:
    """Warns where an engine's runs did not take `prompt_len` prompt tokens and generate `tokens`."""
    counts = {(r["prompt_tokens"], r["tokens"]) for r in runs}
    if counts != {(prompt_len, tokens)}:
        print(f"WARNING: {engine} ran (prompt, generated) tokens {sorted(counts)}, not {(prompt_len, tokens)}")


# ---- processes --------------------------------------------------------------------------------------------------------

@contextmanager
def plugd_server(models: Path, model_dir: Path, name: str, env: dict[str, str] | None = None,
                 draft: Path | None = None) -> Iterator[LiveServer]:
    """A `plugd serve` on a free port (`env` added to its environment) with `model_dir` imported as `name` (with the
    draft model in `draft`); stops it and its runners afterwards."""
    models.mkdir(parents=True, exist_ok=True)
    server = LiveServer(models, env={"PLUGD_KEEP_ALIVE": "-1", "PLUGD_LOG_LEVEL": "WARNING"} | (env or {}), timeout=60)
    runners: set[int] = set()
    try:
        server.cli("create", name, "--from", str(model_dir), *(["--draft", str(draft)] if draft else []), check=True)
        yield server
        runners.update(server.runner_pids())
    finally:
        runners.update(server.runner_pids())
        server.stop()
        for pid in runners:  # the daemon kills its runners when it stops; make sure of it
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@contextmanager
def tiny_model_server(root: Path, parameters: str = "") -> Iterator[LiveServer]:
    """A `plugd serve` holding model "m": a tiny random qwen3 checkpoint, with these Modelfile lines."""
    checkpoint = write_checkpoint(root / "tiny", "qwen3")
    server = LiveServer(root / "models")
    try:
        (root / "Modelfile").write_text(f"FROM {checkpoint}\n{parameters}")
        server.cli("create", "m", "-f", str(root / "Modelfile"), check=True)
        yield server
    finally:
        server.stop()


def plugd_generate(url: str, model: str, prompt: str, options: dict[str, Any], on_token=None) -> dict[str, Any]:
    """Stream /api/generate (raw); the final line plus client-side times: first token, last token, done."""
    body = {"model": model, "prompt": prompt, "raw": True, "stream": True, "options": options}
    started = time.perf_counter()
    first = last = None
    chunks, text = 0, []
    with HTTP.stream("POST", f"{url}/api/generate", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line:
                continue
            data = json.loads(line)
            if "error" in data:
                raise RuntimeError(f"plugd: {data['error']}")
            now = time.perf_counter()
            if data.get("done"):
                first, last = first or now, last or now
                return data | {"text": "".join(text), "client": {"first": first - started, "last": last - started,
                                                                  "done": now - started, "chunks": chunks}}
            chunks += 1
            text.append(data.get("response", ""))
            first = first or now
            last = now
            if on_token:
                on_token(chunks)
    raise RuntimeError("plugd: the stream ended without a final line")


@contextmanager
def mlx_lm_server(model_dir: Path, timeout: float = 120) -> Iterator[tuple[str, subprocess.Popen]]:
    """`mlx_lm.server` on a free port, OpenBLAS preloaded; yields (url, process)."""
    port = free_port()
    log = (model_dir.parent / f"mlx_lm-server-{port}.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "mlx_lm", "server", "--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "WARNING"],
        env=openblas_env(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mlx_lm.server did not start:\n{Path(log.name).read_text(errors='replace')}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        yield url, process
    finally:
        stop_process(process)
        log.close()


def mlx_server_generate(url: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """Stream /v1/completions at temperature 0; client-side times and the usage it reports."""
    body = {"model": "default_model", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    first = last = None
    usage: dict[str, Any] = {}
    text = []
    with HTTP.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            now = time.perf_counter()
            usage = data.get("usage") or usage
            if data.get("choices") and data["choices"][0].get("text") is not None:
                text.append(data["choices"][0]["text"])
                first = first or now
                last = now
    return {"usage": usage, "text": "".join(text), "first": first - started, "last": last - started,
            "done": time.perf_counter() - started}


class MlxPeer:
    """mlx-lm in a child process (OpenBLAS preloaded, like plugd's runner), driven by JSON lines (bench/mlx_peer.py)."""

    def __init__(self, model_dir: Path, draft_dir: Path | None = None):
        self.process = subprocess.Popen(
            [sys.executable, str(BENCH_DIR / "mlx_peer.py"), str(model_dir), *([str(draft_dir)] if draft_dir else [])],
            env=openblas_env(), text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, preexec_fn=_die_with_parent,
        )
        try:
            self.loaded = self._read()
        except BaseException:
            self.close()
            raise

    def _read(self) -> dict[str, Any]:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"mlx-lm peer exited with {self.process.wait()}")
        return json.loads(line)

    def ask(self, **request: Any) -> dict[str, Any]:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        stop_process(self.process)

    def __enter__(self) -> MlxPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def stop_process(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
