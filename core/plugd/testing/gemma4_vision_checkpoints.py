"""A tiny Gemma 4 with its vision tower, written by transformers: Gemma4ForConditionalGeneration of a tiny config,
every parameter drawn at random (plugd.testing.vision.randomize), saved with save_pretrained; beside it the tiny
tokenizer with Gemma 4's turn and image tokens appended, the Gemma 4 chat template and the image processor's
settings.

    write_gemma4_vision(tmp_path / "m", seed=0)

The text model is plugd.testing's gemma4_text; the tower is two layers over
4-pixel patches pooled 2 x 2, 70 soft tokens per image at most, its linear
layers clipped to finite bounds and its output standardised, so every part
of the tower shows in its features. Needs torch and transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from plugd.testing.gemma_checkpoints import BASE_CONFIGS
from plugd.testing.vision import randomize, write_tokenizer

TEMPLATE = Path(__file__).resolve().parent / "templates" / "gemma4.jinja"
TOKENS = ("<bos>", "<eos>", "<pad>", "<|turn>", "<turn|>", "<|image>", "<image|>", "<|image|>", "<|channel>",
          "<channel|>", "<|tool_call>", "<tool_call|>", '<|"|>')
SOFT_TOKENS = 70
VISION: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "patch_size": 4,
    "pooling_kernel_size": 2,
    "position_embedding_size": 160,
    "rope_parameters": {"rope_type": "axial", "rope_theta": 100.0},
    "use_clipped_linears": True,
    "standardize": True,
}


def write_gemma4_vision(path: Path, seed: int = 0, bidirectional: bool = True) -> Path:
    """The checkpoint in `path`; with `bidirectional`, images attend both ways on sliding layers
    (use_bidirectional_attention "vision", as the larger Gemma 4 models do)."""
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    path.mkdir(parents=True, exist_ok=True)
    ids, vocab_size = write_tokenizer(path, TOKENS)
    text = {key: value for key, value in BASE_CONFIGS["gemma4_text"].items() if key != "architectures"}
    text |= {"vocab_size": vocab_size, "vocab_size_per_layer_input": vocab_size,
             "pad_token_id": ids["<pad>"], "bos_token_id": ids["<bos>"], "eos_token_id": ids["<eos>"],
             "use_bidirectional_attention": "vision" if bidirectional else None}
    config = Gemma4Config(text_config=text, vision_config=VISION, audio_config=None,
                          image_token_id=ids["<|image|>"], boi_token_id=ids["<|image>"], eoi_token_id=ids["<image|>"],
                          eos_token_id=[ids["<eos>"], ids["<turn|>"]], vision_soft_tokens_per_image=SOFT_TOKENS)
    model = Gemma4ForConditionalGeneration(config).eval()
    _randomize(model, seed)
    model.save_pretrained(path)
    _write_tokenizer_files(path, ids)
    return path


def _randomize(model, seed: int) -> None:
    """Parameters drawn at random; clipping bounds finite, so that they clip; the standardisation drawn too."""
    import torch

    generator = randomize(model, seed)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            bounds = {"input_min": -2.0, "input_max": 2.0, "output_min": -0.5, "output_max": 0.5}
            if name.rpartition(".")[2] in bounds:
                buffer.fill_(bounds[name.rpartition(".")[2]])
            elif name.endswith(("std_bias", "std_scale")):
                buffer.copy_(0.1 * torch.randn(buffer.shape, generator=generator) + name.endswith("std_scale"))


def _write_tokenizer_files(path: Path, ids: dict[str, int]) -> None:
    config = {
        "tokenizer_class": "GemmaTokenizer",
        "bos_token": "<bos>",
        "add_bos_token": True,
        "eos_token": "<turn|>",
        "pad_token": "<pad>",
        "boi_token": "<|image>",
        "eoi_token": "<image|>",
        "image_token": "<|image|>",
        "chat_template": TEMPLATE.read_text(),
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [ids["<eos>"], ids["<turn|>"]]}))
    processor = {"image_processor": {"image_processor_type": "Gemma4ImageProcessor", "patch_size": VISION["patch_size"],
                                     "pooling_kernel_size": VISION["pooling_kernel_size"], "max_soft_tokens": SOFT_TOKENS},
                 "image_seq_length": SOFT_TOKENS, "processor_class": "Gemma4Processor"}
    (path / "processor_config.json").write_text(json.dumps(processor, indent=2))


# What the end-to-end tests need of each vision family: the renderer's placeholder, and transformers' own reading
# of images: the text each expands to, and its greedy continuation of a prompt.
PLACEHOLDER, IMAGE_END = "<|image|>", "<image|>"


def _processed(images):
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    processor = Gemma4ImageProcessorPil(patch_size=VISION["patch_size"], max_soft_tokens=SOFT_TOKENS,
                                        pooling_kernel_size=VISION["pooling_kernel_size"])
    return processor(images=images, return_tensors="pt")


def reference_expansions(images) -> list[str]:
    """Each image's text as transformers' processor expands it."""
    return ["<|image>" + "<|image|>" * int(n) + "<image|>" for n in _processed(images)["num_soft_tokens_per_image"]]


def reference_greedy(path: Path, ids: list[int], images, count: int) -> list[int]:
    """transformers' greedy continuation of `ids` (the images already expanded in them), `count` tokens at most."""
    import torch
    from transformers import Gemma4ForConditionalGeneration

    inputs, tokens = _processed(images), torch.tensor([ids])
    model = Gemma4ForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(input_ids=tokens, attention_mask=torch.ones_like(tokens),
                             pixel_values=inputs["pixel_values"], image_position_ids=inputs["image_position_ids"],
                             mm_token_type_ids=(tokens == model.config.image_token_id).long(),
                             max_new_tokens=count, do_sample=False)
    return out[0, len(ids):].tolist()
# The tensor-name prefixes of the tower, and a name an audio tower's tensor would have, in this checkpoint's layout.
TOWER_TENSORS, AUDIO_TENSOR = ("model.vision_tower.", "model.embed_vision."), "model.audio_tower.output_proj.weight"
