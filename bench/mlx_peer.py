"""The in-process peer: mlx-lm's own `load` and `stream_generate` in a child process the benchmarks drive.

    python bench/mlx_peer.py MODEL_DIR [DRAFT_DIR]

loads the model (and a draft model), prints one JSON line (load time, BLAS, VmHWM after load), then answers JSON
lines on stdin: {"tokens": [...], "max_tokens": N} -> one JSON line with token count, mlx-lm's own rates and the
time of the first and last token as seen from this loop; with "num_draft_tokens": K, mlx-lm's own speculative
generation with the draft, K tokens a round, and how many tokens came from the draft. Imports nothing but mlx-lm
and /proc readers, so the memory it reports is mlx-lm's.
"""

from __future__ import annotations

import json
import sys
import time

from procfs import blas_of, proc_status


def main(model_dir: str, draft_dir: str | None = None) -> None:
    started = time.perf_counter()
    import mlx.core as mx
    from mlx_lm import load, stream_generate

    model, tokenizer = load(model_dir)
    draft = None if draft_dir is None else load(draft_dir)[0]
    status = proc_status()
    print(json.dumps({"load_s": time.perf_counter() - started, "blas": blas_of(), "vmhwm": status["VmHWM"],
                      "rss": status["VmRSS"], "mlx_active": mx.get_active_memory()}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        first = last = None
        count = drafted = 0
        response = None
        text = []
        speculative = {"draft_model": draft, "num_draft_tokens": request["num_draft_tokens"]} if request.get(
            "num_draft_tokens") else {}
        begun = time.perf_counter()
        for response in stream_generate(model, tokenizer, prompt=request["tokens"], max_tokens=request["max_tokens"],
                                        **speculative):
            now = time.perf_counter()
            first = first or now
            last = now
            count += 1
            drafted += bool(response.from_draft)
            text.append(response.text)
        print(json.dumps({
            "tokens": count, "prompt_tokens": response.prompt_tokens, "finish_reason": response.finish_reason,
            "prompt_tps": response.prompt_tps, "generation_tps": response.generation_tps,
            "first": first - begun, "last": last - begun, "text": "".join(text), "from_draft": drafted,
        }), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
