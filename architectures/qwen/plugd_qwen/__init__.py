"""Qwen architectures for plugd (qwen3, qwen3_moe, qwen3_next, and qwen3_5 and qwen3_5_moe with their vision tower
where the checkpoint has one).

The model modules import MLX, so they are only named here; the runner imports them.
"""

from plugd.hookspecs import Architecture, hookimpl
from plugd_qwen.config import MTP, hybrid_layers, qwen3_5_media_tokens

PLUGD_API = "1.2"
IMAGE_TYPES = frozenset({"image/png", "image/jpeg"})
VISION_TENSORS = ("model.visual.", "visual.", "vision_tower.")


@hookimpl
def plugd_architectures() -> list[Architecture]:
    return [
        Architecture(model_type="qwen3", module="plugd_qwen.qwen3"),
        Architecture(model_type="qwen3_moe", module="plugd_qwen.qwen3_moe"),
        Architecture(model_type="qwen3_next", module="plugd_qwen.qwen3_next", cache_layers=hybrid_layers,
                     drafter_tensors=(MTP,)),
        *(Architecture(model_type=model_type, module=f"plugd_qwen.{model_type}", cache_layers=hybrid_layers,
                       media_types=IMAGE_TYPES, media_tokens=qwen3_5_media_tokens, media_tensors=VISION_TENSORS,
                       drafter_tensors=(MTP,))
          for model_type in ("qwen3_5", "qwen3_5_moe")),
    ]
