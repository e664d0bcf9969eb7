"""The load run at full size: 128 streaming clients at once across the four dialects, a tenth of them leaving
mid-stream, several rounds against one live `plugd serve` with a tiny model; prints each round's outcome and the
daemon's open files and resident memory after it (tests/test_load.py is the bounded run in the suite).

    .venv/bin/python bench/load.py [--clients 128] [--rounds 10] [--tokens 8]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from benchlib import tiny_model_server

from plugd.testing.load import load_round, settled_figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=10, help="measured rounds, after one warm-up round")
    parser.add_argument("--tokens", type=int, default=8, help="tokens each client asks for")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch, tiny_model_server(Path(scratch)) as server:
        print("round  seconds  completed  disconnected  errors  open files  resident MiB")
        first = None
        failures = 0
        for index in range(args.rounds + 1):
            result = asyncio.run(load_round(server.url, "m", args.clients, tokens=args.tokens))
            figures = asyncio.run(settled_figures(server.process.pid, server.url))
            first = first or (figures if index == 1 else None)
            failures += len(result.errors)
            label = "warm-up" if index == 0 else str(index)
            print(f"{label:>7}  {result.seconds:7.1f}  {result.completed:9}  {result.disconnected:12}  "
                  f"{len(result.errors):6}  {figures.open_files:10}  {figures.resident / 2**20:12.2f}")
            for error in result.errors[:5]:
                print("   ", error)
        errors_logged = [line for line in server.log().splitlines() if " ERROR " in line or "Traceback" in line]
    print(f"after round 1 -> round {args.rounds}: open files {first.open_files} -> {figures.open_files}, "
          f"resident {first.resident / 2**20:.2f} -> {figures.resident / 2**20:.2f} MiB "
          f"({(figures.resident - first.resident) / 2**10:+.0f} KiB); client errors {failures}, "
          f"daemon log errors {len(errors_logged)}")


if __name__ == "__main__":
    main()
