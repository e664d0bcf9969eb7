"""Nemotron-H Omni with its RADIO tower against transformers (NemotronH_Omni_Reasoning_V3, float32 on CPU) on a
tiny checkpoint transformers writes (plugd.testing.nemotron_omni_checkpoints), in the hub's tensor layout: the patch
grid each image is resized to (the daemon's count of its tokens), the preprocessed pixels, the tower's features and
the logits of a prompt holding two images of different sizes, in one forward and in chunks over the caches, with and
without the final LayerNorm checkpoints with multi-token prediction carry; a quantized checkpoint's tower left
dense. Needs torch (transformers comes with it) and skips without it."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from PIL import Image

from plugd.image_processor import directory_config
from plugd.nn.linear import QuantizedLinear, TowerLinear
from plugd.runner.loading import load_model
from plugd.runner.quantize import quantize_checkpoint
from plugd.testing.vision import embedded_apart_and_together, relative_error, stripped_copy, varied_images
from plugd.tokenizer import Tokenizer
from plugd_nemotron import nemotron_h_omni
from plugd_nemotron.omni_config import omni_cache_layers, omni_media_tokens, patch_grid

pytest.importorskip("torch")
from plugd.testing.nemotron_omni_checkpoints import (  # noqa: E402
    VISION,
    reference_inputs,
    transformers_patch_grid,
    write_nemotron_omni,
)

TOLERANCE = 1e-4  # relative_error


IMAGES = varied_images()


@pytest.fixture(scope="module", params=["plain", "mtp"])
def checkpoint(request, tmp_path_factory) -> Path:
    return write_nemotron_omni(tmp_path_factory.mktemp("omni"), seed=3, mtp=request.param == "mtp")


@pytest.fixture(scope="module")
def models(checkpoint):
    import torch
    from transformers import NemotronH_Omni_Reasoning_V3

    reference = NemotronH_Omni_Reasoning_V3.from_pretrained(checkpoint, dtype=torch.float32).eval()
    return load_model(checkpoint, nemotron_h_omni), reference


def test_the_patch_grid_is_the_processors_for_images_of_every_shape():
    """Sizes from one pixel to 5,000, the processor's own patch size: enlarged, kept, and shrunk to the cap."""
    expected = transformers_patch_grid()
    sizes = [(w, h) for w in range(1, 400, 7) for h in range(1, 400, 11)]
    sizes += [(w, h) for w in range(100, 5000, 97) for h in range(100, 5000, 89)]
    assert [patch_grid(w, h, 16, 2) for w, h in sizes] == [expected(h, w, 16, 2, 1024, 13_312) for w, h in sizes]


