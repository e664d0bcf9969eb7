"""Serving one model over several machines: the host file of a runner group, and the command that launches it.

The group is started by plugd.group_launcher on MLX's ring backend, from a host file in MLX's format: one
entry per rank, `{"ssh": host, "ips": [address, ...]}`, in a JSON list or under the "hosts" of an object (as
`mlx.distributed_config` writes it). Rank 0 is the first entry and must be
this machine ("127.0.0.1", which the launcher runs without ssh, or a name that reaches it); it serves the runner
protocol on the daemon's socket. The daemon imports nothing of MLX: the launcher is a separate program.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import attrs

from plugd.errors import PlugdError
from plugd.protocol import GROUP_BACKEND, GroupLayout

FIRST_PORT, LAST_PORT = 30000, 60000


class GroupError(PlugdError, RuntimeError):
    """A runner group cannot be started as configured."""


@attrs.frozen
class Hosts:
    """The ranks' hosts of a host file, in rank order (the names the launcher reaches them by), and how the models
    split across them (plugd.protocol: TENSOR, PIPELINE; None: tensor where the architecture says how, else
    pipeline)."""

    path: Path
    names: tuple[str, ...]
    split: str | None = None

    @classmethod
    def read(cls, path: Path, split: str | None = None) -> Hosts:
        """ValueError saying what is wrong with a file that is not a host file MLX's ring backend can use."""
        try:
            entries = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read the host file {path}: {exc}") from None
        if isinstance(entries, dict):  # the form mlx.distributed_config writes: backend ("" over Ethernet), envs, hosts
            if (entries.get("backend") or GROUP_BACKEND) != GROUP_BACKEND:
                raise ValueError(f"host file {path}: backend {entries['backend']!r}; plugd runs groups on the "
                                 f"{GROUP_BACKEND} backend only")
            entries = entries.get("hosts")
        if not isinstance(entries, list) or len(entries) < 2:
            raise ValueError(f"host file {path}: expected two or more hosts, one per rank (a JSON list, or an "
                             "object whose \"hosts\" is one)")
        names = []
        for rank, entry in enumerate(entries):
            if not isinstance(entry, dict) or not isinstance(entry.get("ssh"), str) or not entry.get("ips"):
                raise ValueError(f"host file {path}: rank {rank} needs \"ssh\" (a host name) and \"ips\" "
                                 "(its addresses): the ring backend connects the ranks by address")
            names.append(entry["ssh"])
        return cls(Path(path), tuple(names), split)

    def layout(self, files: dict[str, Path]) -> GroupLayout:
        """What the ranks are started with to serve the model of `files` (its blobs, by file name)."""
        return GroupLayout(str(self.path), len(self.names), {name: str(blob) for name, blob in files.items()},
                           self.split)


def launch_command(group: GroupLayout, runner: list[str], workdir: Path) -> list[str]:
    """The launcher's command line (plugd.group_launcher) that runs `runner` (arguments to this Python) as every
    rank of `group`, with the ranks' addresses listed in `workdir`."""
    port = free_ports(group.ranks)
    return [sys.executable, "-m", "plugd.group_launcher", "--hostfile", group.hostfile, "--starting-port", str(port),
            "--listing", str(workdir / f"ring-{port}.json"), "--", *runner]


def free_ports(count: int) -> int:
    """The first of `count` consecutive ports free on this machine: the ring listens on one per rank, and two
    groups (or two daemons) must not share them."""
    for first in range(FIRST_PORT, LAST_PORT, count):
        if all(_free(port) for port in range(first, first + count)):
            return first
    raise GroupError(f"no {count} consecutive free ports between {FIRST_PORT} and {LAST_PORT} for the ring")


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True
