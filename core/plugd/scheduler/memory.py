"""How much memory a load needs, and whether it fits under the memory-fit plugins' budgets."""

from __future__ import annotations

import logging
import math
import platform
from typing import Any

from plugd.plugins import Registry
from plugd.store.metadata import BYTES_PER_ELEMENT, FLOAT_DTYPES

log = logging.getLogger(__name__)


def compute_float_bytes() -> int:
    """Bytes per float at the runner's compute dtype: bfloat16 on Apple silicon's GPU, float32 on CPU."""
    return 2 if platform.system() == "Darwin" and platform.machine() == "arm64" else 4


def weight_bytes(tensors: dict[str, dict[str, Any]]) -> int:
    """Weights as the runner holds them: floats cast to the compute dtype, packed quantized data as stored."""
    per_float = compute_float_bytes()
    return sum(
        math.prod(t["shape"]) * (per_float if t["dtype"] in FLOAT_DTYPES else BYTES_PER_ELEMENT.get(t["dtype"], 1))
        for t in tensors.values()
    )


def kv_cache_bytes(config: dict[str, Any], num_ctx: int) -> int:
    """Keys and values of every attention layer for num_ctx positions."""
    config = config.get("text_config", config)
    heads = config.get("num_attention_heads", 1)
    head_dim = config.get("head_dim") or config.get("hidden_size", 0) // heads
    kv_heads = config.get("num_key_value_heads") or heads
    return config.get("num_hidden_layers", 0) * 2 * kv_heads * head_dim * num_ctx * compute_float_bytes()


def _binary_size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


class InsufficientMemory(RuntimeError):
    def __init__(self, name: str, needed: int, budget: int):
        super().__init__(
            f"model '{name}' needs {_binary_size(needed)} (weights and KV cache) "
            f"but only {_binary_size(budget)} is available"
        )


def budget(registry: Registry, in_use: int) -> int | None:
    """The tightest bound the memory-fit plugins give, None when none has an opinion."""
    bounds = []
    for fit in registry.items.get("plugd_memory_fits", []):
        try:
            bound = fit.budget(in_use)
        except Exception:  # a memory-fit plugin must not break loading
            log.exception("memory fit %s failed; ignoring it", fit.name)
            continue
        if bound is not None:
            bounds.append(bound)
    return min(bounds, default=None)