def test_a_checkpoints_own_patch_budget_is_followed(checkpoint, tmp_path):
    """A preprocessor_config.json that allows 256 to 2,048 patches: the expansion and the runner's patches follow
    the processor's grid for those bounds."""
    custom = stripped_copy(checkpoint, tmp_path / "budget", lambda name: True)
    (custom / "preprocessor_config.json").write_text(json.dumps({"min_num_patches": 256, "max_num_patches": 2048}))
    media = omni_media_tokens(directory_config(custom))
    model, expected = load_model(custom, nemotron_h_omni), transformers_patch_grid()
    for image in [*IMAGES.values(), Image.new("RGB", (4000, 3000))]:
        rows, columns = expected(image.height, image.width, VISION["patch_size"], 2, 256, 2048)
        assert model.preprocess(image).shape[:2] == (rows, columns)
        assert media.expand(*image.size) == "<img>" + "<image>" * (rows * columns // 4) + "</img>"


@pytest.mark.parametrize("kind", sorted(IMAGES))
def test_preprocess_and_token_count_match_the_processor(models, checkpoint, kind):
    ours, _ = models
    pixels, grid = reference_inputs([IMAGES[kind]])
    patches = np.array(ours.preprocess(IMAGES[kind]))
    rows, columns, size = patches.shape
    assert [[rows, columns]] == grid.tolist()
    assert relative_error(patches.reshape(rows * columns, size), pixels.numpy()) <= TOLERANCE
    media = omni_media_tokens(json.loads((checkpoint / "config.json").read_text()))
    assert media.expand(*IMAGES[kind].size) == "<img>" + "<image>" * (rows * columns // 4) + "</img>"


def reference_features(reference, images: list[Image.Image]) -> list[np.ndarray]:
    import torch

    pixels, grid = reference_inputs(images)
    with torch.no_grad():
        return [item.numpy() for item in reference.get_image_features(pixels, grid).pooler_output]


@pytest.mark.parametrize("kind", sorted(IMAGES))
def test_features_match_transformers(models, kind):
    ours, reference = models
    features = np.array(ours.embed_media(ours.preprocess(IMAGES[kind])[None]))[0]
    [expected] = reference_features(reference, [IMAGES[kind]])
    assert features.shape == expected.shape
    assert relative_error(features, expected) <= TOLERANCE


TWO_IMAGES = ("png", "jpeg")


@pytest.fixture(scope="module")
def prompt(models, checkpoint):
    """A turn holding two images of different sizes, expanded as the daemon does; our media spans; transformers'
    logits for it."""
    import torch

    ours, reference = models
    media_tokens = omni_media_tokens(json.loads((checkpoint / "config.json").read_text()))
    first, second = (media_tokens.expand(*IMAGES[kind].size) for kind in TWO_IMAGES)
    text = f"<|im_start|>user\nCompare {first} with {second} please.<|im_end|>\n<|im_start|>assistant\n"
    ids = Tokenizer.from_dir(checkpoint).encode(text)
    starts = [i for i, t in enumerate(ids) if t == media_tokens.token_id and ids[i - 1] != media_tokens.token_id]
    embedded = [ours.embed_media(ours.preprocess(IMAGES[kind])[None])[0] for kind in TWO_IMAGES]
    pixels, grid = reference_inputs([IMAGES[kind] for kind in TWO_IMAGES])
    with torch.no_grad():
        logits = reference(input_ids=torch.tensor([ids]), pixel_values=pixels, image_grid_hw=grid).logits[0].numpy()
    return ids, list(zip(starts, embedded, strict=True)), logits


def test_logits_with_two_images_match_transformers_at_every_position(models, prompt):
    ours, _ = models
    ids, media, expected = prompt
    assert relative_error(np.array(ours(mx.array([ids], mx.int32), media=media))[0], expected) <= TOLERANCE
    cached = np.array(ours(mx.array([ids], mx.int32), ours.make_cache(), media=media))[0]
    assert relative_error(cached, expected) <= TOLERANCE


def test_prefill_in_chunks_matches_transformers(models, prompt):
    """Chunk boundaries at a span's start, right after it, and between the images."""
    ours, _ = models
    ids, media, expected = prompt
    (first, rows), (second, _) = media
    for split in (first, first + rows.shape[0], (first + rows.shape[0] + second) // 2, second):
        cache = ours.make_cache()
        ours(mx.array([ids[:split]], mx.int32), cache, media=[(s, r) for s, r in media if s < split])
        logits = ours(mx.array([ids[split:]], mx.int32), cache, media=[(s - split, r) for s, r in media if s >= split])
        assert relative_error(np.array(logits)[0, -1], expected[-1]) <= TOLERANCE, f"split at {split}"


def test_quantized_checkpoint_keeps_the_tower_dense(checkpoint, models, tmp_path):
    ours, _ = models
    quantize_checkpoint(checkpoint, tmp_path / "q4", nemotron_h_omni, bits=4, group_size=32)
    quantized = load_model(tmp_path / "q4", nemotron_h_omni)
    assert isinstance(quantized.language_model.backbone.layers[2].mixer.q_proj, QuantizedLinear)
    assert isinstance(quantized.vision_model.encoder.layer[0].attention.q_proj, TowerLinear)
    assert isinstance(quantized.multi_modal_projector.linear_1, TowerLinear)
    patches = ours.preprocess(IMAGES["png"])[None]
    assert mx.array_equal(quantized.embed_media(patches), ours.embed_media(patches))


def test_the_tiny_tower_is_the_one_the_checkpoint_describes(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["model_type"] == "nemotron_h_omni"
    assert config["vision_config"]["patch_size"] == VISION["patch_size"]


def test_images_of_one_size_embed_in_one_batch_as_each_alone(models):
    """The runner stacks images whose preprocessed shapes agree."""
    apart, together = embedded_apart_and_together(models[0], IMAGES["png"])
    assert all(np.abs(together[i] - alone).max() <= 1e-5 for i, alone in enumerate(apart))


def test_released_checkpoints_config_names_read_as_transformers_names(checkpoint):
    """Released configs keep the language model under `llm_config` and the image token as
    `img_context_token_id`, names transformers still reads."""
    config = json.loads((checkpoint / "config.json").read_text())
    legacy = {key: value for key, value in config.items() if key not in ("text_config", "image_token_id")}
    legacy |= {"llm_config": config["text_config"], "img_context_token_id": config["image_token_id"]}
    assert nemotron_h_omni.ModelArgs.from_dict(legacy).text == nemotron_h_omni.ModelArgs.from_dict(config).text
    assert omni_media_tokens(legacy).token_id == config["image_token_id"]
    assert omni_media_tokens(legacy).expand(37, 53) == omni_media_tokens(config).expand(37, 53)
    assert omni_cache_layers(legacy) == omni_cache_layers(config["text_config"])
