"""What the vision tests of every family share: images of varied sizes and formats, the relative error they are
judged by, the tiny tokenizer with a family's special tokens, and transformers models with every parameter drawn
at random (their own initialisation leaves norms at one and projections small, which would hide mistakes)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image
from tokenizers import Tokenizer

from plugd.testing import tokenizer as tiny_tokenizer


def noise_image(width: int, height: int, mode: str, kind: str, seed: int) -> Image.Image:
    """Noise of that size, after a round trip through `kind` bytes, as a request brings it."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, len(mode)), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode).save(buffer, format=kind)
    return Image.open(io.BytesIO(buffer.getvalue()))


def varied_images() -> dict[str, Image.Image]:
    """Upright with transparency, wide, far wider than high (one row of tokens or a few), and small enough to be
    enlarged."""
    return {
        "png": noise_image(37, 53, "RGBA", "PNG", 1),
        "jpeg": noise_image(61, 29, "RGB", "JPEG", 2),
        "strip": noise_image(300, 4, "RGB", "PNG", 3),
        "small": noise_image(9, 9, "RGB", "PNG", 4),
    }


def relative_error(ours: np.ndarray, reference: np.ndarray) -> float:
    """The largest difference, relative to the largest reference value."""
    return float(np.abs(ours - reference).max() / np.abs(reference).max())


def embedded_apart_and_together(model, image: Image.Image) -> tuple[list[np.ndarray], np.ndarray]:
    """`image` and its mirror image embedded one at a time, and in one batch (as the runner stacks images whose
    preprocessed shapes agree)."""
    import mlx.core as mx

    twins = [model.preprocess(image), model.preprocess(image.transpose(Image.Transpose.FLIP_LEFT_RIGHT))]
    apart = [np.array(model.embed_media(patches[None])[0]) for patches in twins]
    return apart, np.array(model.embed_media(mx.stack(twins)))


def write_tokenizer(path: Path, tokens: tuple[str, ...]) -> tuple[dict[str, int], int]:
    """The tiny tokenizer written into `path` with `tokens` appended as special tokens; their ids (and the id of
    its own "<|im_end|>"), and the vocabulary's size."""
    tiny_tokenizer.write(path, 512)
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))  # not the trained one, which is shared
    tok.add_special_tokens(list(tokens))
    tok.save(str(path / "tokenizer.json"))
    return {token: tok.token_to_id(token) for token in [*tokens, "<|im_end|>"]}, tok.get_vocab_size()


def randomize(model, seed: int):
    """Every parameter of a torch `model` drawn around 0 (matrices) or 1 (vectors); returns the generator, for the
    caller's further draws."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(0.05 * torch.randn(parameter.shape, generator=generator) + (parameter.dim() == 1))
    return generator


def stripped_copy(checkpoint: Path, target: Path, keep) -> Path:
    """A copy of the checkpoint in `target` whose model.safetensors holds only the tensors `keep(name)` accepts (a
    tower-less conversion, say, or a tower missing some tensors)."""
    import mlx.core as mx

    target.mkdir()
    for file in checkpoint.iterdir():
        if file.name != "model.safetensors":
            (target / file.name).write_bytes(file.read_bytes())
    weights = mx.load(str(checkpoint / "model.safetensors"))
    mx.save_safetensors(str(target / "model.safetensors"), {n: t for n, t in weights.items() if keep(n)},
                        metadata={"format": "pt"})
    return target
