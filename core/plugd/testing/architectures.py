"""Tiny random-weight checkpoints of any registered architecture, for plugin authors' tests.

    tiny_checkpoint(tmp_path / "m", "mymodel", seed=0)

plugd.testing.checkpoints knows the core's own model types from its tables
(BASE_CONFIGS, SHAPES). A model type missing there is taught to it from the
installed plugin that registers it: the plugin's architecture module gives
`TINY_CONFIG`, the config.json keys of a tiny model (vocab_size and
eos_token_id come from the tokenizer), and the tensors are those of its own
`Model` built from that config (parameters are lazy placeholders, so building
allocates nothing), saved under its own parameter names. A module whose
`sanitize` expects other names than its parameters' (renamed or stacked
tensors) also defines `checkpoint_shapes(config) -> {name: shape}`.

Imports MLX, through the plugin's module, only for model types the tables lack.
"""

from __future__ import annotations

import importlib
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

from plugd import plugins
from plugd.testing import checkpoints

# Model types this module added to the checkpoint tables, so that a later plugin's module replaces them.
_taught: set[str] = set()


def architecture_module(model_type: str) -> ModuleType:
    """The runner-side module of the plugin that registers `model_type` (as the daemon would find it now)."""
    architectures = plugins.load().architectures()
    if model_type not in architectures:
        raise LookupError(f"no loaded plugin registers model_type {model_type!r}; registered: {sorted(architectures)}")
    return importlib.import_module(architectures[model_type].module)


def parameter_shapes(module: ModuleType, config: dict[str, Any]) -> checkpoints.Shapes:
    """Every parameter of `module.Model` built from `config`, by its dotted name."""
    from mlx.utils import tree_flatten

    model = module.Model(module.ModelArgs.from_dict(config))
    return {name: tuple(parameter.shape) for name, parameter in tree_flatten(model.parameters())}


def teach(model_type: str) -> None:
    """Make plugd.testing.checkpoints able to write `model_type`, from the plugin that registers it."""
    if model_type in checkpoints.BASE_CONFIGS and model_type not in _taught:
        return
    module = architecture_module(model_type)
    tiny_config = getattr(module, "TINY_CONFIG", None)
    if not isinstance(tiny_config, dict):
        raise LookupError(f"{module.__name__} (model_type {model_type!r}) defines no TINY_CONFIG dict for tiny checkpoints")
    checkpoints.BASE_CONFIGS[model_type] = {**tiny_config, "model_type": model_type}
    checkpoints.SHAPES[model_type] = getattr(module, "checkpoint_shapes", None) or partial(parameter_shapes, module)
    _taught.add(model_type)


def tiny_checkpoint(path: Path, model_type: str, **options: Any) -> Path:
    """Write a tiny checkpoint of any registered `model_type` into `path`; options as for `write_checkpoint`."""
    teach(model_type)
    return checkpoints.write_checkpoint(path, model_type, **options)
