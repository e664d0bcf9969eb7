"""Qwen3.5 with its vision tower against transformers (Qwen3_5ForConditionalGeneration, float32 on CPU) on a tiny
checkpoint transformers writes (plugd.testing.qwen3_5_vision_checkpoints): the image processor and the number of
image tokens the daemon expands each image to, for images of several sizes and aspect ratios; the tower's features;
logits of a prompt holding two images of different sizes, with their multimodal rotary positions, in one forward
and in chunks over caches, then decoding alone and in a batch beside a text-only row; a quantized checkpoint's
tower left dense; a checkpoint without its tower run text only; the MoE twin's logits too. Needs torch
(transformers comes with it) and skips without it."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from PIL import Image

from plugd import plugins
from plugd.chat.models import resolve
from plugd.chat.request import InvalidRequest
from plugd.chat.tokens import encode_prompt, media_tokens_of
from plugd.nn.linear import QuantizedLinear, TowerLinear
from plugd.runner.errors import CheckpointError
from plugd.runner.loading import load_model
from plugd.runner.quantize import quantize_checkpoint
from plugd.store.create import CreateRequest, create_model
from plugd.store.names import ModelName
from plugd.store.store import Store
from plugd.testing.vision import embedded_apart_and_together, relative_error, stripped_copy, varied_images
from plugd.tokenizer import Tokenizer
from plugd.types import Media, Prompt
from plugd_qwen import plugd_architectures, qwen3_5, qwen3_5_moe
from plugd_qwen.config import qwen3_5_media_tokens
from plugd_qwen.positions import PositionCache

pytest.importorskip("torch")
from plugd.testing.qwen3_5_vision_checkpoints import VISION, processed, write_qwen3_5_vision  # noqa: E402

TOLERANCE = 1e-4  # relative_error
IMAGES = varied_images()
MERGE = VISION["spatial_merge_size"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_qwen3_5_vision(tmp_path_factory.mktemp("qwen3_5-vision"), seed=0)


@pytest.fixture(scope="module")
def models(checkpoint):
    import torch
    from transformers import Qwen3_5ForConditionalGeneration

    reference = Qwen3_5ForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32).eval()
    return load_model(checkpoint, qwen3_5), reference


def media_tokens(checkpoint: Path):
    return qwen3_5_media_tokens(json.loads((checkpoint / "config.json").read_text()))


def block_order(patches: np.ndarray) -> np.ndarray:
    """(rows, columns, dims) patches in transformers' order: merge block by merge block, each row by row."""
    rows, columns, dims = patches.shape
    return patches.reshape(rows // MERGE, MERGE, columns // MERGE, MERGE, dims).transpose(0, 2, 1, 3, 4).reshape(
        rows * columns, dims)


@pytest.mark.parametrize("kind", sorted(IMAGES))
def test_preprocess_and_image_token_count_match_transformers(models, checkpoint, kind):
    ours, _ = models
    expected = processed([IMAGES[kind]], "np")
    patches = np.array(ours.preprocess(IMAGES[kind]))
    assert [1, *patches.shape[:2]] == expected["image_grid_thw"][0].tolist()
    assert np.abs(block_order(patches) - expected["pixel_values"]).max() <= 1e-6
    tokens = patches.shape[0] * patches.shape[1] // MERGE**2
    assert media_tokens(checkpoint).expand(*IMAGES[kind].size) == "<|image_pad|>" * tokens


