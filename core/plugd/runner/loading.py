"""Loading a checkpoint directory into an architecture plugin's model.

Nothing is evaluated until every tensor is in place: safetensors are mapped
lazily, the plugin's `sanitize` folds them as lazy graphs, and one `mx.eval`
over all parameters reads, folds and casts them in a single pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from plugd.image_processor import directory_config
from plugd.nn import mtp
from plugd.nn.pipeline import split_layers
from plugd.protocol import PIPELINE, TENSOR
from plugd.runner.errors import CheckpointError
from plugd.runner.ollama_tensors import read_ollama_weights
from plugd.store.manifests import OLLAMA_TENSORS_DIR

# A malformed checkpoint can be off in hundreds of tensors; the first few say enough.
MAX_PROBLEMS_SHOWN = 10


def compute_dtype() -> mx.Dtype:
    """float32 on CPU, where MLX's bfloat16 and quantized kernels are slow and inexact; bfloat16 on GPU."""
    return mx.float32 if mx.default_device() == mx.cpu else mx.bfloat16


def load_model(model_dir: Path, module: ModuleType, embedding: bool = False,
               group: mx.distributed.Group | None = None, split: str | None = None) -> nn.Module:
    """Build `module.Model` from `model_dir`/config.json and load the directory's safetensors into it: the Hugging
    Face (or mlx-lm) files, or Ollama's tensor layers where the directory holds them in OLLAMA_TENSORS_DIR.

    An `embedding` model's checkpoint is its base model as sentence-transformers saves it: no output head, and
    the decoder's tensors without their `model.` prefix.

    With a `group` of several ranks, the model is split across them before anything is evaluated (`shard`), so
    that this rank keeps only its share of the tensors."""
    model_dir = Path(model_dir)
    config = directory_config(model_dir)
    model = module.Model(module.ModelArgs.from_dict(config))
    ollama = (model_dir / OLLAMA_TENSORS_DIR).is_dir()
    weights = read_ollama_weights(model_dir / OLLAMA_TENSORS_DIR, model) if ollama else read_weights(model_dir)
    if embedding:
        model.pop("lm_head", None)
        if not any(name.startswith("model.") for name in weights):
            weights = {f"model.{name}": tensor for name, tensor in weights.items()}
    fill(model, weights, checkpoint_quantization(config, ollama))
    del weights  # what the model does not hold (a tensor before its cast, or its split) is freed once used
    if group is not None and group.size() > 1:
        shard(model, module, group, split)
        for _, parameter in tree_flatten(model.parameters()):  # one at a time: one whole tensor beyond the shares
            mx.eval(parameter)
    else:
        mx.eval(model.parameters())
    mx.clear_cache()
    return model


def checkpoint_quantization(config: Mapping[str, Any], ollama: bool) -> Mapping[str, Any] | None:
    """What `fill` takes for a checkpoint of this config.json: Ollama's layers say what is quantized by the tensors
    they hold."""
    return config.get("quantization", {}) if "quantization" in config or ollama else None


def fill(model: nn.Module, weights: dict[str, mx.array], quantization: Mapping[str, Any] | None) -> None:
    """Put a checkpoint's tensors into `model`, lazily: folded by its `sanitize`, the layers held quantized swapped
    for their quantized twins (`quantization`: config.json's entry, {} to read it off the tensors alone, None for a
    float checkpoint), checked against its parameters and cast to the compute dtype."""
    try:
        weights = model.sanitize(weights)
    except KeyError as missing:
        raise CheckpointError(f"missing tensor {missing.args[0]}") from None
    if quantization is not None:
        quantize_layers(model, quantization, weights)
    check_fits(model, weights)
    dtype = compute_dtype()
    model.update(tree_unflatten([(name, _cast(tensor, dtype)) for name, tensor in weights.items()]))


def chosen_split(model: nn.Module, wanted: str | None) -> str:
    """`wanted` (PLUGD_GROUP_SPLIT), else tensor parallel where the architecture declares how (`Model.shard`) and
    pipeline parallel where it does not."""
    return wanted or (TENSOR if hasattr(model, "shard") else PIPELINE)


