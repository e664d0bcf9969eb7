"""Gemma architectures for plugd (gemma3_text, gemma3 with its vision tower, gemma4_text, and gemma4 with its
vision tower where the checkpoint has one).

The model modules import MLX, so they are only named here; the runner imports them.
"""

from plugd.hookspecs import Architecture, hookimpl
from plugd_gemma.config import gemma3_cache_layers, gemma3_media_tokens, gemma4_cache_layers, gemma4_media_tokens

PLUGD_API = "1.2"
IMAGE_TYPES = frozenset({"image/png", "image/jpeg"})


@hookimpl
def plugd_architectures() -> list[Architecture]:
    return [
        Architecture(model_type="gemma3_text", module="plugd_gemma.gemma3_text", cache_layers=gemma3_cache_layers),
        Architecture(model_type="gemma3", module="plugd_gemma.gemma3", media_types=IMAGE_TYPES,
                     cache_layers=gemma3_cache_layers, media_tokens=gemma3_media_tokens),
        Architecture(model_type="gemma4_text", module="plugd_gemma.gemma4_text", cache_layers=gemma4_cache_layers),
        Architecture(model_type="gemma4", module="plugd_gemma.gemma4", media_types=IMAGE_TYPES,
                     cache_layers=gemma4_cache_layers, media_tokens=gemma4_media_tokens,
                     media_tensors=("model.vision_tower.", "vision_tower."),
                     unsupported_towers={"audio": ("model.audio_tower.", "audio_tower.")}),
    ]