def test_the_checkpoints_own_processor_settings_are_followed_by_daemon_and_runner(models, checkpoint, tmp_path):
    """A preprocessor_config.json with a smaller pixel budget and CLIP's normalization: the daemon's expansion (read
    from the stored model, as a request resolves it) and the runner's pixels (loaded from the model directory)
    follow it as transformers' processor does."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    settings = {"size": {"shortest_edge": 16_384, "longest_edge": 40_000},
                "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}
    custom = stripped_copy(checkpoint, tmp_path / "custom", lambda name: True)
    shipped = json.loads((custom / "preprocessor_config.json").read_text())
    (custom / "preprocessor_config.json").write_text(json.dumps(shipped | settings))
    store, registry = Store(tmp_path / "models"), plugins.load()
    files = {f.name: upload(store, f.read_bytes()) for f in sorted(custom.iterdir())}
    create_model(store, registry, CreateRequest(model="custom", files=files), lambda status: None)
    daemon = media_tokens_of(resolve(store, registry, ModelName.parse("custom")))
    runner = load_model(custom, qwen3_5)
    reference = Qwen2VLImageProcessorPil(patch_size=VISION["patch_size"], merge_size=MERGE,
                                         temporal_patch_size=VISION["temporal_patch_size"], **settings)
    for image in IMAGES.values():
        expected = reference(images=[image], return_tensors="np")
        patches = np.array(runner.preprocess(image))
        assert [1, *patches.shape[:2]] == expected["image_grid_thw"][0].tolist()
        assert np.abs(block_order(patches) - expected["pixel_values"]).max() <= 1e-5
        assert daemon.expand(*image.size) == "<|image_pad|>" * (patches.shape[0] * patches.shape[1] // MERGE**2)
    default, _ = models  # the shipped settings enlarge a small image to 65,536 pixels at least
    assert runner.preprocess(IMAGES["small"]).shape[:2] < default.preprocess(IMAGES["small"]).shape[:2]


def upload(store: Store, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with store.blobs.writer(digest) as writer:
        writer.write(data)
        writer.commit()
    return digest


def test_an_image_the_processor_refuses_gets_a_clear_error(checkpoint):
    with pytest.raises(ValueError, match="aspect ratio must be smaller than 200"):  # transformers refuses it too
        processed([Image.new("RGB", (1000, 4))])
    picture = io.BytesIO()
    Image.new("RGB", (1000, 4)).save(picture, "PNG")
    prompt = Prompt("<|vision_start|><|image_pad|><|vision_end|>", [Media(picture.getvalue(), "image/png")])
    with pytest.raises(InvalidRequest, match="more than 200 times wider"):
        encode_prompt(Tokenizer.from_dir(checkpoint), media_tokens(checkpoint), prompt)


@pytest.mark.parametrize("kind", sorted(IMAGES))
def test_features_match_transformers(models, kind):
    import torch

    ours, reference = models
    features = np.array(ours.embed_media(ours.preprocess(IMAGES[kind])[None]))[0]
    inputs = processed([IMAGES[kind]])
    with torch.no_grad():
        expected = reference.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"],
                                                      return_dict=True).pooler_output[0].numpy()
    assert features.shape[:2] == tuple(n // MERGE for n in ours.preprocess(IMAGES[kind]).shape[:2])
    assert relative_error(features.reshape(-1, features.shape[-1]), expected) <= TOLERANCE


TWO_IMAGES = ("png", "jpeg")


def prompt_ids(checkpoint: Path) -> list[int]:
    """A Qwen3.5 turn holding two images of different sizes, their placeholders expanded as the daemon does."""
    first, second = (media_tokens(checkpoint).expand(*IMAGES[kind].size) for kind in TWO_IMAGES)
    text = (f"<|im_start|>user\nCompare <|vision_start|>{first}<|vision_end|> with <|vision_start|>{second}"
            "<|vision_end|> please.<|im_end|>\n<|im_start|>assistant\n")
    return Tokenizer.from_dir(checkpoint).encode(text)


def reference_logits(reference, ids: list[int], multimodal: bool = True) -> np.ndarray:
    """transformers' logits; without `multimodal` every token takes its index as its position on all axes."""
    import torch

    inputs, tokens = processed([IMAGES[kind] for kind in TWO_IMAGES]), torch.tensor([ids])
    flat = {} if multimodal else {"position_ids": torch.arange(len(ids))[None]}
    with torch.no_grad():
        out = reference(input_ids=tokens, pixel_values=inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"],
                        mm_token_type_ids=(tokens == reference.config.image_token_id).long(), **flat)
    return out.logits[0].numpy()


