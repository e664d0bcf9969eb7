"""Quantizing a float Hugging Face checkpoint directory into an MLX affine-quantized one, as mlx-lm writes it.

    python -m plugd.runner.quantize SRC DST --module plugd_qwen.qwen3 --bits 4

The model is built through the architecture plugin, so `sanitize` folds apply
(experts stacked) and the output holds plugd's parameter layout, which is
mlx-lm's too. Layers are chosen as mlx-lm's convert chooses them: every layer
with a quantized twin, except those whose inputs do not fill whole groups
(left dense), and as the model's `quant_predicate` says where it has one (an
MoE model's routers at 8 bits, as in mlx-lm's model files). Tensors stay lazy
until their shard is written, so memory holds about one shard at a time.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from plugd.runner.loading import CheckpointError, check_fits, read_weights

BITS = (2, 3, 4, 5, 6, 8)
GROUP_SIZES = (32, 64, 128)
MAX_SHARD_BYTES = 2 << 30
COPIED_FILES = (
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "*.tiktoken",
    "chat_template*",
    "generation_config.json",
)


def quantize_checkpoint(src: Path, dst: Path, module: ModuleType, bits: int, group_size: int = 64) -> None:
    """Write the checkpoint in `src`, quantized to `bits` in groups of `group_size`, to `dst` (absent or empty).

    Everything is written into a hidden directory beside `dst` that replaces it
    only once complete; on failure it is removed and `dst` is left as it was.
    """
    src, dst = Path(src), Path(dst)
    if bits not in BITS:
        raise ValueError(f"cannot quantize to {bits} bits: choose one of {', '.join(map(str, BITS))}")
    if group_size not in GROUP_SIZES:
        raise ValueError(f"cannot quantize in groups of {group_size}: choose one of {', '.join(map(str, GROUP_SIZES))}")
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise FileExistsError(f"{dst} already exists and is not an empty directory")
    dst.parent.mkdir(parents=True, exist_ok=True)
    partial = dst.with_name(f".{dst.name}.partial-{uuid.uuid4().hex}")
    partial.mkdir()
    try:
        _write(src, partial, module, {"group_size": group_size, "bits": bits})
        partial.replace(dst)  # POSIX rename replaces an empty directory in one step
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def _write(src: Path, out: Path, module: ModuleType, default: dict[str, int]) -> None:
    config = json.loads((src / "config.json").read_text())
    if "quantization" in config:
        raise CheckpointError(f"{src} is already quantized")
    try:
        model = module.Model(module.ModelArgs.from_dict(config))
    except KeyError as missing:
        raise CheckpointError(f"{src / 'config.json'} lacks {missing.args[0]!r}") from None
    try:
        weights = model.sanitize(read_weights(src))
    except KeyError as missing:
        raise CheckpointError(f"missing tensor {missing.args[0]}") from None
    check_fits(model, weights)
    quantization: dict[str, Any] = {**default, "mode": "affine"}
    predicate = getattr(model, "quant_predicate", None)
    for path, layer in model.named_modules():
        if not hasattr(layer, "to_quantized"):
            continue
        params = _layer_quantization(path, layer, default, predicate)
        if params != default:
            quantization[path] = params or False
        if params:
            weight = weights.pop(f"{path}.weight")
            quantized = mx.quantize(weight, group_size=params["group_size"], bits=params["bits"])
            weights |= dict(zip((f"{path}.weight", f"{path}.scales", f"{path}.biases"), quantized, strict=True))
    _save_weights(weights, out)
    # mlx-lm repeats the entry as quantization_config, where Hugging Face tools look for it.
    config |= {"quantization": quantization, "quantization_config": quantization}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for pattern in COPIED_FILES:
        for file in src.glob(pattern):
            if file.is_file():
                shutil.copy2(file, out)


def _layer_quantization(path: str, layer: nn.Module, default: dict[str, int],
                        predicate: Callable[[str, nn.Module], dict[str, int] | bool] | None) -> dict[str, int] | None:
    """{group_size, bits} for the layer at `path`, or None where it stays dense: the model's predicate says so, or
    its inputs do not fill whole groups."""
    chosen = predicate(path, layer) if predicate is not None else True
    if chosen is False:
        return None
    params = default if chosen is True else chosen
    return params if layer.weight.shape[-1] % params["group_size"] == 0 else None


def _save_weights(weights: dict[str, mx.array], out: Path) -> None:
    """Write `weights` (emptying the dict) as model.safetensors, or as shards with an index once over MAX_SHARD_BYTES.

    Each shard is evaluated as it is saved and then dropped, so no more than
    one shard's tensors (and the float tensors they are made from) are held.
    """
    total_size = sum(tensor.nbytes for tensor in weights.values())
    shards = list(_split(weights))
    weights.clear()
    count = len(shards)
    names = [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)] if count > 1 else ["model.safetensors"]
    weight_map: dict[str, str] = {}
    for name in names:
        shard = shards.pop(0)
        mx.save_safetensors(str(out / name), shard, metadata={"format": "mlx"})
        weight_map |= dict.fromkeys(shard, name)
        del shard
        mx.clear_cache()
    if count > 1:
        index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _split(weights: dict[str, mx.array]) -> Iterator[dict[str, mx.array]]:
    """Consecutive groups of `weights` of at most MAX_SHARD_BYTES each, but for a tensor larger than that alone."""
    shard: dict[str, mx.array] = {}
    size = 0
    for name, tensor in weights.items():
        if shard and size + tensor.nbytes > MAX_SHARD_BYTES:
            yield shard
            shard, size = {}, 0
        shard[name] = tensor
        size += tensor.nbytes
    if shard:
        yield shard


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plugd.runner.quantize", description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path, help="float checkpoint directory")
    parser.add_argument("dst", type=Path, help="output directory: must not exist, or be empty")
    parser.add_argument("--module", required=True, help="architecture module, as its plugin's descriptor names it")
    parser.add_argument("--bits", type=int, required=True, help=f"bits per weight: {', '.join(map(str, BITS))}")
    parser.add_argument("--group-size", type=int, default=64, help="weights sharing a scale and bias (default 64)")
    args = parser.parse_args(argv)
    try:
        quantize_checkpoint(args.src, args.dst, importlib.import_module(args.module), args.bits, args.group_size)
    except Exception as error:  # any failure is reported as one line
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
