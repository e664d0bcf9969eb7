"""Each model's tokenizer on the daemon's side (the `tokenizers` library, no MLX): prompts are counted and encoded
here, once, instead of in round trips to the runner, and counting needs no loaded model."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import anyio

from plugd.chat.models import ResolvedModel
from plugd.tokenizer import Tokenizer

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json")


@lru_cache(maxsize=4)  # a large vocabulary's tokenizer holds tens of MB: only the models in use lately
def _load(digest: str, files: tuple[tuple[str, Path], ...]) -> Tokenizer:
    return Tokenizer.from_files(dict(files))


def tokenizer_of(model: ResolvedModel) -> Tokenizer:
    """The model's tokenizer, loaded on first use and kept while the model is in use."""
    return _load(model.digest, tuple((name, model.files[name]) for name in TOKENIZER_FILES if name in model.files))


async def encode(model: ResolvedModel, text: str) -> list[int]:
    """`text`'s token ids for `model`, as its runner would encode it; in a worker thread (a long prompt takes a
    while, and a first use loads the tokenizer)."""
    return await anyio.to_thread.run_sync(lambda: tokenizer_of(model).encode(text))
