"""The longer fuzz run: schemathesis against a live `plugd serve` with a tiny model, many cases per operation;
prints the requests sent and the server errors found (tests/test_fuzz.py is the bounded run in the suite).

    .venv/bin/python bench/fuzz.py [--examples 200] [--seed 1]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from benchlib import tiny_model_server

from plugd.testing.fuzz import fuzz


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200, help="cases per operation at most")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch, tiny_model_server(Path(scratch), "PARAMETER num_predict 2\n") as server:
        started = time.perf_counter()
        run = fuzz(server.url, args.examples, args.seed, timeout=6 * 3600)
        seconds = time.perf_counter() - started
    print(f"requests sent: {run.requests}, server errors: {run.server_errors}, "
          f"schemathesis exit status: {run.returncode}, {seconds:.0f} s")
    if run.returncode:
        print(run.output[-8000:])


if __name__ == "__main__":
    main()
