"""Where MLX's CPU kernels lose to numpy's: on a CPU, some operations over large inputs leave MLX for numpy, whose
vectorised exp and tanh are an order of magnitude faster there (attention's softmax, plugd.nn.host_attention;
the feed-forward activations, plugd.nn.activations). Such a detour cannot be traced: `traceable()` keeps every
operation in MLX inside its block, for mx.grad, mx.vmap or mx.compile."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import mlx.core as mx

_tracing = ContextVar("plugd_tracing", default=False)


@contextmanager
def traceable() -> Iterator[None]:
    """Keep every operation in MLX inside this block, for mx.grad, mx.vmap or mx.compile to trace."""
    token = _tracing.set(True)
    try:
        yield
    finally:
        _tracing.reset(token)


def host_allowed() -> bool:
    """Whether an operation may leave MLX for numpy here: on a CPU, outside a `traceable` block."""
    return mx.default_device().type == mx.DeviceType.cpu and not _tracing.get()
