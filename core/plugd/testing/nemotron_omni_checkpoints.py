"""A tiny Nemotron-H Omni with its RADIO vision tower, written by transformers: NemotronH_Omni_Reasoning_V3 of a tiny
config (plugd.testing's nemotron_h as its language model), every parameter drawn at random
(plugd.testing.vision.randomize), saved with
save_pretrained; beside it the tiny tokenizer with the image tokens appended and a small chat template of plugd's
own that writes "<image>" for each image (Omni's own template is not public here).

    write_nemotron_omni(tmp_path / "m", seed=0)

The tower is two layers over 4-pixel patches with a 16 x 16 position table;
as the processor's defaults ask, every image becomes 1,024 to 13,312
patches, 256 image tokens or more. With `mtp`, the language model declares a
multi-token-prediction layer, so the tower's output passes its final
LayerNorm. Needs torch and transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from plugd.testing.hybrid_checkpoints import BASE_CONFIGS
from plugd.testing.vision import randomize, write_tokenizer

TOKENS = ("<img>", "</img>", "<image>")
CHAT_TEMPLATE = """\
{%- for message in messages %}<|im_start|>{{ message.role }}
{% if message.content is string %}{{ message.content }}{% else %}{% for part in message.content %}\
{% if part.type == 'image' %}<image>{% else %}{{ part.text }}{% endif %}{% endfor %}{% endif %}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
VISION: dict[str, Any] = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "mlp_ratio": 2.0,
    "patch_size": 4,
    "max_img_size": 64,
    "num_cls_tokens": 2,
    "num_registers": 2,
    "summary_idxs": [0, 1],
    "video_temporal_patch_size": 2,
}


def write_nemotron_omni(path: Path, seed: int = 0, mtp: bool = False) -> Path:
    from transformers import NemotronH_Omni_Reasoning_V3, NemotronH_Omni_Reasoning_V3_Config

    path.mkdir(parents=True, exist_ok=True)
    ids, vocab_size = write_tokenizer(path, TOKENS)
    eos = ids["<|im_end|>"]
    text = {key: value for key, value in BASE_CONFIGS["nemotron_h"].items() if key != "architectures"}
    text |= {"vocab_size": vocab_size, "eos_token_id": eos, "num_nextn_predict_layers": int(mtp)}
    config = NemotronH_Omni_Reasoning_V3_Config(
        text_config=text, vision_config=VISION, audio_config=None, vision_hidden_size=VISION["hidden_size"],
        projector_hidden_size=48, downsample_ratio=0.5, image_token_id=ids["<image>"], eos_token_id=eos)
    model = NemotronH_Omni_Reasoning_V3(config).eval()
    randomize(model, seed)
    model.save_pretrained(path)
    tokenizer_config = json.loads((path / "tokenizer_config.json").read_text())
    tokenizer_config |= {"chat_template": CHAT_TEMPLATE, "image_token": "<image>", "image_start_token": "<img>",
                         "image_end_token": "</img>"}
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos]}))
    return path


def transformers_patch_grid():
    """transformers' get_patch_grid_size, read from its processor module's source: the module imports
    torchvision, which a CPU-only torch here cannot load."""
    import ast
    import importlib.util
    import math

    path = importlib.util.find_spec("transformers.models.nemotron_h_omni.image_processing_nemotron_h_omni").origin
    tree = ast.parse(Path(path).read_text())
    [function] = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "get_patch_grid_size"]
    namespace: dict[str, Any] = {"math": math}
    exec(compile(ast.Module([function], type_ignores=[]), path, "exec"), namespace)
    return namespace["get_patch_grid_size"]


def reference_inputs(images, patch: int = VISION["patch_size"]):
    """pixel_values and image_grid_hw as transformers' processor makes them with its defaults, its steps done with
    torch itself (torchvision's resize on float tensors is torch's antialiased bicubic interpolation)."""
    import torch
    from transformers.image_transforms import convert_to_rgb

    grid_of, mean, std = transformers_patch_grid(), torch.tensor(CLIP_MEAN), torch.tensor(CLIP_STD)
    pixels, grids = [], []
    for image in images:
        rgb = torch.tensor(convert_to_rgb(image, return_numpy=True))
        height, width = rgb.shape[:2]
        rows, columns = grid_of(height, width, patch, 2, 1024, 13_312)
        values = rgb.permute(2, 0, 1)[None].float()
        if (height, width) != (rows * patch, columns * patch):
            values = torch.nn.functional.interpolate(values, size=(rows * patch, columns * patch), mode="bicubic",
                                                     antialias=True, align_corners=False)
        values = (values / 255 - mean[None, :, None, None]) / std[None, :, None, None]
        values = values.reshape(1, 3, rows, patch, columns, patch).permute(0, 2, 4, 1, 3, 5)
        pixels.append(values.reshape(rows * columns, 3 * patch * patch))
        grids.append([rows, columns])
    return torch.cat(pixels), torch.tensor(grids)


CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


# What the end-to-end tests need of each vision family (as plugd.testing.gemma4_vision_checkpoints gives).
PLACEHOLDER, IMAGE_END = "<image>", "</img>"


def reference_expansions(images) -> list[str]:
    """Each image's text as transformers' processor expands it: a token per 2 x 2 patches of its grid."""
    _, grids = reference_inputs(images)
    return ["<img>" + "<image>" * (rows * columns // 4) + "</img>" for rows, columns in grids.tolist()]


def reference_greedy(path: Path, ids: list[int], images, count: int) -> list[int]:
    """transformers' greedy continuation of `ids` (the images already expanded in them), `count` tokens at most."""
    import torch
    from transformers import NemotronH_Omni_Reasoning_V3

    (pixels, grids), tokens = reference_inputs(images), torch.tensor([ids])
    model = NemotronH_Omni_Reasoning_V3.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(input_ids=tokens, attention_mask=torch.ones_like(tokens), pixel_values=pixels,
                             image_grid_hw=grids, max_new_tokens=count, do_sample=False)
    return out[0, len(ids):].tolist()
# The tensor-name prefixes of the tower, and a name an audio tower's tensor would have, in this checkpoint's layout.
TOWER_TENSORS, AUDIO_TENSOR = ("vision_model.", "mlp1.", "vision_projector."), "sound_encoder.encoder.proj.weight"
