"""Tiny checkpoints of the hybrid (recurrent + attention) model types, registered into plugd.testing.checkpoints.

    write_checkpoint(tmp_path / "m", "nemotron_h")    # also "qwen3_next", "qwen3_5", "qwen3_5_moe"

Weights are named and shaped as the Hugging Face hub checkpoints hold them:
convolution kernels as (channels, 1, kernel), per-expert tensors for
Nemotron-H and Qwen3-Next, fused 3-D expert tensors for Qwen3.5-MoE, Qwen3.5
under `model.language_model.` with its text settings nested in `text_config`,
and multi-token-prediction tensors (`mtp.*`) where the config announces them:
Qwen3-Next's and Qwen3.5's whole head, as the hub's checkpoints carry it, and
a few of Nemotron-H's, which its loader drops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Shapes = dict[str, tuple[int, ...]]

_NEMOTRON_H: dict[str, Any] = {
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "hidden_size": 64,
    # Mamba2, MoE, attention, Mamba2, MLP, Mamba2.
    "hybrid_override_pattern": "ME*M-M",
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "attention_bias": False,
    "mamba_num_heads": 8,
    "mamba_head_dim": 16,
    "ssm_state_size": 16,
    "n_groups": 2,
    "conv_kernel": 4,
    "use_conv_bias": True,
    "mamba_proj_bias": False,
    "mamba_hidden_act": "silu",
    "chunk_size": 128,
    "time_step_limit": [0.0, float("inf")],
    "intermediate_size": 128,
    "mlp_bias": False,
    "mlp_hidden_act": "relu2",
    "use_bias": False,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "moe_shared_expert_intermediate_size": 64,
    "n_shared_experts": 1,
    "n_group": 2,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "layer_norm_epsilon": 1e-5,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "num_nextn_predict_layers": 0,
}

_GATED_DELTA: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
    # Linear attention, full attention, linear, full.
    "full_attention_interval": 2,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "hidden_act": "silu",
    "mtp_num_hidden_layers": 1,
}
_SHARED_EXPERT_MOE: dict[str, Any] = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 64,
    "norm_topk_prob": True,
}

BASE_CONFIGS: dict[str, dict[str, Any]] = {
    "nemotron_h": _NEMOTRON_H,
    "qwen3_next": {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        **_GATED_DELTA,
        **_SHARED_EXPERT_MOE,
        "intermediate_size": 128,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [2],
        "rope_theta": 1000000.0,
        "partial_rotary_factor": 0.25,
    },
    "qwen3_5": {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        **_GATED_DELTA,
        "intermediate_size": 128,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                            "mrope_section": [1, 1, 0], "mrope_interleaved": True},
    },
}
BASE_CONFIGS["qwen3_5_moe"] = {
    **{key: value for key, value in BASE_CONFIGS["qwen3_5"].items() if key != "intermediate_size"},
    "architectures": ["Qwen3_5MoeForConditionalGeneration"],
    "model_type": "qwen3_5_moe",
    **_SHARED_EXPERT_MOE,
}

# Settings of a Qwen3.5 config.json that stay outside text_config.
_TOP_LEVEL = ("architectures", "model_type", "tie_word_embeddings", "eos_token_id", "torch_dtype")


def nest_text_config(config: dict[str, Any]) -> dict[str, Any]:
    """A flat Qwen3.5 config as the hub writes it: the language model's settings under text_config."""
    text = {key: value for key, value in config.items() if key not in _TOP_LEVEL[:2]}
    text["model_type"] = config["model_type"] + "_text"
    text["layer_types"] = [
        "full_attention" if (i + 1) % text["full_attention_interval"] == 0 else "linear_attention"
        for i in range(text["num_hidden_layers"])
    ]
    return {key: config[key] for key in _TOP_LEVEL if key in config} | {"text_config": text}


