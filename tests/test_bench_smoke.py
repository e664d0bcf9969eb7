"""The benchmarks in bench/ still run: each in its --quick mode (tiny model, few tokens, one repetition).

Only that they finish and print their ratio lines is checked; the figures themselves are not (timed
assertions have no place on shared, noisy machines).
"""

import re
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
    ],
)
def test_bench_quick(script, ratios):
    result = subprocess.run([sys.executable, str(BENCH / script), "--quick"], capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for ratio in ratios:
        assert re.search(ratio + r" +\d+\.\d+", result.stdout), f"no line matching {ratio!r} in:\n{output}"
    assert "WARNING" not in result.stdout, output
