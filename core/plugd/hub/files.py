"""Which files of a Hub repository plugd needs, and the repositories it cannot run, told before any download."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import PurePosixPath
from typing import Any

from attrs import define

from plugd.registry.errors import RegistryError, UnsupportedFormat
from plugd.store.model_files import is_model_path, is_weights

PICKLED_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt")
INDEX = "model.safetensors.index.json"


@define(frozen=True)
class HubFile:
    path: str
    size: int
    blob_id: str  # the git blob id the Hub lists
    sha256: str | None = None  # the content's digest, which the Hub lists for files kept in LFS

    @property
    def key(self) -> str:
        """What names the file in progress lines: its sha256 digest where the Hub lists one."""
        return f"sha256:{self.sha256}" if self.sha256 else f"git:{self.blob_id}"


def model_files(source: str, listing: Iterable[HubFile]) -> list[HubFile]:
    """The repository's model files: configuration, tokenizer, chat template and safetensors weights at its top,
    and the sentence-transformers module folders' configuration and weights (plugd.store.model_files). A
    repository without safetensors weights or without config.json is refused, saying what it holds instead."""
    listing = list(listing)
    chosen = [f for f in listing if is_model_path(f.path)]
    if not any(is_weights(f.path) for f in chosen):
        suffixes = {PurePosixPath(f.path).suffix for f in listing}
        if ".gguf" in suffixes:
            raise UnsupportedFormat(
                f"{source} holds GGUF weights, the llama.cpp format; plugd runs safetensors models on MLX. "
                "Pull the model's original repository, or an MLX build of it (such as mlx-community publishes)")
        if suffixes & set(PICKLED_WEIGHTS):
            raise UnsupportedFormat(
                f"{source} holds only PyTorch weights (.bin/.pt pickles), which plugd does not load; "
                "pull a repository of the model that has .safetensors weights")
        raise UnsupportedFormat(f"{source} has no .safetensors weights at its top level: not a model plugd can run")
    if not any(f.path == "config.json" for f in chosen):
        raise UnsupportedFormat(f"{source} has no config.json: not a transformers-style model repository")
    return chosen


def weights_to_fetch(source: str, files: list[HubFile], index: dict[str, Any] | None) -> list[HubFile]:
    """The safetensors files to download: those the index maps tensors to, where there is an index (a repository
    may also hold the same weights in another layout, such as a consolidated.safetensors), else all of them."""
    weights = {f.path: f for f in files if is_weights(f.path)}
    if index is None:
        return list(weights.values())
    named = set((index.get("weight_map") or {}).values())
    if missing := sorted(named - set(weights)):
        raise RegistryError(f"{source}: {INDEX} names weight files the repository does not have: {missing}")
    return [weights[name] for name in sorted(named)]
