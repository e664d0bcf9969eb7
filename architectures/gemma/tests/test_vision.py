"""Gemma 3 with its vision tower against transformers (Gemma3ForConditionalGeneration, float32 on CPU) on tiny
checkpoints: the image processor, the image embeddings (SigLIP tower + projector), and logits of prompts holding two
images, whose soft tokens attend to each other in both directions, in one forward and in chunks over caches; the
checkpoint layouts transformers writes; and the media contract the runner relies on. The comparisons need torch
(transformers comes with mlx-lm) and skip without it."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from PIL import Image

from plugd.nn.linear import QuantizedLinear, TowerLinear
from plugd.nn.rotating import RotatingKVCache
from plugd.runner.loading import load_model
from plugd.runner.quantize import quantize_checkpoint
from plugd.testing.checkpoints import BASE_CONFIGS, write_checkpoint
from plugd.tokenizer import Tokenizer
from plugd_gemma import gemma3
from plugd_gemma.config import gemma3_media_tokens

TOLERANCE = 1e-4
# The tiny text model slides over 32 positions; "narrow window" makes it 8, shorter than an image's 16 positions.
VARIANTS = {
    "tiny": {},
    "narrow window": {"text_config": {**BASE_CONFIGS["gemma3"]["text_config"], "sliding_window": 8}},
}


def encoded(image: Image.Image, kind: str) -> Image.Image:
    """`image` after a round trip through PNG or JPEG bytes, as a request brings it."""
    buffer = io.BytesIO()
    image.save(buffer, format=kind)
    return Image.open(io.BytesIO(buffer.getvalue()))


def noise(width: int, height: int, mode: str, seed: int) -> Image.Image:
    channels = len(mode)
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, channels), dtype=np.uint8)
    return Image.fromarray(pixels, mode)


# Odd sizes, so the resize interpolates in both directions; the PNG has transparency to composite onto white.
IMAGES = {"png": encoded(noise(37, 53, "RGBA", 1), "PNG"), "jpeg": encoded(noise(61, 29, "RGB", 2), "JPEG")}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def checkpoint(request, tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("gemma3"), "gemma3", seed=3, overrides=VARIANTS[request.param])


@pytest.fixture(scope="module")
def ours(checkpoint) -> gemma3.Model:
    return load_model(checkpoint, gemma3)


@pytest.fixture(scope="module")
def models(ours, checkpoint):
    """Ours and transformers' reading of the same checkpoint (the hub's weight layout)."""
    torch = pytest.importorskip("torch")
    from transformers import Gemma3ForConditionalGeneration

    return ours, Gemma3ForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32).eval()


def reference_pixels(model: gemma3.Model, image: Image.Image) -> np.ndarray:
    """transformers' image processor (the PIL one), set up as the checkpoint's preprocessor_config.json says."""
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    size = model.args.vision.image_size
    processor = Gemma3ImageProcessorPil(
        size={"height": size, "width": size}, resample=2, rescale_factor=1 / 255, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    return processor(images=[image], return_tensors="np")["pixel_values"][0].transpose(1, 2, 0)


@pytest.mark.parametrize("kind", sorted(IMAGES))
def test_preprocess_matches_transformers(ours, kind):
    pixels = ours.preprocess(IMAGES[kind])
    assert pixels.shape == (56, 56, 3) and pixels.dtype == mx.float32
    assert np.abs(np.array(pixels) - reference_pixels(ours, IMAGES[kind])).max() <= 1e-6


def pixel_batch(model: gemma3.Model) -> np.ndarray:
    """Both test images, preprocessed by transformers: (2, H, W, C)."""
    return np.stack([reference_pixels(model, IMAGES[kind]) for kind in sorted(IMAGES)])


def reference_image_features(reference, pixels: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        features = reference.model.get_image_features(pixel_values=torch.tensor(pixels.transpose(0, 3, 1, 2)))
    return features.pooler_output.numpy()


def test_image_embeddings_match_transformers(models):
    ours, reference = models
    pixels = pixel_batch(ours)
    embeddings = ours.embed_media(mx.array(pixels))
    assert embeddings.shape == (2, 16, 64)
    assert np.abs(np.array(embeddings) - reference_image_features(reference, pixels)).max() <= TOLERANCE


def media_tokens(checkpoint: Path):
    return gemma3_media_tokens(json.loads((checkpoint / "config.json").read_text()))


def prompt_ids(checkpoint: Path) -> list[int]:
    """A Gemma 3 turn holding two images, their placeholders expanded as the daemon does; 74 positions, well past
    the sliding window."""
    text = "<start_of_turn>user\nCompare <start_of_image> with <start_of_image> please.<end_of_turn>\n<start_of_turn>model\n"
    media = media_tokens(checkpoint)
    return Tokenizer.from_dir(checkpoint).encode(text.replace(media.placeholder, media.expansion))


def image_starts(ids: list[int], token_id: int) -> list[int]:
    return [i for i, token in enumerate(ids) if token == token_id and (i == 0 or ids[i - 1] != token_id)]


def test_the_expansion_puts_one_run_of_image_tokens_per_placeholder(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    media = media_tokens(checkpoint)
    ids = prompt_ids(checkpoint)
    starts = image_starts(ids, media.token_id)
    assert media.token_id == config["image_token_index"] and len(starts) == 2
    for start in starts:
        assert ids[start - 1] == config["boi_token_index"]
        assert ids[start : start + 16] == [media.token_id] * 16
        assert ids[start + 16] == config["eoi_token_index"]
    assert ids[0] == Tokenizer.from_dir(checkpoint).bos_id
    assert not media.expansion.endswith(("<image_soft_token>", "<start_of_image>"))


def reference_logits(reference, ids: list[int], pixels: np.ndarray, token_type_ids: bool = True) -> np.ndarray:
    """transformers' logits; with token_type_ids its masks make each image bidirectional, without they are causal."""
    import torch

    inputs = torch.tensor([ids])
    extra = {"token_type_ids": (inputs == reference.config.image_token_id).long()} if token_type_ids else {}
    with torch.no_grad():
        out = reference(input_ids=inputs, pixel_values=torch.tensor(pixels.transpose(0, 3, 1, 2)), **extra)
    return out.logits[0].numpy()


