"""Gemma 4 with its vision tower against transformers (Gemma4ForConditionalGeneration, float32 on CPU) on a tiny
checkpoint transformers writes (plugd.testing.gemma4_vision_checkpoints): the image processor and the number of soft
tokens the daemon expands each image to, for images of several sizes and aspect ratios; the tower's features; logits
of a prompt holding two images of different sizes, with images bidirectional on sliding layers and causal, in one
forward and in chunks over caches; a quantized checkpoint's tower left dense; a checkpoint without its tower run
text only. Needs torch (transformers comes with it) and skips without it."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from PIL import Image

from plugd.image_processor import directory_config
from plugd.nn.linear import QuantizedLinear, TowerLinear
from plugd.runner.errors import CheckpointError
from plugd.runner.loading import load_model
from plugd.runner.quantize import quantize_checkpoint
from plugd.testing.vision import embedded_apart_and_together, relative_error, stripped_copy, varied_images
from plugd.tokenizer import Tokenizer
from plugd_gemma import gemma4, plugd_architectures
from plugd_gemma.config import gemma4_media_tokens

pytest.importorskip("torch")
from plugd.testing.gemma4_vision_checkpoints import SOFT_TOKENS, VISION, write_gemma4_vision  # noqa: E402

TOLERANCE = 1e-4  # relative_error


IMAGES = varied_images()


@pytest.fixture(scope="module", params=["bidirectional", "causal"])
def checkpoint(request, tmp_path_factory) -> Path:
    return write_gemma4_vision(tmp_path_factory.mktemp("gemma4-vision"), seed=2,
                               bidirectional=request.param == "bidirectional")


@pytest.fixture(scope="module")
def models(checkpoint):
    import torch
    from transformers import Gemma4ForConditionalGeneration

    reference = Gemma4ForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32).eval()
    return load_model(checkpoint, gemma4), reference


def media_tokens(checkpoint: Path):
    return gemma4_media_tokens(json.loads((checkpoint / "config.json").read_text()))


def processed(images: list[Image.Image]) -> dict[str, np.ndarray]:
    """transformers' image processor (the PIL one), set up as the checkpoint's processor_config.json says."""
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    processor = Gemma4ImageProcessorPil(patch_size=VISION["patch_size"], max_soft_tokens=SOFT_TOKENS,
                                        pooling_kernel_size=VISION["pooling_kernel_size"])
    return processor(images=images, return_tensors="np")


@pytest.mark.parametrize("kind", sorted(IMAGES))
def test_preprocess_and_soft_token_count_match_transformers(models, checkpoint, kind):
    ours, _ = models
    expected = processed([IMAGES[kind]])
    patches = np.array(ours.preprocess(IMAGES[kind]))
    rows, columns, size = patches.shape
    assert np.abs(patches.reshape(rows * columns, size) - expected["pixel_values"][0, : rows * columns]).max() <= 1e-6
    grid = np.stack(np.meshgrid(np.arange(columns), np.arange(rows)), axis=-1).reshape(-1, 2)
    assert (expected["image_position_ids"][0, : rows * columns] == grid).all()
    assert (expected["image_position_ids"][0, rows * columns :] == -1).all()
    soft_tokens = expected["num_soft_tokens_per_image"][0]
    assert rows * columns == soft_tokens * VISION["pooling_kernel_size"] ** 2
    expansion = media_tokens(checkpoint).expand(*IMAGES[kind].size)
    assert expansion == "<|image>" + "<|image|>" * soft_tokens + "<image|>"


def test_the_checkpoints_own_soft_token_budget_is_followed(checkpoint, tmp_path):
    """A processor_config.json whose image processor allows 140 soft tokens (config.json still says 70): the
    expansion and the runner's patches follow the processor's."""
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    custom = stripped_copy(checkpoint, tmp_path / "budget", lambda name: True)
    shipped = json.loads((custom / "processor_config.json").read_text())
    shipped["image_processor"]["max_soft_tokens"] = 140
    (custom / "processor_config.json").write_text(json.dumps(shipped))
    media, model = gemma4_media_tokens(directory_config(custom)), load_model(custom, gemma4)
    reference = Gemma4ImageProcessorPil(patch_size=VISION["patch_size"], max_soft_tokens=140,
                                        pooling_kernel_size=VISION["pooling_kernel_size"])
    for image in IMAGES.values():
        soft_tokens = int(reference(images=[image], return_tensors="np")["num_soft_tokens_per_image"][0])
        rows, columns, _ = model.preprocess(image).shape
        assert rows * columns == soft_tokens * VISION["pooling_kernel_size"] ** 2
        assert media.expand(*image.size) == "<|image>" + "<|image|>" * soft_tokens + "<image|>"


def reference_features(reference, images: list[Image.Image]) -> list[np.ndarray]:
    import torch

    inputs = processed(images)
    with torch.no_grad():
        features = reference.model.get_image_features(torch.tensor(inputs["pixel_values"]),
                                                      torch.tensor(inputs["image_position_ids"]), return_dict=True)
    return [item.numpy() for item in features.pooler_output]


@pytest.mark.parametrize("kind", sorted(IMAGES))
def test_features_match_transformers(models, kind):
    ours, reference = models
    features = np.array(ours.embed_media(ours.preprocess(IMAGES[kind])[None]))[0]
    [expected] = reference_features(reference, [IMAGES[kind]])
    assert features.shape == expected.shape
    assert relative_error(features, expected) <= TOLERANCE


TWO_IMAGES = ("png", "jpeg")


def prompt_ids(checkpoint: Path) -> list[int]:
    """A Gemma 4 turn holding two images of different sizes, their placeholders expanded as the daemon does."""
    media = media_tokens(checkpoint)
    first, second = (media.expand(*IMAGES[kind].size) for kind in TWO_IMAGES)
    text = f"<bos><|turn>user\nCompare {first} with {second} please.<turn|>\n<|turn>model\n"
    return Tokenizer.from_dir(checkpoint).encode(text)


def image_starts(ids: list[int], token_id: int) -> list[int]:
    return [i for i, token in enumerate(ids) if token == token_id and ids[i - 1] != token_id]


def reference_logits(reference, ids: list[int], spans: bool = True) -> np.ndarray:
    """transformers' logits; with `spans` it is told where the images lie (mm_token_type_ids), which makes them
    bidirectional where the config asks for it."""
    import torch

    inputs = processed([IMAGES[kind] for kind in TWO_IMAGES])
    tokens = torch.tensor([ids])
    extra = {"mm_token_type_ids": (tokens == reference.config.image_token_id).long()} if spans else {}
    with torch.no_grad():
        out = reference(input_ids=tokens, pixel_values=torch.tensor(inputs["pixel_values"]),
                        image_position_ids=torch.tensor(inputs["image_position_ids"]), **extra)
    return out.logits[0].numpy()


@pytest.fixture(scope="module")
def prompt(models, checkpoint):
    """The two-image prompt, our media spans for it, and transformers' logits."""
    ours, reference = models
    ids = prompt_ids(checkpoint)
    embedded = [ours.embed_media(ours.preprocess(IMAGES[kind])[None])[0] for kind in TWO_IMAGES]
    media = list(zip(image_starts(ids, media_tokens(checkpoint).token_id), embedded, strict=True))
    return ids, media, reference_logits(reference, ids)


