"""Qwen architectures for plugd (qwen3, qwen3_moe, qwen3_next, qwen3_5, qwen3_5_moe).

The model modules import MLX, so they are only named here; the runner imports them.
"""

from plugd.hookspecs import Architecture, hookimpl
from plugd_qwen.config import hybrid_layers

PLUGD_API = "1.2"


@hookimpl
def plugd_architectures() -> list[Architecture]:
    return [
        Architecture(model_type="qwen3", module="plugd_qwen.qwen3"),
        Architecture(model_type="qwen3_moe", module="plugd_qwen.qwen3_moe"),
        Architecture(model_type="qwen3_next", module="plugd_qwen.qwen3_next", cache_layers=hybrid_layers),
        Architecture(model_type="qwen3_5", module="plugd_qwen.qwen3_5", cache_layers=hybrid_layers),
        Architecture(model_type="qwen3_5_moe", module="plugd_qwen.qwen3_5_moe", cache_layers=hybrid_layers),
    ]