def shard(model: nn.Module, module: ModuleType, group: mx.distributed.Group, split: str | None = None) -> None:
    """Split `model` across `group` as `chosen_split` says: by its own `shard` (plugd.nn.sharding), or into
    consecutive stages of layers (plugd.nn.pipeline). CheckpointError where it cannot."""
    split = chosen_split(model, split)
    mtp.drop_head(model)  # a group decodes without drafting
    if split == TENSOR and not hasattr(model, "shard"):
        raise CheckpointError(f"{module.__name__} does not say how to split its tensors across ranks (no "
                              f"Model.shard); PLUGD_GROUP_SPLIT={PIPELINE} splits its layers instead")
    try:
        if split == TENSOR:
            model.shard(group)
        else:
            split_layers(model, group)
    except ValueError as exc:
        what, other = ("tensors", PIPELINE) if split == TENSOR else ("layers", TENSOR if hasattr(model, "shard") else None)
        hint = f" (PLUGD_GROUP_SPLIT={other} splits it otherwise)" if other else ""
        raise CheckpointError(f"cannot split its {what} across {group.size()} ranks: {exc}{hint}") from None


def read_weights(model_dir: Path) -> dict[str, mx.array]:
    """Every tensor of every *.safetensors file in `model_dir` (one file or shards), mapped lazily."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{model_dir}: no *.safetensors files")
    weights: dict[str, mx.array] = {}
    source: dict[str, str] = {}
    for file in files:
        for name, tensor in mx.load(str(file)).items():
            if name in source:
                raise CheckpointError(f"{model_dir}: tensor {name} is in both {source[name]} and {file.name}")
            weights[name], source[name] = tensor, file.name
    return weights


def quantize_layers(model: nn.Module, quantization: Mapping[str, Any], weights: Mapping[str, mx.array]) -> None:
    """Swap in the quantized twin of every layer the checkpoint holds quantized, deciding as mlx-lm does.

    `quantization` is config.json's entry as mlx-lm writes it: defaults
    {group_size, bits, mode} plus, for layers quantized differently, an entry
    under the layer's path. A layer's own entry wins (parameters, or false);
    otherwise a layer is quantized when the checkpoint holds its `scales`, with
    group size and bits read off the tensor shapes.
    """
    swaps = []
    for path, layer in model.named_modules():
        if hasattr(layer, "to_quantized") and (params := _layer_quantization(path, layer, quantization, weights)):
            group_size, bits = params
            try:
                swaps.append((path, layer.to_quantized(group_size, bits)))
            except ValueError as error:
                raise CheckpointError(f"layer {path}: {error}") from None
    model.update_modules(tree_unflatten(swaps))


def _layer_quantization(
    path: str, layer: nn.Module, quantization: Mapping[str, Any], weights: Mapping[str, mx.array]
) -> tuple[int, int] | None:
    """(group_size, bits) for a layer held quantized, None for a dense one."""
    if path in quantization:
        entry = quantization if quantization[path] is True else quantization[path]
        if not entry:
            return None
        mode = entry.get("mode", quantization.get("mode", "affine"))
        if mode != "affine":
            raise CheckpointError(f"layer {path}: quantization mode {mode!r} is not supported, only 'affine'")
        return entry["group_size"], entry["bits"]
    scales = weights.get(f"{path}.scales")
    if scales is None:
        return None
    if not mx.issubdtype(scales.dtype, mx.floating):
        raise CheckpointError(f"layer {path}: only affine quantization (floating-point scales) is supported")
    if (packed := weights.get(f"{path}.weight")) is None:
        raise CheckpointError(f"missing tensor {path}.weight")
    in_dims = layer.weight.shape[-1]
    return in_dims // scales.shape[-1], packed.shape[-1] * 32 // in_dims


def check_fits(model: nn.Module, weights: Mapping[str, mx.array]) -> None:
    """Every parameter of `model` has a tensor of its shape in `weights`, and `weights` has nothing else."""
    expected = dict(tree_flatten(model.parameters()))
    problems = [f"missing tensor {name}" for name in sorted(expected.keys() - weights.keys())]
    problems += [f"unexpected tensor {name}" for name in sorted(weights.keys() - expected.keys())]
    problems += [
        f"tensor {name} has shape {tuple(tensor.shape)}, the model expects {tuple(expected[name].shape)}"
        for name, tensor in sorted(weights.items())
        if name in expected and tensor.shape != expected[name].shape
    ]
    if problems:
        more = len(problems) - MAX_PROBLEMS_SHOWN
        shown = "; ".join(problems[:MAX_PROBLEMS_SHOWN]) + (f"; and {more} more" if more > 0 else "")
        raise CheckpointError(shown)


def _cast(tensor: mx.array, dtype: mx.Dtype) -> mx.array:
    return tensor.astype(dtype) if mx.issubdtype(tensor.dtype, mx.floating) else tensor
