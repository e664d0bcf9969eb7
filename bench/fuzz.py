"""The longer fuzz run: schemathesis against a live `plugd serve` with a tiny model, many cases per operation;
prints the requests sent and the server errors found (tests/test_fuzz.py is the bounded run in the suite).

    .venv/bin/python bench/fuzz.py [--examples 200] [--seed 1]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.fuzz import fuzz
from plugd.testing.server import LiveServer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200, help="cases per operation at most")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        checkpoint = write_checkpoint(root / "tiny", "qwen3")
        server = LiveServer(root / "models")
        try:
            (root / "Modelfile").write_text(f"FROM {checkpoint}\nPARAMETER num_predict 2\n")
            server.cli("create", "m", "-f", str(root / "Modelfile"), check=True)
            started = time.perf_counter()
            run = fuzz(server.url, args.examples, args.seed, timeout=6 * 3600)
            seconds = time.perf_counter() - started
        finally:
            server.stop()
    print(f"requests sent: {run.requests}, server errors: {run.server_errors}, "
          f"schemathesis exit status: {run.returncode}, {seconds:.0f} s")
    if run.returncode:
        print(run.output[-8000:])


if __name__ == "__main__":
    main()
