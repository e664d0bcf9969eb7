"""A tiny Qwen3.5 with its vision tower, written by transformers: Qwen3_5ForConditionalGeneration of a tiny config
(plugd.testing's qwen3_5 as its language model), every parameter drawn at random
(plugd.testing.vision.randomize), saved with save_pretrained; beside it the tiny tokenizer with Qwen3.5's vision and
thinking tokens appended and Qwen3.5's own chat template (its variant that thinks only when asked).

    write_qwen3_5_vision(tmp_path / "m", seed=0)

The tower is two blocks over 8-pixel patches with an 8 x 8 position table,
merged 2 x 2. The processor's pixel budget (at least 65,536 pixels) makes
every image 256 image tokens or more. Full attention rotates half of each
head, its four frequencies split time, row, column, time (mrope_section
[2, 1, 1]), so that each axis shows in the logits. Needs torch and
transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from plugd.testing.hybrid_checkpoints import BASE_CONFIGS, nest_text_config
from plugd.testing.vision import randomize, write_tokenizer

TEMPLATE = Path(__file__).resolve().parent / "templates" / "qwen3.5-nothink.jinja"
TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>", "<think>", "</think>",
          "<tool_call>", "</tool_call>")
VISION: dict[str, Any] = {
    "depth": 2,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_heads": 2,
    "patch_size": 8,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "num_position_embeddings": 64,
}
# The image processor's settings in Qwen3.5's preprocessor_config.json.
PROCESSOR: dict[str, Any] = {"size": {"shortest_edge": 65_536, "longest_edge": 16_777_216},
                             "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
ROPE = {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.5, "mrope_section": [2, 1, 1],
        "mrope_interleaved": True}


def write_qwen3_5_vision(path: Path, seed: int = 0, moe: bool = False) -> Path:
    """The checkpoint in `path`; with `moe`, Qwen3.5-MoE's (qwen3_5_moe)."""
    import transformers

    path.mkdir(parents=True, exist_ok=True)
    ids, vocab_size = write_tokenizer(path, TOKENS)
    eos = ids["<|im_end|>"]
    text = nest_text_config(BASE_CONFIGS["qwen3_5_moe" if moe else "qwen3_5"])["text_config"]
    text |= {"vocab_size": vocab_size, "eos_token_id": eos, "rope_parameters": ROPE}
    kind = "Qwen3_5Moe" if moe else "Qwen3_5"
    config = getattr(transformers, f"{kind}Config")(
        text_config=text, vision_config=VISION | {"out_hidden_size": text["hidden_size"]},
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"], eos_token_id=eos,
        tie_word_embeddings=False)
    model = getattr(transformers, f"{kind}ForConditionalGeneration")(config).eval()
    randomize(model, seed)
    model.save_pretrained(path)
    tokenizer_config = json.loads((path / "tokenizer_config.json").read_text())
    tokenizer_config |= {"chat_template": TEMPLATE.read_text(), "image_token": "<|image_pad|>",
                         "vision_start_token": "<|vision_start|>", "vision_end_token": "<|vision_end|>"}
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos]}))
    preprocessor = PROCESSOR | {"patch_size": VISION["patch_size"], "merge_size": VISION["spatial_merge_size"],
                                "temporal_patch_size": VISION["temporal_patch_size"],
                                "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen3VLProcessor"}
    (path / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2))
    return path


def processed(images, return_tensors: str = "pt"):
    """transformers' image processor (the PIL one) with the checkpoint's preprocessor_config.json settings."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    processor = Qwen2VLImageProcessorPil(patch_size=VISION["patch_size"], merge_size=VISION["spatial_merge_size"],
                                         temporal_patch_size=VISION["temporal_patch_size"], **PROCESSOR)
    return processor(images=images, return_tensors=return_tensors)


# What the end-to-end tests need of each vision family: the renderer's placeholder, and transformers' own reading
# of images: the text each expands to, and its greedy continuation of a prompt.
PLACEHOLDER, IMAGE_END = "<|image_pad|>", "<|vision_end|>"


def reference_expansions(images) -> list[str]:
    """Each image's text as transformers' processor expands it: one image token per merged patch."""
    merge = VISION["spatial_merge_size"]
    return ["<|image_pad|>" * (int(t * h * w) // merge**2) for t, h, w in processed(images)["image_grid_thw"]]


def reference_greedy(path: Path, ids: list[int], images, count: int) -> list[int]:
    """transformers' greedy continuation of `ids` (the images already expanded in them), `count` tokens at most."""
    import torch
    from transformers import Qwen3_5ForConditionalGeneration

    inputs, tokens = processed(images), torch.tensor([ids])
    model = Qwen3_5ForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(input_ids=tokens, attention_mask=torch.ones_like(tokens),
                             pixel_values=inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"],
                             mm_token_type_ids=(tokens == model.config.image_token_id).long(),
                             max_new_tokens=count, do_sample=False)
    return out[0, len(ids):].tolist()


# The tensor-name prefix of the tower; Qwen3.5 has no audio tower.
TOWER_TENSORS, AUDIO_TENSOR = ("model.visual.",), None
