"""Embedding throughput: plugd's /api/embed against sentence-transformers in-process (CPU torch), one checkpoint.

    .venv/bin/python bench/embeddings.py            # a MiniLM-sized Qwen3 (384 wide, 6 layers), 1,000 inputs of 4-32 words
    .venv/bin/python bench/embeddings.py --quick    # a tiny model and 50 inputs (the smoke test)

The checkpoint is written in the sentence-transformers layout (last-token pooling, normalised: Qwen3-Embedding's
pipeline) and both engines read the same directory. Each engine embeds the inputs once to warm up (plugd loads
its runner then), then `--reps` times, the order alternating; the figure is the median throughput in inputs per
second, plugd's seen by its HTTP client (one request holding every input). The vectors are compared too: the
lowest cosine between the two engines' vectors is printed.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import benchlib as bl
import numpy as np

from plugd.testing.embeddings import write_embedding_checkpoint

FULL = {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 6, "num_key_value_heads": 2,
        "head_dim": 64, "intermediate_size": 1536}
QUICK = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 16, "intermediate_size": 128}


def texts(count: int, longest: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(bl.WORDS) for _ in range(rng.randint(4, longest))) for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    bl.on_sigterm_exit()
    count, longest, reps = (50, 16, 1) if args.quick else (args.inputs, 32, args.reps)
    inputs = texts(count, longest)
    from sentence_transformers import SentenceTransformer  # after the arguments: it takes seconds to import

    with tempfile.TemporaryDirectory(prefix="plugd-bench-embed-") as tmp:
        checkpoint = write_embedding_checkpoint(Path(tmp) / "embedder", "qwen3", seed=1,
                                                overrides=QUICK if args.quick else FULL)
        reference = SentenceTransformer(str(checkpoint), device="cpu")
        with bl.plugd_server(Path(tmp) / "models", checkpoint, "embedder") as server:
            def plugd() -> np.ndarray:
                response = bl.HTTP.post(f"{server.url}/api/embed", json={"model": "embedder", "input": inputs})
                response.raise_for_status()
                return np.asarray(response.json()["embeddings"])

            def peer() -> np.ndarray:
                return reference.encode(inputs, convert_to_numpy=True)

            engines = {"plugd /api/embed": plugd, "sentence-transformers": peer}
            vectors = {name: run() for name, run in engines.items()}  # warm-up
            rates: dict[str, list[float]] = {name: [] for name in engines}
            for rep in range(reps):
                for name in (list(engines) if rep % 2 == 0 else list(reversed(engines))):
                    started = time.perf_counter()
                    vectors[name] = engines[name]()
                    rates[name].append(count / (time.perf_counter() - started))
    ours, theirs = vectors["plugd /api/embed"], vectors["sentence-transformers"]
    cosine = (ours * theirs).sum(-1) / (np.linalg.norm(ours, axis=-1) * np.linalg.norm(theirs, axis=-1))
    print(f"{count} inputs of 4-{longest} words, {reps} repetitions, medians")
    rows = [[name, f"{statistics.median(values):.1f} inputs/s"] for name, values in rates.items()]
    print(bl.table(["engine", "throughput"], rows))
    print(f"lowest cosine plugd/sentence-transformers {cosine.min():.6f}")
    ratio = statistics.median(rates["plugd /api/embed"]) / statistics.median(rates["sentence-transformers"])
    print(f"ratio throughput plugd/sentence-transformers {ratio:.2f}")


if __name__ == "__main__":
    main()
