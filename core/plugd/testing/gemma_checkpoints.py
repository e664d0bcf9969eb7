"""Tiny checkpoints of the Gemma text model types, registered into plugd.testing.checkpoints.

    write_checkpoint(tmp_path / "m", "gemma3_text")    # also "gemma4_text"

Both have a 32-position sliding window, so prompts of a few dozen tokens
already rotate the sliding layers' caches. gemma3_text is written in the
older config vintage (rope_theta, rope_local_base_freq, sliding_window_pattern)
that mlx-lm reads; gemma4_text as transformers 5 writes it (layer_types,
rope_parameters per layer type), with KV-sharing layers, wider global heads,
per-layer inputs and soft-capped logits. Both tie the output projection to the
embeddings, as the hub checkpoints do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Shapes = dict[str, tuple[int, ...]]

_GEMMA3_TEXT: dict[str, Any] = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "query_pre_attn_scalar": 24,
    "rms_norm_eps": 1e-6,
    "sliding_window": 32,
    # Sliding, global, sliding, global.
    "sliding_window_pattern": 2,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    "max_position_embeddings": 4096,
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
    "hidden_activation": "gelu_pytorch_tanh",
    "tie_word_embeddings": True,
}

_GEMMA4_TEXT: dict[str, Any] = {
    "architectures": ["Gemma4ForCausalLM"],
    "model_type": "gemma4_text",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "global_head_dim": 32,
    "num_global_key_value_heads": 1,
    "attention_k_eq_v": False,
    "num_kv_shared_layers": 2,
    "use_double_wide_mlp": True,
    "hidden_size_per_layer_input": 8,
    "rms_norm_eps": 1e-6,
    "sliding_window": 32,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2,
    "rope_parameters": {
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    },
    "max_position_embeddings": 4096,
    "final_logit_softcapping": 30.0,
    "enable_moe_block": False,
    "hidden_activation": "gelu_pytorch_tanh",
    "tie_word_embeddings": True,
}

BASE_CONFIGS: dict[str, dict[str, Any]] = {"gemma3_text": _GEMMA3_TEXT, "gemma4_text": _GEMMA4_TEXT}


def _decoder_shapes(c: dict[str, Any]) -> Shapes:
    h = c["hidden_size"]
    shapes: Shapes = {"model.embed_tokens.weight": (c["vocab_size"], h), "model.norm.weight": (h,)}
    if not c["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (c["vocab_size"], h)
    return shapes


def _layer_shapes(c: dict[str, Any], p: str, head_dim: int, kv_heads: int, intermediate: int, values: bool) -> Shapes:
    h, heads = c["hidden_size"], c["num_attention_heads"]
    shapes: Shapes = {
        p + "input_layernorm.weight": (h,),
        p + "post_attention_layernorm.weight": (h,),
        p + "pre_feedforward_layernorm.weight": (h,),
        p + "post_feedforward_layernorm.weight": (h,),
        p + "self_attn.q_proj.weight": (heads * head_dim, h),
        p + "self_attn.k_proj.weight": (kv_heads * head_dim, h),
        p + "self_attn.o_proj.weight": (h, heads * head_dim),
        p + "self_attn.q_norm.weight": (head_dim,),
        p + "self_attn.k_norm.weight": (head_dim,),
        p + "mlp.gate_proj.weight": (intermediate, h),
        p + "mlp.up_proj.weight": (intermediate, h),
        p + "mlp.down_proj.weight": (h, intermediate),
    }
    if values:
        shapes[p + "self_attn.v_proj.weight"] = (kv_heads * head_dim, h)
    return shapes


def _gemma3_text_shapes(c: dict[str, Any]) -> Shapes:
    shapes = _decoder_shapes(c)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= _layer_shapes(c, p, c["head_dim"], c["num_key_value_heads"], c["intermediate_size"], values=True)
    return shapes


def _gemma4_text_shapes(c: dict[str, Any]) -> Shapes:
    """Like the hub checkpoints, KV-sharing layers keep key/value projections that loaders drop."""
    h, layers, per_layer = c["hidden_size"], c["num_hidden_layers"], c["hidden_size_per_layer_input"]
    first_shared = layers - c["num_kv_shared_layers"]
    shapes = _decoder_shapes(c)
    if per_layer:
        shapes |= {
            "model.embed_tokens_per_layer.weight": (c["vocab_size_per_layer_input"], layers * per_layer),
            "model.per_layer_model_projection.weight": (layers * per_layer, h),
            "model.per_layer_projection_norm.weight": (per_layer,),
        }
    for i, kind in enumerate(c["layer_types"]):
        p = f"model.layers.{i}."
        full = kind == "full_attention"
        keys_are_values = full and c["attention_k_eq_v"]
        head_dim = c["global_head_dim"] if full else c["head_dim"]
        kv_heads = c["num_global_key_value_heads"] if keys_are_values else c["num_key_value_heads"]
        wide = c["use_double_wide_mlp"] and i >= first_shared
        intermediate = c["intermediate_size"] * (2 if wide else 1)
        shapes |= _layer_shapes(c, p, head_dim, kv_heads, intermediate, values=not keys_are_values)
        shapes[p + "layer_scalar"] = (1,)
        if per_layer:
            shapes |= {
                p + "per_layer_input_gate.weight": (per_layer, h),
                p + "per_layer_projection.weight": (h, per_layer),
                p + "post_per_layer_input_norm.weight": (h,),
            }
    return shapes


def _gemma4_text_layout(config: dict[str, Any]) -> dict[str, Any]:
    """The per-layer embedding covers the whole vocabulary, whatever size it was given."""
    return {"vocab_size_per_layer_input": config["vocab_size"], **config}


SHAPES: dict[str, Callable[[dict[str, Any]], Shapes]] = {
    "gemma3_text": _gemma3_text_shapes,
    "gemma4_text": _gemma4_text_shapes,
}
LAYOUTS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {"gemma4_text": _gemma4_text_layout}
