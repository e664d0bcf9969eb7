"""Ollama's tensor layers (its safetensors format for the MLX engine) as the tensors an architecture's `sanitize` takes.

Ollama's `create` (x/create in ollama/ollama) writes every tensor to a safetensors file of its own under its Hugging
Face name, and a MoE layer's experts as one stacked tensor per projection, `P.experts.PROJ.weight` (imports before
July 2026: `P.switch_mlp.PROJ.weight`; older ones kept one tensor per expert, `P.experts.E.PROJ.weight`). A quantized
tensor `T` is its packed weight, `T.scale` and, for affine modes, `T.bias`; the file's metadata gives `quant_type` and
`group_size` (`T.quant_type`, `T.group_size` where one file mixes types).

Here the quantized companions take mlx-lm's names (`P.weight` -> `P.scales`, `P.biases`; a layer's own `P.bias`
stays), stacked experts go to `P.switch_mlp.PROJ` where the model has that parameter and are split per expert for
`sanitize` otherwise. Affine int4/int8 tensors stay quantized where the model has a quantizable layer of that name
(`quantize_layers` then reads bits and group size off the shapes); other modes (nvfp4, mxfp4, mxfp8), and tensors for
layers the model names differently, are dequantized, lazily like everything else.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from attrs import define
from mlx.utils import tree_flatten

from plugd.runner.errors import CheckpointError
from plugd.store.drafts import DRAFT_TENSOR_PREFIX

# Ollama's quantization types (x/quant in ollama/ollama): MLX mode, bits, default group size.
QUANT_TYPES = {
    "int4": ("affine", 4, 64),
    "int8": ("affine", 8, 64),
    "nvfp4": ("nvfp4", 4, 16),
    "mxfp4": ("mxfp4", 4, 32),
    "mxfp8": ("mxfp8", 8, 32),
}
STACKED = re.compile(r"(?P<prefix>.+)\.(?:experts|switch_mlp)\.(?P<proj>[^.]+)\.weight")
PER_EXPERT = re.compile(r"(?P<prefix>.+)\.experts\.\d+\.(?P<proj>[^.]+)\.weight")
COMPANIONS = (".scale", ".bias", ".global_scale")


@define(frozen=True)
class Quantization:
    mode: str
    bits: int
    group_size: int


@define
class _Tensor:
    weight: mx.array
    scales: mx.array | None = None
    biases: mx.array | None = None
    global_scale: mx.array | None = None
    quantization: Quantization | None = None

    def dense(self) -> mx.array:
        if self.quantization is None:
            return self.weight
        q = self.quantization
        return mx.dequantize(self.weight, self.scales, self.biases, group_size=q.group_size, bits=q.bits, mode=q.mode,
                             global_scale=self.global_scale)

    def expert(self, e: int) -> _Tensor:
        biases = None if self.biases is None else self.biases[e]
        scales = None if self.scales is None else self.scales[e]
        return _Tensor(self.weight[e], scales, biases, self.global_scale, self.quantization)


def read_ollama_weights(directory: Path, model: nn.Module, prefix: str = "") -> dict[str, mx.array]:
    """Every tensor of the Ollama tensor files in `directory` whose name starts with `prefix`, without it, mapped lazily
    and named for `model`'s `sanitize`. With no prefix, the model's own: a draft's (DRAFT_TENSOR_PREFIX) are not."""
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{directory}: no tensor layers")
    parameters = set(dict(tree_flatten(model.parameters())))
    quantizable = {path for path, layer in model.named_modules() if hasattr(layer, "to_quantized")}
    weights: dict[str, mx.array] = {}
    for file in files:
        for name, tensor in _tensors(file).items():
            if not name.startswith(prefix) or (not prefix and name.startswith(DRAFT_TENSOR_PREFIX)):
                continue
            for key, value in _named(name.removeprefix(prefix), tensor, parameters, quantizable).items():
                if key in weights:
                    raise CheckpointError(f"{directory}: tensor {key} is in more than one tensor layer")
                weights[key] = value
    return weights


def _tensors(file: Path) -> dict[str, _Tensor]:
    """The file's tensors by name, each with its quantization companions and parameters."""
    arrays, metadata = mx.load(str(file), return_metadata=True)
    tensors = {}
    for name, array in arrays.items():
        if any(name.endswith(s) and name.removesuffix(s) + ".scale" in arrays for s in COMPANIONS[1:]) or (
                name.endswith(".scale") and name.removesuffix(".scale") in arrays):
            continue
        tensor = _Tensor(array)
        if (scales := arrays.get(f"{name}.scale")) is not None:
            tensor = _Tensor(array, scales, arrays.get(f"{name}.bias"), arrays.get(f"{name}.global_scale"),
                             _quantization(name, metadata))
        tensors[name] = tensor
    return tensors


def _quantization(name: str, metadata: dict[str, str]) -> Quantization:
    quant_type = metadata.get(f"{name}.quant_type") or metadata.get("quant_type")
    if not quant_type:
        raise CheckpointError(f"tensor {name} has quantization scales, but its file gives no quant_type")
    known = QUANT_TYPES.get(quant_type.lower())
    if known is None:
        raise CheckpointError(f"tensor {name} is quantized as {quant_type!r}, which plugd cannot load; "
                              f"it loads {', '.join(QUANT_TYPES)}")
    mode, bits, group_size = known
    group = metadata.get(f"{name}.group_size") or metadata.get("group_size")
    try:
        group_size = int(group) if group else group_size
    except ValueError:
        raise CheckpointError(f"tensor {name} has group size {group!r}, not a number") from None
    if not _mlx_has(mode, bits, group_size):
        raise CheckpointError(f"tensor {name} is quantized as {quant_type} ({mode}, {bits} bits in groups of "
                              f"{group_size}), which MLX {mx.__version__} cannot dequantize")
    return Quantization(mode, bits, group_size)


@cache
def _mlx_has(mode: str, bits: int, group_size: int) -> bool:
    try:
        mx.eval(mx.quantize(mx.zeros((8, 8 * group_size)), group_size=group_size, bits=bits, mode=mode))
    except (ValueError, RuntimeError):
        return False
    return True


def _named(name: str, tensor: _Tensor, parameters: set[str], quantizable: set[str]) -> dict[str, mx.array]:
    """The tensors `name` becomes: renamed where the model stacks experts differently, quantized or dense."""
    if (stacked := STACKED.fullmatch(name)) and tensor.weight.ndim == 3:
        target = f"{stacked['prefix']}.switch_mlp.{stacked['proj']}"
        if f"{target}.weight" in parameters:
            return _emit(target, tensor, target in quantizable)
        experts = {}
        for e in range(tensor.weight.shape[0]):
            experts |= _emit(f"{stacked['prefix']}.experts.{e}.{stacked['proj']}", tensor.expert(e), False)
        return experts
    if per_expert := PER_EXPERT.fullmatch(name):
        return _emit(name.removesuffix(".weight"), tensor, f"{per_expert['prefix']}.switch_mlp.{per_expert['proj']}"
                     in quantizable)
    if name.endswith(".weight"):
        return _emit(name.removesuffix(".weight"), tensor, name.removesuffix(".weight") in quantizable)
    return {name: tensor.dense()}


def _emit(path: str, tensor: _Tensor, keep_quantized: bool) -> dict[str, mx.array]:
    q = tensor.quantization
    if q is None or not keep_quantized or q.mode != "affine":
        return {f"{path}.weight": tensor.dense()}
    return {f"{path}.weight": tensor.weight, f"{path}.scales": tensor.scales, f"{path}.biases": tensor.biases}
