"""Gemma architectures for plugd (gemma3_text, gemma3 with its vision tower, gemma4_text,
and gemma4 checkpoints read for their text model).

The model modules import MLX, so they are only named here; the runner imports them.
"""

from plugd.hookspecs import Architecture, hookimpl

PLUGD_API = "1.1"


@hookimpl
def plugd_architectures() -> list[Architecture]:
    return [
        Architecture(model_type="gemma3_text", module="plugd_gemma.gemma3_text"),
        Architecture(model_type="gemma3", module="plugd_gemma.gemma3", media_types=frozenset({"image/png", "image/jpeg"})),
        Architecture(model_type="gemma4_text", module="plugd_gemma.gemma4_text"),
        Architecture(model_type="gemma4", module="plugd_gemma.gemma4"),
    ]