def _nemotron_h_shapes(c: dict[str, Any]) -> Shapes:
    h = c["hidden_size"]
    shapes: Shapes = {"backbone.embeddings.weight": (c["vocab_size"], h), "backbone.norm_f.weight": (h,)}
    if not c["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (c["vocab_size"], h)
    for i, kind in enumerate(c["hybrid_override_pattern"]):
        p = f"backbone.layers.{i}."
        shapes[p + "norm.weight"] = (h,)
        shapes |= _NEMOTRON_BLOCKS[kind](c, p + "mixer.")
    if c["num_nextn_predict_layers"]:
        shapes |= _mtp_shapes(h)
    return shapes


def _mamba2_shapes(c: dict[str, Any], p: str) -> Shapes:
    heads, h = c["mamba_num_heads"], c["hidden_size"]
    inner = heads * c["mamba_head_dim"]
    conv = inner + 2 * c["n_groups"] * c["ssm_state_size"]
    shapes: Shapes = {
        p + "in_proj.weight": (inner + conv + heads, h),
        p + "conv1d.weight": (conv, 1, c["conv_kernel"]),
        p + "dt_bias": (heads,),
        p + "A_log": (heads,),
        p + "D": (heads,),
        p + "norm.weight": (inner,),
        p + "out_proj.weight": (h, inner),
    }
    if c["use_conv_bias"]:
        shapes[p + "conv1d.bias"] = (conv,)
    return shapes


def _attention_shapes(c: dict[str, Any], p: str, query_factor: int = 1) -> Shapes:
    h, heads, kv, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    return {
        p + "q_proj.weight": (heads * hd * query_factor, h),
        p + "k_proj.weight": (kv * hd, h),
        p + "v_proj.weight": (kv * hd, h),
        p + "o_proj.weight": (h, heads * hd),
    }


def _relu2_mlp_shapes(h: int, i: int, p: str) -> Shapes:
    return {p + "up_proj.weight": (i, h), p + "down_proj.weight": (h, i)}


def _nemotron_moe_shapes(c: dict[str, Any], p: str) -> Shapes:
    h, experts = c["hidden_size"], c["n_routed_experts"]
    shapes: Shapes = {p + "gate.weight": (experts, h), p + "gate.e_score_correction_bias": (experts,)}
    for e in range(experts):
        shapes |= _relu2_mlp_shapes(h, c["moe_intermediate_size"], f"{p}experts.{e}.")
    return shapes | _relu2_mlp_shapes(h, c["moe_shared_expert_intermediate_size"], p + "shared_experts.")


_NEMOTRON_BLOCKS: dict[str, Callable[[dict[str, Any], str], Shapes]] = {
    "M": _mamba2_shapes,
    "*": _attention_shapes,
    "-": lambda c, p: _relu2_mlp_shapes(c["hidden_size"], c["intermediate_size"], p),
    "E": _nemotron_moe_shapes,
}


def _mtp_shapes(h: int) -> Shapes:
    return {"mtp.fc.weight": (h, 2 * h), "mtp.norm.weight": (h,), "mtp.layers.0.input_layernorm.weight": (h,)}


def _gated_delta_shapes(config: dict[str, Any]) -> Shapes:
    """Qwen3-Next (packed projections, `model.`) and Qwen3.5 (separate projections, `model.language_model.`)."""
    c = config.get("text_config", config)
    packed = config["model_type"] == "qwen3_next"
    h, vocab = c["hidden_size"], c["vocab_size"]
    root = "model." if packed else "model.language_model."
    shapes: Shapes = {root + "embed_tokens.weight": (vocab, h), root + "norm.weight": (h,)}
    if not c["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (vocab, h)
    for i in range(c["num_hidden_layers"]):
        p = f"{root}layers.{i}."
        shapes |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)}
        if (i + 1) % c["full_attention_interval"]:
            shapes |= _linear_attention_shapes(c, p + "linear_attn.", packed)
        else:
            hd = c["head_dim"]
            shapes |= _attention_shapes(c, p + "self_attn.", query_factor=2)
            shapes |= {p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)}
        shapes |= _qwen_mlp_shapes(c, i, p + "mlp.", fused_experts=config["model_type"] == "qwen3_5_moe")
    if c.get("mtp_num_hidden_layers"):
        shapes |= _qwen_mtp_shapes(config)
    return shapes


