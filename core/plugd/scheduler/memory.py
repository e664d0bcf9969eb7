"""How much memory a load needs, and whether it fits under the memory-fit plugins' budgets."""

from __future__ import annotations

import logging
import math
import platform
from typing import Any

from plugd.plugins import Registry
from plugd.procfs import kib_field
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


# What the runner's caches (plugd.nn) hold beyond the positions themselves: KV buffers grow CACHE_STEP positions at
# a time; a sliding-window buffer keeps ROTATING_SLACK positions past the window plus the prefill chunk being
# written; and the cache policy keeps up to SNAPSHOTS snapshots of the layers that cannot trim back (recurrent and
# sliding ones), each holding a copy of the layer's state once the live cache moves on.
CACHE_STEP = 256
ROTATING_SLACK = 256
PREFILL_CHUNK = 512
SNAPSHOTS = 8
STATE_BYTES = 4  # recurrent states are kept in float32
# A request's own arrays besides the caches, four 4-byte values per position (token history, positions) and per
# vocabulary entry (the last logits and what sampling derives from them).
WORKING_BYTES = 16

FULL, SLIDING, RECURRENT, STATELESS = "full", "sliding", "recurrent", "stateless"
# Layer type names of transformers 5 configs (layer_types, layers_block_type) and of Nemotron-H's pattern.
LAYER_KINDS = {
    "full_attention": FULL, "attention": FULL, "*": FULL,
    "sliding_attention": SLIDING,
    "linear_attention": RECURRENT, "mamba": RECURRENT, "M": RECURRENT,
    "mlp": STATELESS, "moe": STATELESS, "-": STATELESS, "E": STATELESS,
}


def layer_kinds(config: dict[str, Any]) -> list[str]:
    """What each layer caches, from whichever of the configs' ways of saying it is present; a layer of an unknown
    kind counts as full attention (never an underestimate). Layers sharing an earlier layer's keys and values
    (Gemma 4's `num_kv_shared_layers`) cache nothing."""
    count = config.get("num_hidden_layers", 0)
    named = config.get("layer_types") or config.get("layers_block_type") or config.get("hybrid_override_pattern")
    if named:
        kinds = [LAYER_KINDS.get(name, FULL) for name in named]
    elif interval := config.get("full_attention_interval"):
        kinds = [FULL if (i + 1) % interval == 0 else RECURRENT for i in range(count)]
    elif (pattern := config.get("sliding_window_pattern")) and config.get("sliding_window"):
        kinds = [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(count)]
    else:
        kinds = [FULL] * count
    shared = config.get("num_kv_shared_layers") or 0
    return kinds[: len(kinds) - shared] + [STATELESS] * min(shared, len(kinds))


def recurrent_state_bytes(config: dict[str, Any]) -> int:
    """One recurrent layer's state: the convolution window at the compute dtype plus the float32 state, of a
    Mamba2 (Nemotron-H) or Gated DeltaNet (Qwen3-Next, Qwen3.5) layer."""
    if "mamba_num_heads" in config:
        inner = config["mamba_num_heads"] * config["mamba_head_dim"]
        state, groups = config["ssm_state_size"], config.get("n_groups", config.get("mamba_n_groups", 8))
        kernel = config.get("conv_kernel", config.get("mamba_d_conv", 4))
        return (kernel - 1) * (inner + 2 * groups * state) * compute_float_bytes() + inner * state * STATE_BYTES
    keys = config["linear_num_key_heads"] * config["linear_key_head_dim"]
    values = config["linear_num_value_heads"] * config["linear_value_head_dim"]
    kernel = config.get("linear_conv_kernel_dim", 4)
    return (kernel - 1) * (2 * keys + values) * compute_float_bytes() + values * config["linear_key_head_dim"] * STATE_BYTES


def kv_cache_bytes(config: dict[str, Any], num_ctx: int) -> int:
    """An upper bound of the runner's caches for a num_ctx context: keys and values of the attention layers (full
    ones for every position, sliding ones for what their rotating buffer keeps), the fixed-size state of the
    recurrent layers, the cache policy's snapshots of the latter two, and the request's working arrays."""
    config = config.get("text_config", config)
    heads = config.get("num_attention_heads", 1)
    head_dim = config.get("head_dim") or config.get("hidden_size", 0) // heads
    kv_heads = config.get("num_key_value_heads") or heads
    # Gemma 4's global layers: wider heads, and their own key/value head count when keys double as values.
    global_head_dim = max(head_dim, config.get("global_head_dim") or 0)
    global_kv_heads = max(kv_heads, config.get("num_global_key_value_heads") or 0)
    positions = -(-num_ctx // CACHE_STEP) * CACHE_STEP
    window = min(positions, (config.get("sliding_window") or num_ctx) + ROTATING_SLACK + PREFILL_CHUNK + CACHE_STEP)
    per_position = 2 * compute_float_bytes()
    kinds = layer_kinds(config)
    full = kinds.count(FULL) * positions * global_kv_heads * global_head_dim * per_position
    sliding = kinds.count(SLIDING) * window * kv_heads * head_dim * per_position
    recurrent = kinds.count(RECURRENT) * recurrent_state_bytes(config) if RECURRENT in kinds else 0
    working = WORKING_BYTES * (num_ctx + config.get("vocab_size", 0))
    return full + (1 + SNAPSHOTS) * (sliding + recurrent) + working


# The smallest context a request without num_ctx gets (a model with a smaller maximum gets its maximum), whatever
# memory is left: a model whose caches do not fit even that is refused by the fit check, as one asking for it is.
CONTEXT_FLOOR = 4096


def default_context(config: dict[str, Any], room: float, maximum: int | None) -> int:
    """The context a request without num_ctx gets: the largest, up to the model's `maximum` (its trained context
    length), whose caches (`kv_cache_bytes`) fit in `room` bytes, in whole CACHE_STEPs below the maximum, and never
    under CONTEXT_FLOOR; CONTEXT_FLOOR when the maximum is unknown."""
    if not maximum:
        return CONTEXT_FLOOR
    if maximum <= CONTEXT_FLOOR or kv_cache_bytes(config, maximum) <= room:
        return maximum
    low, high = CONTEXT_FLOOR // CACHE_STEP, -(-maximum // CACHE_STEP)  # in steps; high * CACHE_STEP does not fit
    while low + 1 < high:
        middle = (low + high) // 2
        if kv_cache_bytes(config, middle * CACHE_STEP) <= room:
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


class InsufficientMemory(RuntimeError):
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
