"""The benchmarks in bench/ still run: each in its --quick mode (tiny model, few tokens, one repetition).

Only that they finish and print their ratio lines is checked; the figures themselves are not (timed
assertions have no place on shared, noisy machines).
"""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[1] / "bench"


@pytest.mark.parametrize(
    "script, ratios",
    [
        ("decode.py", [r"ratio decode \(client\) +plugd/mlx-lm in-process", r"ratio decode \(client\) +plugd/mlx_lm.server",
                       r"ratio decode \(plugd own\) +plugd/mlx-lm in-process", r"ratio prefill +plugd/mlx_lm.server"]),
        ("memory.py", [r"ratio load peak RSS plugd/weights", r"ratio load peak RSS plugd/mlx-lm",
                       r"ratio generation RSS max/min"]),
        ("constrained.py", [r"ratio decode \(client, llguidance\) constrained/free",
                            r"ratio TTFT \(llguidance\) new schema/free",
                            r"ratio decode \(client, xgrammar\) constrained/free",
                            r"ratio TTFT \(xgrammar\) new schema/free"]),
        ("fitting.py --baseline HEAD", [r"ratio TTFT long chat old/new", r"ratio TTFT 200-message fit old/new"]),
        ("embeddings.py", [r"ratio throughput plugd/sentence-transformers", r"lowest cosine plugd/sentence-transformers"]),
        ("distributed.py", [rf"ratio {key} {group} group/one process" for key in ("prefill", "decode")
                            for group in ("tensor", "pipeline")]
                           + [rf"ratio {group} group rank {rank} {what}/weights" for group in ("tensor", "pipeline")
                              for rank in (0, 1) for what in ("peak RSS", "load peak")]),
        ("speculative.py", [r"ratio agreeing plugd drafting/plain", r"ratio disagreeing plugd drafting/plain",
                            r"ratio agreeing plugd drafting/mlx-lm speculative k=3 \(mlx-lm's default\)",
                            r"ratio agreeing plugd drafting/mlx-lm speculative k=\d \(mlx-lm's best\)"]),
        ("concurrency.py", [r"ratio aggregate decode at 4 streams plugd/plugd single stream",
                            r"ratio aggregate decode at 4 streams plugd/mlx_lm.server",
                            r"ratio TTFT p99 at 4 streams plugd/mlx_lm.server"]),
    ],
)
def test_bench_quick(script, ratios):
    # A session of its own, so that a hung run is killed together with the servers and runners it started.
    name, *options = script.split()
    bench = subprocess.Popen([sys.executable, str(BENCH / name), *options, "--quick"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = bench.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(bench.pid, signal.SIGKILL)
        stdout, stderr = bench.communicate()
        pytest.fail(f"{script} --quick did not finish in 120 s:\n{stdout}{stderr}")
    output = stdout + stderr
    assert bench.returncode == 0, output
    for ratio in ratios:
        assert re.search(ratio + r" +\d+\.\d+", stdout), f"no line matching {ratio!r} in:\n{output}"
    assert "WARNING" not in stdout, output


def test_pull_bench_quick():
    bench = subprocess.Popen([sys.executable, str(BENCH / "pull.py"), "--quick"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = bench.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(bench.pid, signal.SIGKILL)  # the registry and daemons it started go with it
        pytest.fail(f"pull.py --quick did not finish in 120 s:\n{bench.communicate()[0]}")
    assert bench.returncode == 0, output
    assert re.search(r"ratio plugd/curl +\d+\.\d+", output), output
    assert re.search(r"ratio plugd/snapshot_download +\d+\.\d+", output), output


def test_hybrid_bench_quick():
    test_bench_quick("hybrid.py", [r"ratio decode \(client\) +plugd/mlx-lm in-process",
                                   r"ratio prefill \(client\) +plugd/mlx-lm in-process"])