@pytest.fixture(scope="module")
def prompt(models, checkpoint):
    """The two-image prompt, our media spans for it, and transformers' logits."""
    ours, reference = models
    ids = prompt_ids(checkpoint)
    pixels = pixel_batch(ours)
    embeddings = ours.embed_media(mx.array(pixels))
    media = [(start, embeddings[i]) for i, start in enumerate(image_starts(ids, media_tokens(checkpoint).token_id))]
    return ids, media, pixels, reference_logits(reference, ids, pixels)


def test_logits_with_images_match_transformers_at_every_position(models, prompt):
    ours, reference = models
    ids, media, pixels, expected = prompt
    logits = np.array(ours(mx.array([ids], mx.int32), media=media))[0]
    assert np.abs(logits - expected).max() <= TOLERANCE
    cached = np.array(ours(mx.array([ids], mx.int32), ours.make_cache(), media=media))[0]
    assert np.abs(cached - expected).max() <= TOLERANCE
    # The comparison can tell: a causal mask over the images gives other logits.
    assert np.abs(logits - reference_logits(reference, ids, pixels, token_type_ids=False)).max() > 100 * TOLERANCE


def chunk_media(media, begin: int, end: int):
    """The spans that lie in [begin, end), with starts relative to `begin`."""
    return [(start - begin, rows) for start, rows in media if begin <= start < end]


def tight_caches(model: gemma3.Model) -> list:
    """Sliding caches that keep nothing beyond the window and grow one position at a time."""
    return [RotatingKVCache(layer.window, slack=0, step=1) if isinstance(layer, RotatingKVCache) else layer
            for layer in model.make_cache()]