def test_logits_with_two_images_match_transformers_at_every_position(models, checkpoint, prompt):
    ours, reference = models
    ids, media, expected = prompt
    assert relative_error(np.array(ours(mx.array([ids], mx.int32), media=media))[0], expected) <= TOLERANCE
    cached = np.array(ours(mx.array([ids], mx.int32), ours.make_cache(), media=media))[0]
    assert relative_error(cached, expected) <= TOLERANCE
    bidirectional = json.loads((checkpoint / "config.json").read_text())["text_config"]["use_bidirectional_attention"]
    if bidirectional:  # the comparison can tell: causal images give other logits
        assert relative_error(expected, reference_logits(reference, ids, spans=False)) > 100 * TOLERANCE


def test_prefill_in_chunks_then_decode_matches_transformers(models, prompt):
    """Chunk boundaries at a span's start, right after it, and between the images; then one decoded token."""
    ours, reference = models
    ids, media, expected = prompt
    (first, rows), (second, _) = media
    for split in (first, first + rows.shape[0], (first + rows.shape[0] + second) // 2, second):
        cache = ours.make_cache()
        ours(mx.array([ids[:split]], mx.int32), cache, media=[(s, r) for s, r in media if s < split])
        logits = ours(mx.array([ids[split:]], mx.int32), cache, media=[(s - split, r) for s, r in media if s >= split])
        assert relative_error(np.array(logits)[0, -1], expected[-1]) <= TOLERANCE, f"split at {split}"
    following = 7
    decoded = np.array(ours(mx.array([[following]], mx.int32), cache))[0, -1]
    assert relative_error(decoded, reference_logits(reference, [*ids, following])[-1]) <= TOLERANCE


def test_quantized_checkpoint_keeps_the_tower_dense(checkpoint, models, tmp_path):
    ours, _ = models
    quantize_checkpoint(checkpoint, tmp_path / "q4", gemma4, bits=4, group_size=32)
    quantized = load_model(tmp_path / "q4", gemma4)
    assert isinstance(quantized.language_model.model.layers[0].self_attn.q_proj, QuantizedLinear)
    assert isinstance(quantized.vision_tower.encoder.layers[0].self_attn.q_proj.linear, TowerLinear)
    assert isinstance(quantized.embed_vision.embedding_projection, TowerLinear)
    patches = ours.preprocess(IMAGES["png"])[None]
    assert mx.array_equal(quantized.embed_media(patches), ours.embed_media(patches))


def test_a_checkpoint_without_its_tower_runs_text_only(checkpoint, models, tmp_path):
    ours, _ = models
    text_only = stripped_copy(checkpoint, tmp_path / "text", lambda name: not name.startswith("model.vision_tower."))
    text_only = stripped_copy(text_only, tmp_path / "text-only", lambda name: not name.startswith("model.embed_vision."))
    model = load_model(text_only, gemma4)
    ids = mx.array([prompt_ids(checkpoint)[:12]], mx.int32)
    assert mx.array_equal(model(ids), ours(ids))
    with pytest.raises(ValueError, match="no vision tower"):
        model.embed_media(ours.preprocess(IMAGES["png"])[None])
    [architecture] = [a for a in plugd_architectures() if a.model_type == "gemma4"]
    names = mx.load(str(text_only / "model.safetensors")).keys()
    assert not architecture.takes_images(names)
    assert architecture.takes_images(mx.load(str(checkpoint / "model.safetensors")).keys())


def test_a_tower_missing_some_tensors_is_refused(checkpoint, tmp_path):
    broken = stripped_copy(checkpoint, tmp_path / "broken", lambda name: "encoder.layers.1." not in name)
    with pytest.raises(CheckpointError, match="missing tensor vision_tower.encoder.layers.1"):
        load_model(broken, gemma4)


def test_images_of_one_size_embed_in_one_batch_as_each_alone(models):
    """The runner stacks images whose preprocessed shapes agree."""
    apart, together = embedded_apart_and_together(models[0], IMAGES["png"])
    assert all(np.abs(together[i] - alone).max() <= 1e-5 for i, alone in enumerate(apart))
