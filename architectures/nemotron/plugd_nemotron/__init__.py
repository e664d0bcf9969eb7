"""Nemotron-H architectures for plugd (nemotron_h, and nemotron_h_omni with its RADIO vision tower).

The model modules import MLX, so they are only named here; the runner imports them.
"""

from plugd.hookspecs import Architecture, hookimpl
from plugd_nemotron.config import cache_layers
from plugd_nemotron.omni_config import omni_cache_layers, omni_media_tokens

PLUGD_API = "1.2"


@hookimpl
def plugd_architectures() -> list[Architecture]:
    return [
        Architecture(model_type="nemotron_h", module="plugd_nemotron.nemotron_h", cache_layers=cache_layers),
        Architecture(model_type="nemotron_h_omni", module="plugd_nemotron.nemotron_h_omni",
                     media_types=frozenset({"image/png", "image/jpeg"}), cache_layers=omni_cache_layers,
                     media_tokens=omni_media_tokens, media_tensors=("vision_model.",),
                     unsupported_towers={"audio": ("sound_encoder.", "sound_projection.", "audio_tower.",
                                                   "embed_audio.")}),
    ]