@pytest.mark.parametrize("make_cache", [gemma3.Model.make_cache, tight_caches], ids=["default caches", "tight caches"])
def test_prefill_in_chunks_then_decode_matches_transformers(models, prompt, make_cache):
    """Chunk boundaries at a span's start, right after it, and between the images; then one decoded token."""
    ours, reference = models
    ids, media, pixels, expected = prompt
    (first, _), (second, _) = media
    for split in (first, first + 16, (first + 16 + second) // 2, second):
        cache = make_cache(ours)
        ours(mx.array([ids[:split]], mx.int32), cache, media=chunk_media(media, 0, split))
        logits = ours(mx.array([ids[split:]], mx.int32), cache, media=chunk_media(media, split, len(ids)))
        assert np.abs(np.array(logits)[0, -1] - expected[-1]).max() <= TOLERANCE, f"split at {split}"
    following = 7
    decoded = np.array(ours(mx.array([[following]], mx.int32), cache))[0, -1]
    assert np.abs(decoded - reference_logits(reference, [*ids, following], pixels)[-1]).max() <= TOLERANCE


def randomized_transformers_model(config_path: Path, seed: int):
    """A Gemma3ForConditionalGeneration of the tiny config with every parameter drawn at random (its own init leaves
    norms and the projector at zero, which would hide mistakes)."""
    torch = pytest.importorskip("torch")
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    config = Gemma3Config.from_pretrained(config_path)
    model = Gemma3ForConditionalGeneration(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(0.05 * torch.randn(parameter.shape, generator=generator) + (parameter.dim() == 1))
    return model


def save_in_memory_layout(model, directory: Path) -> None:
    """The model's own parameter names (model.language_model., model.vision_tower., lm_head.), as a training
    script's safetensors.torch.save_file would write them."""
    from safetensors.torch import save_file

    directory.mkdir()
    model.config.to_json_file(str(directory / "config.json"))
    save_file({name: tensor.clone().contiguous() for name, tensor in model.state_dict().items()},
              str(directory / "model.safetensors"))


@pytest.mark.parametrize("layout", ["save_pretrained", "in-memory names"])
def test_transformers_layouts_load(checkpoint, tmp_path, layout):
    reference = randomized_transformers_model(checkpoint, seed=11)
    if layout == "save_pretrained":
        reference.save_pretrained(tmp_path / "saved")
    else:
        save_in_memory_layout(reference, tmp_path / "saved")
    ours = load_model(tmp_path / "saved", gemma3)
    pixels = pixel_batch(ours)
    embeddings = ours.embed_media(mx.array(pixels))
    assert np.abs(np.array(embeddings) - reference_image_features(reference, pixels)).max() <= TOLERANCE
    ids = prompt_ids(checkpoint)
    media = [(start, embeddings[i]) for i, start in enumerate(image_starts(ids, media_tokens(checkpoint).token_id))]
    logits = np.array(ours(mx.array([ids], mx.int32), media=media))[0, -1]
    assert np.abs(logits - reference_logits(reference, ids, pixels)[-1]).max() <= TOLERANCE


def test_quantized_checkpoint_keeps_the_vision_tower_dense(checkpoint, ours, tmp_path):
    quantize_checkpoint(checkpoint, tmp_path / "q4", gemma3, bits=4, group_size=32)
    quantized = load_model(tmp_path / "q4", gemma3)
    assert isinstance(quantized.language_model.model.layers[0].self_attn.q_proj, QuantizedLinear)
    assert isinstance(quantized.vision_tower.vision_model.encoder.layers[0].self_attn.q_proj, TowerLinear)
    pixels = mx.stack([ours.preprocess(image) for image in IMAGES.values()])
    assert mx.array_equal(quantized.embed_media(pixels), ours.embed_media(pixels))


def test_tiny_checkpoint_files(checkpoint):
    processor = json.loads((checkpoint / "preprocessor_config.json").read_text())
    assert processor["size"] == {"height": 56, "width": 56} and processor["resample"] == 2
    assert processor["image_mean"] == processor["image_std"] == [0.5] * 3
    reference_template = Path(__file__).resolve().parents[3] / "tests/reference/chat_templates/gemma3.jinja"
    assert json.loads((checkpoint / "tokenizer_config.json").read_text())["chat_template"] == reference_template.read_text()


def test_refuses_what_it_does_not_implement():
    config = {**BASE_CONFIGS["gemma3"], "vocab_size": 512}
    with pytest.raises(ValueError, match="mm_tokens_per_image"):
        gemma3.ModelArgs.from_dict({**config, "mm_tokens_per_image": 9})
    with pytest.raises(ValueError, match="vision_use_head"):
        gemma3.ModelArgs.from_dict({**config, "vision_config": {**config["vision_config"], "vision_use_head": True}})


def test_a_checkpoint_without_its_vision_tower_is_refused(checkpoint, tmp_path):
    """A checkpoint stripped of its tower, as mlx-lm's text-only conversion writes it, is refused with the reason."""
    stripped = Path(shutil.copytree(checkpoint, tmp_path / "stripped"))
    weights = {name: tensor for name, tensor in mx.load(str(stripped / "model.safetensors")).items()
               if not name.startswith("vision_tower.")}
    mx.save_safetensors(str(stripped / "model.safetensors"), weights)
    with pytest.raises(ValueError, match="no vision tower"):
        load_model(stripped, gemma3)
