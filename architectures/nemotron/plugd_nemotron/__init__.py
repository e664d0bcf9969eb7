"""Nemotron-H architecture for plugd (nemotron_h).

The model module imports MLX, so it is only named here; the runner imports it.
"""

from plugd.hookspecs import Architecture, hookimpl
from plugd_nemotron.config import cache_layers

PLUGD_API = "1.2"


@hookimpl
def plugd_architectures() -> list[Architecture]:
    return [Architecture(model_type="nemotron_h", module="plugd_nemotron.nemotron_h", cache_layers=cache_layers)]
