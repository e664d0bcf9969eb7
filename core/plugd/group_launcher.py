"""Starts the ranks of a runner group and stands for them: `python -m plugd.group_launcher --hostfile FILE
--starting-port PORT --listing FILE -- RUNNER_ARGS...`.

Each host of the host file (plugd.scheduler.runner_group) runs this Python with RUNNER_ARGS as one rank of MLX's
ring backend, told its place the way the backend reads it: MLX_RANK, and MLX_HOSTFILE naming a file that lists
every rank's address and port (the listing, which another host copies to its temporary folder). A host named
"127.0.0.1" is this machine and runs its rank directly; any other is reached over ssh, with a terminal, so that
the rank ends with the connection. When one rank ends, the launcher
stops the others and exits with that rank's status: a group lives and dies whole.

This is what MLX's own `mlx.launch --backend ring` does, minus forwarding every rank's standard streams through
a select loop, which on Linux wakes without pause on the ranks' always-writable stdin pipes: 1.2 cores spent for
as long as a 2-rank group was loaded, idle. Here the ranks write to the launcher's own stdout and stderr, and it
sleeps in wait().
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

THIS_MACHINE = "127.0.0.1"


def ring(hosts: list[dict], first_port: int) -> list[list[str]]:
    """Each rank's listening addresses, one port per address, numbered on from `first_port`."""
    ports = iter(range(first_port, first_port + sum(len(host["ips"]) for host in hosts)))
    return [[f"{ip}:{next(ports)}" for ip in host["ips"]] for host in hosts]


def start(rank: int, host: str, listing: Path, runner: list[str]) -> subprocess.Popen:
    if host == THIS_MACHINE:
        env = os.environ | {"MLX_RANK": str(rank), "MLX_HOSTFILE": str(listing)}
        return subprocess.Popen([sys.executable, *runner], env=env, stdin=subprocess.DEVNULL)
    command = " ".join(map(shlex.quote, [sys.executable, *runner]))
    copy = f"${{TMPDIR:-/tmp}}/{listing.name}"
    script = (f"cd {shlex.quote(os.getcwd())} 2>/dev/null; printf %s {shlex.quote(listing.read_text())} > {copy}; "
              f"MLX_RANK={rank} MLX_HOSTFILE={copy} exec {command}")
    return subprocess.Popen(["ssh", "-tt", "-o", "LogLevel=QUIET", host, script], stdin=subprocess.DEVNULL)


def exit_status(status: int) -> int:
    """A shell's exit status for a wait() status: 128 + the signal for a rank that was killed."""
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plugd.group_launcher")
    parser.add_argument("--hostfile", type=Path, required=True)
    parser.add_argument("--starting-port", type=int, required=True)
    parser.add_argument("--listing", type=Path, required=True)
    parser.add_argument("runner", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    runner = args.runner[1:] if args.runner[:1] == ["--"] else args.runner
    entries = json.loads(args.hostfile.read_text())
    hosts = entries["hosts"] if isinstance(entries, dict) else entries
    args.listing.write_text(json.dumps(ring(hosts, args.starting_port)))
    ranks = {}
    for rank, host in enumerate(hosts):
        process = start(rank, host["ssh"], args.listing, runner)
        ranks[process.pid] = process
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        pid, status = os.wait()
        del ranks[pid]
        return exit_status(status)
    finally:
        for process in ranks.values():
            if process.poll() is None:
                process.terminate()
        for process in ranks.values():
            process.wait()


if __name__ == "__main__":
    sys.exit(main())
