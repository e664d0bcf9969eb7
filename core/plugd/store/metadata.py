"""Per-blob tensor metadata, read once from a safetensors header and cached beside the blobs.

Listing and `show` read these small JSON files; they never open weights.
"""

from __future__ import annotations

import json
import math
from typing import Any

from safetensors import SafetensorError, safe_open

from plugd.store.blobs import write_atomically
from plugd.store.store import Store

FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16"})
BYTES_PER_ELEMENT = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "U32": 4, "I16": 2, "U16": 2,
                     "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


class MalformedWeights(ValueError):
    pass


# Ollama's quantization types (x/quant in ollama/ollama) and their bits per weight.
OLLAMA_BITS = {"int4": 4, "int8": 8, "nvfp4": 4, "mxfp4": 4, "mxfp8": 8}
# What Ollama stores beside a quantized tensor T: T.scale, T.bias (affine modes), T.global_scale (nvfp4).
OLLAMA_COMPANIONS = (".scale", ".bias", ".global_scale")


def tensor_metadata(store: Store, digest: str, file_name: str) -> dict[str, Any]:
    """{"tensors": {name: {"dtype", "shape"}}} for a safetensors blob, from the cache or its header; a tensor Ollama
    quantized (it has a `.scale` beside it) also has the "quant_type" the file's metadata gives it."""
    cached = store.metadata_path(digest)
    if cached.is_file():
        return json.loads(cached.read_bytes())
    try:
        with safe_open(str(store.blobs.path(digest)), framework="numpy") as f:
            tensors = {}
            keys, header = set(f.keys()), f.metadata() or {}
            for key in f.keys():
                piece = f.get_slice(key)
                tensors[key] = {"dtype": piece.get_dtype(), "shape": list(piece.get_shape())}
                quant_type = header.get(f"{key}.quant_type") or header.get("quant_type")
                if f"{key}.scale" in keys and quant_type:
                    tensors[key]["quant_type"] = quant_type.lower()
    except (SafetensorError, OSError) as exc:
        raise MalformedWeights(f"{file_name} is not a valid safetensors file: {exc}") from None
    metadata = {"format": "safetensors", "tensors": tensors}
    write_atomically(cached, json.dumps(metadata).encode())
    return metadata


def quantization(config: dict[str, Any]) -> dict[str, Any] | None:
    """The MLX affine quantization recorded in config.json, if any."""
    q = config.get("quantization") or config.get("quantization_config")
    return q if isinstance(q, dict) and "bits" in q else None


def parameter_count(tensors: dict[str, dict[str, Any]], config: dict[str, Any]) -> int:
    """Parameters of the model, counting packed quantized weights at their unpacked size."""
    q = quantization(config)
    total = 0
    for name, info in tensors.items():
        n = math.prod(info["shape"])
        base = name.removesuffix(".weight")
        if info.get("quant_type") in OLLAMA_BITS:
            n = n * 32 // OLLAMA_BITS[info["quant_type"]]
        elif name.endswith(OLLAMA_COMPANIONS) and "quant_type" in tensors.get(name.rsplit(".", 1)[0], {}):
            continue
        elif q and (base + ".scales") in tensors and info["dtype"] == "U32":
            layer = q.get(base)  # mlx-lm records layers quantized unlike the rest under their path
            n = n * 32 // (layer if isinstance(layer, dict) else q)["bits"]
        elif q and name.endswith((".scales", ".biases")) and (name.rsplit(".", 1)[0] + ".weight") in tensors:
            continue
        total += n
    return total


def file_type(tensors: dict[str, dict[str, Any]], config: dict[str, Any]) -> str:
    """Ollama's quantization_level: Q4, Q8 for quantized models (int4, int8 ... for those in Ollama's tensor layers,
    the type holding the most weights), else the dominant float dtype."""
    if q := quantization(config):
        return f"Q{q['bits']}"
    weight_bytes: dict[str, int] = {}
    quantized = any("quant_type" in info for info in tensors.values())
    for info in tensors.values():
        if quantized and "quant_type" not in info:
            continue
        kind, size = info.get("quant_type", info["dtype"]), BYTES_PER_ELEMENT.get(info["dtype"], 1)
        weight_bytes[kind] = weight_bytes.get(kind, 0) + math.prod(info["shape"]) * size
    return max(weight_bytes, key=weight_bytes.get) if weight_bytes else "unknown"


def human_parameters(count: int) -> str:
    """Ollama's parameter_size form: 596.05M, 8.2B."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.2f}".rstrip("0").rstrip(".") + unit
    return str(count)
