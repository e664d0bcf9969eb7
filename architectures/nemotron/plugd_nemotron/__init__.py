"""Nemotron-H architecture for plugd (nemotron_h).

The model module imports MLX, so it is only named here; the runner imports it.
"""

from plugd.hookspecs import Architecture, hookimpl


@hookimpl
def plugd_architectures() -> list[Architecture]:
    return [Architecture(model_type="nemotron_h", module="plugd_nemotron.nemotron_h")]
