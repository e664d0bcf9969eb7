"""Linux's /proc readings the daemon's memory accounting uses."""

from __future__ import annotations


def kib_field(path: str, name: str) -> int | None:
    """The bytes of a "Name:  N kB" line of a /proc file (meminfo, a process's status); None where there is none."""
    try:
        with open(path) as lines:
            for line in lines:
                if line.startswith(name + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