def _qwen_mtp_shapes(config: dict[str, Any]) -> Shapes:
    """A multi-token-prediction head as Qwen3-Next and Qwen3.5 checkpoints hold it: norms of the embedding and of the
    hidden state, their projection, one full-attention decoder layer (its feed-forward as the model's first
    layer's) and a final norm."""
    c = config.get("text_config", config)
    h, hd = c["hidden_size"], c["head_dim"]
    shapes: Shapes = {"mtp.fc.weight": (h, 2 * h), "mtp.pre_fc_norm_embedding.weight": (h,),
                      "mtp.pre_fc_norm_hidden.weight": (h,), "mtp.norm.weight": (h,)}
    p = "mtp.layers.0."
    shapes |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
               p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)}
    shapes |= _attention_shapes(c, p + "self_attn.", query_factor=2)
    return shapes | _qwen_mlp_shapes(c, 0, p + "mlp.", fused_experts=config["model_type"] == "qwen3_5_moe")


def _linear_attention_shapes(c: dict[str, Any], p: str, packed: bool) -> Shapes:
    h, nk, nv = c["hidden_size"], c["linear_num_key_heads"], c["linear_num_value_heads"]
    key_dim, value_dim = nk * c["linear_key_head_dim"], nv * c["linear_value_head_dim"]
    conv = 2 * key_dim + value_dim
    shapes: Shapes = {
        p + "conv1d.weight": (conv, 1, c["linear_conv_kernel_dim"]),
        p + "dt_bias": (nv,),
        p + "A_log": (nv,),
        p + "norm.weight": (c["linear_value_head_dim"],),
        p + "out_proj.weight": (h, value_dim),
    }
    if packed:
        return shapes | {p + "in_proj_qkvz.weight": (conv + value_dim, h), p + "in_proj_ba.weight": (2 * nv, h)}
    return shapes | {
        p + "in_proj_qkv.weight": (conv, h),
        p + "in_proj_z.weight": (value_dim, h),
        p + "in_proj_b.weight": (nv, h),
        p + "in_proj_a.weight": (nv, h),
    }


def _qwen_mlp_shapes(c: dict[str, Any], layer: int, p: str, fused_experts: bool) -> Shapes:
    h = c["hidden_size"]

    def swiglu(i: int, q: str) -> Shapes:
        return {q + "gate_proj.weight": (i, h), q + "up_proj.weight": (i, h), q + "down_proj.weight": (h, i)}

    sparse = (
        c.get("num_experts", 0) > 0
        and layer not in c.get("mlp_only_layers", ())
        and (layer + 1) % c.get("decoder_sparse_step", 1) == 0
    )
    if not sparse:
        return swiglu(c["intermediate_size"], p)
    experts, i = c["num_experts"], c["moe_intermediate_size"]
    shapes: Shapes = {p + "gate.weight": (experts, h), p + "shared_expert_gate.weight": (1, h)}
    shapes |= swiglu(c["shared_expert_intermediate_size"], p + "shared_expert.")
    if fused_experts:
        return shapes | {p + "experts.gate_up_proj": (experts, 2 * i, h), p + "experts.down_proj": (experts, h, i)}
    for e in range(experts):
        shapes |= swiglu(i, f"{p}experts.{e}.")
    return shapes


SHAPES: dict[str, Callable[[dict[str, Any]], Shapes]] = {
    "nemotron_h": _nemotron_h_shapes,
    "qwen3_next": _gated_delta_shapes,
    "qwen3_5": _gated_delta_shapes,
    "qwen3_5_moe": _gated_delta_shapes,
}
# How a model type's config.json is laid out when written, from the flat settings.
LAYOUTS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "qwen3_5": nest_text_config,
    "qwen3_5_moe": nest_text_config,
}
