"""Each model's tokenizer on the daemon's side (the `tokenizers` library, no MLX): prompts are counted and encoded
here, once, each image's placeholder expanded as the architecture declares (`Architecture.media_tokens`, for the
image's size), instead of in round trips to the runner; counting needs no loaded model."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import anyio
from attrs import define

from plugd.chat.models import ResolvedModel
from plugd.chat.request import InvalidRequest
from plugd.hookspecs import MediaTokens
from plugd.media import image_size
from plugd.protocol import MediaSpan
from plugd.tokenizer import Tokenizer
from plugd.types import Prompt

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json")


@lru_cache(maxsize=4)  # a large vocabulary's tokenizer holds tens of MB: only the models in use lately
def _load(digest: str, files: tuple[tuple[str, Path], ...]) -> Tokenizer:
    return Tokenizer.from_files(dict(files))


def tokenizer_of(model: ResolvedModel) -> Tokenizer:
    """The model's tokenizer, loaded on first use and kept while the model is in use."""
    return _load(model.digest, tuple((name, model.files[name]) for name in TOKENIZER_FILES if name in model.files))


def media_tokens_of(model: ResolvedModel) -> MediaTokens | None:
    """How the model's prompts hold images; None for a model without vision."""
    if not model.takes_images:
        return None
    return model.require_architecture().media_tokens(model.model_files.config)


@define
class EncodedPrompt:
    tokens: list[int]
    media: list[MediaSpan]  # each image's run of tokens, in the prompt's order (their files not yet named)


def encode_prompt(tokenizer: Tokenizer, media_tokens: MediaTokens | None, prompt: Prompt) -> EncodedPrompt:
    """The prompt's token ids, each image placeholder expanded to its run of image tokens; InvalidRequest when the
    images do not match the placeholders, or the text writes image tokens of its own."""
    if media_tokens is None:
        if prompt.media:
            raise InvalidRequest("this model does not take images")
        return EncodedPrompt(tokenizer.encode(prompt.text), [])
    pieces = prompt.text.split(media_tokens.placeholder)
    if len(pieces) - 1 != len(prompt.media):
        raise InvalidRequest(f"the prompt has {len(pieces) - 1} image placeholders ({media_tokens.placeholder}) "
                             f"but the request carries {len(prompt.media)} images")
    try:
        expansions = [media_tokens.expand(*image_size(item.data)) for item in prompt.media]
    except ValueError as exc:  # an image the processor refuses (an extreme aspect ratio)
        raise InvalidRequest(f"an image cannot be used: {exc}") from None
    tokens = tokenizer.encode("".join(piece + expansion for piece, expansion in zip(pieces, [*expansions, ""])))
    runs = token_runs(tokens, media_tokens.token_id)
    if len(runs) != len(prompt.media):
        raise InvalidRequest(f"the prompt holds {len(runs)} runs of image tokens for {len(prompt.media)} images: "
                             "image tokens written as text are not allowed")
    return EncodedPrompt(tokens, [MediaSpan(start=start, end=end, digest=item.key)
                                  for (start, end), item in zip(runs, prompt.media, strict=True)])


def token_runs(tokens: Sequence[int], token_id: int) -> list[tuple[int, int]]:
    """(start, end) of each maximal run of `token_id`."""
    runs: list[tuple[int, int]] = []
    for i, token in enumerate(tokens):
        if token != token_id:
            continue
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


async def encode(model: ResolvedModel, prompt: Prompt) -> EncodedPrompt:
    """`prompt` encoded for `model`, in a worker thread (a long prompt takes a while, and a first use loads the
    tokenizer)."""
    return await anyio.to_thread.run_sync(lambda: encode_prompt(tokenizer_of(model), media_tokens_of(model), prompt))
