"""How much memory a load needs, and whether it fits under the memory-fit plugins' budgets."""

from __future__ import annotations

import logging
import math
import platform
from typing import Any

from attrs import define, evolve

from plugd.constants import CACHE_STEP, PREFILL_CHUNK, ROTATING_SLACK, SNAPSHOT_LIMIT
from plugd.errors import PlugdError
from plugd.hookspecs import Architecture, LayerCache
from plugd.plugins import Registry
from plugd.procfs import kib_field
from plugd.store.metadata import BYTES_PER_ELEMENT, FLOAT_DTYPES

log = logging.getLogger(__name__)


def guessed_float_bytes() -> int:
    """Bytes per float at the runner's compute dtype, until a runner has said (`float_bytes` in its status):
    bfloat16 on Apple silicon's GPU, float32 on CPU."""
    return 2 if platform.system() == "Darwin" and platform.machine() == "arm64" else 4


def weight_bytes(tensors: dict[str, dict[str, Any]], float_bytes: int) -> int:
    """Weights as the runner holds them."""
    return sum(tensor_bytes(t, float_bytes) for t in tensors.values())


def tensor_bytes(tensor: dict[str, Any], float_bytes: int) -> int:
    """A tensor as the runner holds it: floats cast to the compute dtype, packed quantized data as stored."""
    return math.prod(tensor["shape"]) * (float_bytes if tensor["dtype"] in FLOAT_DTYPES
                                         else BYTES_PER_ELEMENT.get(tensor["dtype"], 1))


STATE_BYTES = 4  # recurrent states are kept in float32
# A request's own arrays besides the caches, four 4-byte values per position (token history, positions) and per
# vocabulary entry (the last logits and what sampling derives from them).
WORKING_BYTES = 16


@define(frozen=True)
class CacheEstimate:
    """An upper bound of what a model's caches come to for a context: each layer's (as its architecture declares
    them, `Architecture.cache_layers`) as the runner builds them (plugd.constants): KV buffers grow CACHE_STEP
    positions at a time; a sliding-window buffer keeps ROTATING_SLACK positions past the window plus the prefill
    chunk being written; the cache policy keeps up to SNAPSHOT_LIMIT snapshots of the layers that cannot trim
    back (sliding and recurrent ones). Plus the request's working arrays."""

    layers: list[LayerCache]
    vocab_size: int
    float_bytes: int
    share: float = 1.0  # the part of them this machine holds, as rank 0 of a group (plugd.scheduler.rank_share)

    @classmethod
    def of(cls, architecture: Architecture, config: dict[str, Any], float_bytes: int, share: float = 1.0
           ) -> CacheEstimate:
        """For a model of `architecture` whose config.json is `config` (a multimodal one's text part counts),
        of which this machine holds `share`."""
        text = config.get("text_config", config)
        return cls(architecture.cache_layers(text), text.get("vocab_size", 0), float_bytes, share)

    def with_draft(self, layers: list[LayerCache]) -> CacheEstimate:
        """The estimate with a draft model's `layers` too: the draft keeps caches for the same positions of the same
        sequences as the model."""
        return evolve(self, layers=[*self.layers, *layers])

    def bytes(self, num_ctx: int, sequences: int = 1) -> int:
        """For `sequences` decoding together: one alone decodes in the cache policy's live caches; several each
        decode in a batch row of their own beside them (plugd.runner.generate), so 1 + `sequences` caches."""
        return math.ceil((1 if sequences == 1 else 1 + sequences) * self._one(num_ctx) * self.share)

    def _one(self, num_ctx: int) -> int:
        positions = -(-num_ctx // CACHE_STEP) * CACHE_STEP
        full = kept = 0
        for layer in self.layers:
            if layer.window is None:
                full += layer.per_position * positions
            else:
                window = min(positions, layer.window + ROTATING_SLACK + PREFILL_CHUNK + CACHE_STEP)
                kept += layer.per_position * window
            kept += layer.state
        recurrent = sum(layer.state_float32 for layer in self.layers) * STATE_BYTES
        working = WORKING_BYTES * (num_ctx + self.vocab_size)
        return (full + (1 + SNAPSHOT_LIMIT) * kept) * self.float_bytes + (1 + SNAPSHOT_LIMIT) * recurrent + working


# The smallest context a request without num_ctx gets (a model with a smaller maximum gets its maximum), whatever
# memory is left: a model whose caches do not fit even that is refused by the fit check, as one asking for it is.
CONTEXT_FLOOR = 4096
# The requests a runner decodes together when PLUGD_NUM_PARALLEL does not say, where memory allows (mlx_lm.server
# decodes up to 32; a coding agent's subagents and side requests, or a few people on a chat front end, are fewer).
DEFAULT_PARALLEL = 4


def default_context(caches: CacheEstimate, room: float, maximum: int | None) -> int:
    """The context a request without num_ctx gets: the largest, up to the model's `maximum` (its trained context
    length), whose caches fit in `room` bytes, in whole CACHE_STEPs below the maximum, and never under
    CONTEXT_FLOOR; CONTEXT_FLOOR when the maximum is unknown."""
    if not maximum:
        return CONTEXT_FLOOR
    if maximum <= CONTEXT_FLOOR or caches.bytes(maximum) <= room:
        return maximum
    low, high = CONTEXT_FLOOR // CACHE_STEP, -(-maximum // CACHE_STEP)  # in steps; high * CACHE_STEP does not fit
    while low + 1 < high:
        middle = (low + high) // 2
        if caches.bytes(middle * CACHE_STEP) <= room:
            low = middle
        else:
            high = middle
    return max(low * CACHE_STEP, CONTEXT_FLOOR)


def resident_bytes(pid: int) -> int | None:
    """The anonymous memory process `pid` holds now (Linux's RssAnon: what only ending it gives back, while its
    file pages already count as available); None where the platform does not say."""
    return kib_field(f"/proc/{pid}/status", "RssAnon")


def _binary_size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


class InsufficientMemory(PlugdError, RuntimeError):
    def __init__(self, name: str, needed: int, budget: int):
        super().__init__(
            f"model '{name}' needs {_binary_size(needed)} (weights and KV cache) "
            f"but only {_binary_size(budget)} is available"
        )


def budget(registry: Registry, held: int, device_limit: int | None = None) -> int | None:
    """The tightest bound the memory-fit plugins give the loaded models holding `held` bytes now, and
    `device_limit` (the most a GPU should hold, as a runner reports it: Metal's working set), None when none has
    an opinion."""
    bounds = [] if device_limit is None else [device_limit]
    for fit in registry.items.get("plugd_memory_fits", []):
        try:
            bound = fit.budget(held)
        except Exception:  # a memory-fit plugin must not break loading
            log.exception("memory fit %s failed; ignoring it", fit.name)
            continue
        if bound is not None:
            bounds.append(bound)
    return min(bounds, default=None)
