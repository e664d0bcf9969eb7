"""A runner group: one model served by several ranks of MLX's distributed engine (plugd.group_launcher).

Rank 0 leads: it loads its share of the model like the others, serves the
runner protocol to the daemon, and decides. The other ranks follow: each runs
the same engine as the leader, given the same turns (plugd.runner.turns), so
that every collective the split model runs meets its counterparts on every
rank. Two things the followers cannot work out alike are the leader's to
decide and to share: what arrives and what is cancelled between two steps
(`share`), and each token drawn (`agree`), since the ranks' samplers are seeded
apart and their float results may differ in the last bit across machines.

A follower with nothing to do waits for the leader's next turn. The ring
backend's receive polls without sleeping (a whole core, for as long as the
model stays loaded), so the leader rings a doorbell of its own, a plain TCP
connection to each follower, before every turn it shares, and an idle
follower sleeps in recv() until it does.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from plugd.protocol import GROUP_BACKEND

DOORBELL_TIMEOUT = 60.0  # seconds for the followers to connect to the leader's doorbell once the ring is up


class Group:
    """This process's place in the group; every method is a collective, called by every rank in the same order."""

    def __init__(self, group: mx.distributed.Group):
        self.group = group
        self.rank, self.size = group.rank(), group.size()
        self.leads = self.rank == 0
        self._doorbells = self._connected_doorbells()

    @classmethod
    def joined(cls) -> Group:
        """The group plugd.group_launcher started this process in (its environment says where the others are)."""
        return cls(mx.distributed.init(backend=GROUP_BACKEND, strict=True))

    def share(self, value: Any = None) -> Any:
        """The leader's `value`, on every rank; the others' is ignored. RuntimeError where a rank is gone. None
        costs one collective (its length, 0), anything else two."""
        self._ring()
        return self._sent(value, sender=0)

    def agree(self, token: mx.array) -> mx.array:
        """The leader's `token` on every rank, lazily: decoding dispatches it with the next step. A follower adds
        its own token times zero, not fresh zeros, so that its graph, like the leader's, runs the step's
        collectives before this one: the ranks must meet at every collective in the same order."""
        return mx.distributed.all_sum(token if self.leads else token * 0, group=self.group)

    def gathered(self, value: Any) -> list[Any]:
        """Every rank's `value`, in rank order, on every rank (two collectives)."""
        data = np.frombuffer(pickle.dumps(value), np.uint8)
        lengths = self._gathered(np.array([len(data)], np.int64))
        padded = np.zeros(int(lengths.max()), np.uint8)
        padded[: len(data)] = data
        rows = self._gathered(padded).reshape(self.size, -1)
        return [pickle.loads(row[:length].tobytes()) for row, length in zip(rows, lengths, strict=True)]

    def ranks(self) -> list[dict[str, Any]]:
        """Each rank's host name, process id, and what MLX holds for it and has held at most (asked once the
        model is loaded: its share of the weights, and the load's peak), in rank order."""
        return self.gathered({"rank": self.rank, "host": socket.gethostname(), "pid": os.getpid(),
                              "mlx_bytes": mx.get_active_memory(), "mlx_peak": mx.get_peak_memory()})

    def _connected_doorbells(self) -> list[socket.socket]:
        """The leader's connection to each follower, or a follower's to the leader, made on the address the leader
        listens on for the ring (the first in the ring's listing)."""
        address = json.loads(Path(os.environ["MLX_HOSTFILE"]).read_text())[0][0].rsplit(":", 1)[0]
        if self.leads:
            with socket.create_server((address, 0)) as listener:
                listener.settimeout(DOORBELL_TIMEOUT)
                self._sent(listener.getsockname()[1], sender=0)
                doorbells = [listener.accept()[0] for _ in range(self.size - 1)]
        else:
            doorbells = [socket.create_connection((address, self._sent(None, sender=0)), DOORBELL_TIMEOUT)]
        for doorbell in doorbells:
            doorbell.settimeout(None)
            doorbell.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return doorbells

    def _ring(self) -> None:
        """The leader rings each follower's doorbell; a follower waits for its own to ring."""
        try:
            if self.leads:
                for doorbell in self._doorbells:
                    doorbell.sendall(b"\0")
            elif not self._doorbells[0].recv(1):
                raise RuntimeError("the leader hung up")
        except OSError as exc:
            raise RuntimeError(f"a doorbell failed: {exc}") from None

    def _sent(self, value: Any, sender: int) -> Any:
        """`sender`'s value, pickled, as the sum of its bytes and the other ranks' zeros."""
        sending = sender == self.rank
        data = pickle.dumps(value) if sending and value is not None else b""
        length = int(self._summed(np.array([len(data)], np.int32)).item())
        if length == 0:
            return None
        buffer = np.frombuffer(data, np.uint8) if sending else np.zeros(length, np.uint8)
        return pickle.loads(self._summed(buffer).tobytes())

    def _summed(self, array: np.ndarray) -> np.ndarray:
        return np.array(mx.distributed.all_sum(mx.array(array), group=self.group, stream=mx.cpu))

    def _gathered(self, array: np.ndarray) -> np.ndarray:
        return np.array(mx.distributed.all_gather(mx.array(array), group=self.group, stream=mx.cpu))