@pytest.fixture(scope="module")
def prompt(models, checkpoint):
    """The two-image prompt, our media spans for it, and transformers' logits."""
    ours, reference = models
    ids = prompt_ids(checkpoint)
    token = media_tokens(checkpoint).token_id
    starts = [i for i, t in enumerate(ids) if t == token and ids[i - 1] != token]
    embedded = [ours.embed_media(ours.preprocess(IMAGES[kind])[None])[0] for kind in TWO_IMAGES]
    return ids, list(zip(starts, embedded, strict=True)), reference_logits(reference, ids)


def test_logits_with_two_images_match_transformers_at_every_position(models, prompt):
    ours, reference = models
    ids, media, expected = prompt
    assert relative_error(np.array(ours(mx.array([ids], mx.int32), media=media))[0], expected) <= TOLERANCE
    cached = np.array(ours(mx.array([ids], mx.int32), ours.make_cache(), media=media))[0]
    assert relative_error(cached, expected) <= TOLERANCE
    # The comparison can tell: positions that ignore the images' rows and columns give other logits.
    assert relative_error(expected, reference_logits(reference, ids, multimodal=False)) > 100 * TOLERANCE


def test_the_moe_twin_with_two_images_matches_transformers(tmp_path):
    import torch
    from transformers import Qwen3_5MoeForConditionalGeneration

    checkpoint = write_qwen3_5_vision(tmp_path / "moe", seed=1, moe=True)
    ours = load_model(checkpoint, qwen3_5_moe)
    reference = Qwen3_5MoeForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32).eval()
    ids = prompt_ids(checkpoint)
    token = media_tokens(checkpoint).token_id
    starts = [i for i, t in enumerate(ids) if t == token and ids[i - 1] != token]
    media = [(start, ours.embed_media(ours.preprocess(IMAGES[kind])[None])[0]) for start, kind in zip(starts, TWO_IMAGES)]
    logits = np.array(ours(mx.array([ids], mx.int32), ours.make_cache(), media=media))[0]
    assert relative_error(logits, reference_logits(reference, ids)) <= TOLERANCE


def prefilled(ours, ids: list[int], media, split: int) -> list:
    cache = ours.make_cache()
    ours(mx.array([ids[:split]], mx.int32), cache, media=[(s, r) for s, r in media if s < split])
    ours(mx.array([ids[split:]], mx.int32), cache, media=[(s - split, r) for s, r in media if s >= split])
    return cache


