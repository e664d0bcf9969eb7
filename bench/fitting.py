"""Time to first token across the daemon-runner boundary, this tree against an older commit checked out beside it
(git worktree) in the same run: a long chat (one 4,000-token message, in a context of 8,192) and a 1,000-message
conversation that must be fitted into a context of 1,024 (Ollama's API drops its oldest turns until it fits).
Prints medians and old/new ratios.

    .venv/bin/python bench/fitting.py --baseline a400187 [--reps 5] [--quick]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.server import LiveServer

ROOT = Path(__file__).resolve().parents[1]
CONTEXT = 32768  # the checkpoint's trained maximum


def python_path(tree: Path) -> str:
    """Where a tree's packages are imported from: the core and every plugin distribution's folder."""
    folders = [tree / "core"] + sorted(p for kind in ("architectures", "renderers", "plugins")
                                       for p in (tree / kind).iterdir() if any(p.glob("plugd_*/__init__.py")))
    return ":".join(map(str, folders))


def words(count: int, seed: int) -> str:
    return " ".join(f"w{(seed * 7919 + i * 104729) % 5000}" for i in range(count))


# Each case has a model of its own, loaded once, with the context its Modelfile sets: a request never waits for a
# reload at another context length.
MODELFILES = {"chat": "PARAMETER num_ctx 8192\n", "fit": "PARAMETER num_ctx 1024\n"}


def long_chat(seed: int, size: int) -> dict:
    return {"model": "chat", "messages": [{"role": "user", "content": words(size, seed)}]}


def long_conversation(seed: int, messages: int) -> dict:
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{seed} {words(20, seed * 1000 + i)}"}
             for i in range(messages - 1)]
    return {"model": "fit", "messages": turns + [{"role": "user", "content": f"{seed} and now?"}]}


def client(url: str) -> httpx.Client:
    """One kept-alive connection per daemon, without Nagle's algorithm: httpx writes a request's headers and body
    apart, and Nagle would hold the body back until the daemon's delayed ACK (40 ms on Linux)."""
    nodelay = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
    return httpx.Client(base_url=url, transport=httpx.HTTPTransport(socket_options=nodelay), timeout=600)


def first_token_seconds(http: httpx.Client, body: dict) -> tuple[float, int]:
    """Seconds from sending a streamed /api/chat to its first line, and the prompt tokens it reported."""
    body = {"stream": True, "options": {"num_predict": 2, "temperature": 0}, **body}
    started = time.perf_counter()
    with http.stream("POST", "/api/chat", json=body) as response:
        response.raise_for_status()
        lines = response.iter_lines()
        next(lines)
        first = time.perf_counter() - started
        last = json.loads(list(lines)[-1])
    return first, last["prompt_eval_count"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="the older commit to compare with")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="1 repetition, a 900-token chat, 200 messages")
    args = parser.parse_args()
    reps, chat_words, messages = (1, 200, 200) if args.quick else (args.reps, 860, 1000)
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        baseline = root / "baseline"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(baseline), args.baseline],
                       check=True)
        try:
            checkpoint = write_checkpoint(root / "tiny", "qwen3", seed=0,
                                          overrides={"max_position_embeddings": CONTEXT})
            servers = {"old": LiveServer(root / "old", env={"PYTHONPATH": python_path(baseline)}),
                       "new": LiveServer(root / "new", env={"PYTHONPATH": python_path(ROOT)})}
            clients = {side: client(server.url) for side, server in servers.items()}
            try:
                for side, server in servers.items():
                    for name, parameters in MODELFILES.items():
                        (root / "Modelfile").write_text(f"FROM {checkpoint}\n{parameters}")
                        server.cli("create", name, "-f", str(root / "Modelfile"), check=True)
                    first_token_seconds(clients[side], long_chat(0, 10))  # loads the runners
                    first_token_seconds(clients[side], long_conversation(0, 3))
                results: dict[tuple[str, str], list[float]] = {}
                tokens: dict[tuple[str, str], int] = {}
                for rep in range(1, reps + 1):
                    for case, body in (("long chat", long_chat(rep, chat_words)),
                                       (f"{messages}-message fit", long_conversation(rep, messages))):
                        order = ("old", "new") if rep % 2 else ("new", "old")
                        for side in order:
                            seconds, prompt = first_token_seconds(clients[side], body)
                            results.setdefault((case, side), []).append(seconds)
                            tokens[(case, side)] = prompt
            finally:
                for http in clients.values():
                    http.close()
                for server in servers.values():
                    server.stop()
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(baseline)], check=False)
    print(f"baseline {args.baseline}, {reps} repetitions, medians")
    for case in dict.fromkeys(case for case, _ in results):
        old, new = (statistics.median(results[(case, side)]) for side in ("old", "new"))
        print(f"TTFT {case:<22} old {old * 1000:8.1f} ms  new {new * 1000:8.1f} ms  "
              f"(prompt tokens {tokens[(case, 'old')]} / {tokens[(case, 'new')]})")
        print(f"ratio TTFT {case} old/new {old / new:.2f}")


if __name__ == "__main__":
    main()
