"""Tiny checkpoints of the Gemma model types, registered into plugd.testing.checkpoints.

    write_checkpoint(tmp_path / "m", "gemma3_text")    # also "gemma4_text", "gemma3"

Both have a 32-position sliding window, so prompts of a few dozen tokens
already rotate the sliding layers' caches. gemma3_text is written in the
older config vintage (rope_theta, rope_local_base_freq, sliding_window_pattern)
that mlx-lm reads; gemma4_text as transformers 5 writes it (layer_types,
rope_parameters per layer type), with KV-sharing layers, wider global heads,
per-layer inputs and soft-capped logits. Both tie the output projection to the
embeddings, as the hub checkpoints do.

gemma3 is Gemma3ForConditionalGeneration in the hub's weight layout: the
gemma3_text model under `language_model.`, a 2-layer SigLIP tower on 56-pixel
images (8 x 8 patches of 7) pooled to 16 image tokens. Its tokenizer is the
tiny one plus Gemma's turn and image tokens appended (the config's
boi/eoi/image token indices point at them), with the Gemma 3 chat template and
a preprocessor_config.json as the hub's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from plugd.testing import tokenizer as tiny_tokenizer

GEMMA3_CHAT_TEMPLATE = Path(__file__).resolve().parent / "templates" / "gemma3.jinja"
# Appended to the tiny vocabulary in this order; the last three are the image tokens.
GEMMA_TOKENS = ("<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>",
                "<image_soft_token>")

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

_GEMMA3: dict[str, Any] = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "text_config": {key: value for key, value in _GEMMA3_TEXT.items() if key != "architectures"},
    "vision_config": {
        "model_type": "siglip_vision_model",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 56,
        "patch_size": 7,
        "num_channels": 3,
        "layer_norm_eps": 1e-6,
        "hidden_act": "gelu_pytorch_tanh",
        "vision_use_head": False,
    },
    "mm_tokens_per_image": 16,
    "tie_word_embeddings": True,
}

BASE_CONFIGS: dict[str, dict[str, Any]] = {"gemma3_text": _GEMMA3_TEXT, "gemma4_text": _GEMMA4_TEXT, "gemma3": _GEMMA3}


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


def _gemma3_shapes(c: dict[str, Any]) -> Shapes:
    shapes = {"language_model." + name: shape for name, shape in _gemma3_text_shapes(c["text_config"]).items()}
    v = c["vision_config"]
    h, patch, channels = v["hidden_size"], v["patch_size"], v["num_channels"]
    tower = "vision_tower.vision_model."
    shapes |= {
        tower + "embeddings.patch_embedding.weight": (h, channels, patch, patch),
        tower + "embeddings.patch_embedding.bias": (h,),
        tower + "embeddings.position_embedding.weight": ((v["image_size"] // patch) ** 2, h),
        tower + "post_layernorm.weight": (h,),
        tower + "post_layernorm.bias": (h,),
        "multi_modal_projector.mm_input_projection_weight": (h, c["text_config"]["hidden_size"]),
        "multi_modal_projector.mm_soft_emb_norm.weight": (h,),
    }
    linears = {"self_attn.q_proj": (h, h), "self_attn.k_proj": (h, h), "self_attn.v_proj": (h, h),
               "self_attn.out_proj": (h, h), "mlp.fc1": (v["intermediate_size"], h), "mlp.fc2": (h, v["intermediate_size"])}
    for i in range(v["num_hidden_layers"]):
        p = f"{tower}encoder.layers.{i}."
        for name, shape in linears.items():
            shapes |= {p + name + ".weight": shape, p + name + ".bias": shape[:1]}
        for norm in ("layer_norm1", "layer_norm2"):
            shapes |= {p + norm + ".weight": (h,), p + norm + ".bias": (h,)}
    return shapes


def _gemma3_layout(config: dict[str, Any]) -> dict[str, Any]:
    """GEMMA_TOKENS follow the tiny tokenizer's own tokens; the embedding covers them all."""
    base = tiny_tokenizer.train(config["vocab_size"]).get_vocab_size()
    ids = {token: base + i for i, token in enumerate(GEMMA_TOKENS)}
    vocab_size = max(config["vocab_size"], base + len(GEMMA_TOKENS))
    return {
        **config,
        "vocab_size": vocab_size,
        "text_config": {**config["text_config"], "vocab_size": vocab_size},
        "boi_token_index": ids["<start_of_image>"],
        "eoi_token_index": ids["<end_of_image>"],
        "image_token_index": ids["<image_soft_token>"],
        "eos_token_id": [ids["<eos>"], ids["<end_of_turn>"]],
    }


def _gemma3_files(path: Path, config: dict[str, Any]) -> None:
    """Gemma's tokens appended to the written tokenizer, the Gemma 3 chat template, and the image processor's config."""
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.add_special_tokens(list(GEMMA_TOKENS))
    if tok.token_to_id("<image_soft_token>") != config["image_token_index"]:
        raise ValueError("a gemma3 checkpoint takes the tiny tokenizer only")
    tok.save(str(path / "tokenizer.json"))
    tokenizer_config = json.loads((path / "tokenizer_config.json").read_text())
    tokenizer_config |= {
        "bos_token": "<bos>",
        "add_bos_token": True,
        "eos_token": "<end_of_turn>",
        "boi_token": "<start_of_image>",
        "eoi_token": "<end_of_image>",
        "image_token": "<image_soft_token>",
        "chat_template": GEMMA3_CHAT_TEMPLATE.read_text(),
    }
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": config["eos_token_id"], "top_k": 64}))
    size = config["vision_config"]["image_size"]
    processor = {
        "image_processor_type": "Gemma3ImageProcessor",
        "processor_class": "Gemma3Processor",
        "do_convert_rgb": None,
        "do_resize": True,
        "size": {"height": size, "width": size},
        "resample": 2,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "do_pan_and_scan": None,
        "image_seq_length": config["mm_tokens_per_image"],
    }
    (path / "preprocessor_config.json").write_text(json.dumps(processor, indent=2))


SHAPES: dict[str, Callable[[dict[str, Any]], Shapes]] = {
    "gemma3_text": _gemma3_text_shapes,
    "gemma4_text": _gemma4_text_shapes,
    "gemma3": _gemma3_shapes,
}
LAYOUTS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {"gemma4_text": _gemma4_text_layout, "gemma3": _gemma3_layout}
# Files beyond the common ones, written last from the final config.
EXTRA_FILES: dict[str, Callable[[Path, dict[str, Any]], None]] = {"gemma3": _gemma3_files}