def test_prefill_in_chunks_then_decode_matches_transformers(models, prompt):
    """Chunk boundaries at an image's start, right after it, between the images and at the second's start."""
    ours, reference = models
    ids, media, expected = prompt
    (first, grid), (second, _) = media
    after_first = first + grid.shape[0] * grid.shape[1]
    for split in (first, after_first, (after_first + second) // 2, second):
        cache = prefilled(ours, ids[:-1], media, split)
        logits = ours(mx.array([ids[-1:]], mx.int32), cache)
        assert relative_error(np.array(logits)[0, -1], expected[-1]) <= TOLERANCE, f"split at {split}"
    following = 7
    decoded = np.array(ours(mx.array([[following]], mx.int32), cache))[0, -1]
    assert relative_error(decoded, reference_logits(reference, [*ids, following])[-1]) <= TOLERANCE


def test_a_row_with_images_decodes_in_a_batch_as_alone(models, prompt):
    """Beside a text-only row, whose positions do not lag its offset, each row keeps its own positions."""
    ours, _ = models
    ids, media, _ = prompt
    rows = [prefilled(ours, ids, media, media[1][0]), prefilled(ours, ids[:9], [], 4)]
    following = mx.array([[7], [11]], mx.int32)
    alone = [np.array(ours(following[r : r + 1], cache))[0, -1] for r, cache in enumerate(rows)]
    rows = [prefilled(ours, ids, media, media[1][0]), prefilled(ours, ids[:9], [], 4)]
    batch = [layer.batch() for layer in rows[0]]
    for layer, *caches in zip(batch, *rows, strict=True):
        layer.extend(caches, [len(ids) + 8] * len(caches))
    together = np.array(ours(following, batch))[:, -1]
    assert all(relative_error(together[r], alone[r]) <= 1e-5 for r in range(2))
    assert batch[-1].row(0).state == (len(ids) + 1, rows[0][-1].lags)


def test_positions_trim_back_past_an_image_and_snapshot_whole():
    positions = PositionCache()
    positions.advance(10, [(6, 2)])  # an image of 2 x 2 merged patches at 2..6: the text after it lags by 2
    positions.advance(5)
    assert (positions.offset, positions.position) == (15, 13)
    saved = positions.snapshot()
    assert positions.trim(10) == 10 and (positions.offset, positions.position) == (5, 5)
    positions.restore(saved)
    assert (positions.offset, positions.position) == (15, 13)


def test_quantized_checkpoint_keeps_the_tower_dense(checkpoint, models, tmp_path):
    ours, _ = models
    quantize_checkpoint(checkpoint, tmp_path / "q4", qwen3_5, bits=4, group_size=32)
    quantized = load_model(tmp_path / "q4", qwen3_5)
    assert isinstance(quantized.language_model.model.layers[0].mlp.gate_proj, QuantizedLinear)
    assert isinstance(quantized.vision_tower.blocks[0].attn.qkv, TowerLinear)
    assert isinstance(quantized.vision_tower.merger.linear_fc2, TowerLinear)
    patches = ours.preprocess(IMAGES["png"])[None]
    assert mx.array_equal(quantized.embed_media(patches), ours.embed_media(patches))


def test_a_checkpoint_without_its_tower_runs_text_only(checkpoint, models, tmp_path):
    ours, _ = models
    text_only = stripped_copy(checkpoint, tmp_path / "text", lambda name: not name.startswith("model.visual."))
    model = load_model(text_only, qwen3_5)
    ids = mx.array([prompt_ids(checkpoint)[:12]], mx.int32)
    assert mx.array_equal(model(ids), ours(ids))
    with pytest.raises(ValueError, match="no vision tower"):
        model.embed_media(ours.preprocess(IMAGES["png"])[None])
    [architecture] = [a for a in plugd_architectures() if a.model_type == "qwen3_5"]
    assert not architecture.takes_images(mx.load(str(text_only / "model.safetensors")).keys())
    assert architecture.takes_images(mx.load(str(checkpoint / "model.safetensors")).keys())


def test_a_patch_embedding_in_mlx_conv3d_layout_loads_the_same(checkpoint, models, tmp_path):
    """mlx-vlm's conversions hold the Conv3d kernel channels last, (out, frames, patch, patch, channels)."""
    ours, _ = models
    converted = stripped_copy(checkpoint, tmp_path / "mlx-layout", lambda name: True)
    weights = mx.load(str(converted / "model.safetensors"))
    name = "model.visual.patch_embed.proj.weight"
    weights[name] = weights[name].transpose(0, 2, 3, 4, 1)
    mx.save_safetensors(str(converted / "model.safetensors"), weights, metadata={"format": "pt"})
    patches = ours.preprocess(IMAGES["jpeg"])[None]
    assert mx.array_equal(load_model(converted, qwen3_5).embed_media(patches), ours.embed_media(patches))


def test_a_tower_missing_some_tensors_is_refused(checkpoint, tmp_path):
    broken = stripped_copy(checkpoint, tmp_path / "broken", lambda name: "blocks.1." not in name)
    with pytest.raises(CheckpointError, match="missing tensor vision_tower.blocks.1"):
        load_model(broken, qwen3_5)


def test_images_of_one_size_embed_in_one_batch_as_each_alone(models):
    """The runner stacks images whose preprocessed shapes agree."""
    apart, together = embedded_apart_and_together(models[0], IMAGES["png"])
    assert all(np.abs(together[i] - alone).max() <= 1e-5 for i, alone in enumerate(apart))
