"""The model's draft, for speculative decoding: loaded from the `draft/` folder of the model directory the runner is
given (plugd.store.drafts: plugd's layout keeps the draft's checkpoint whole there; Ollama's keeps its configuration
there and its tensors among the model's tensor layers, named with the prefix `draft.`)."""

from __future__ import annotations

import importlib
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from plugd.image_processor import directory_config
from plugd.runner.errors import CheckpointError
from plugd.runner.loading import checkpoint_quantization, fill, load_model
from plugd.runner.ollama_tensors import read_ollama_weights
from plugd.store.drafts import DRAFT_FOLDER, DRAFT_TENSOR_PREFIX
from plugd.store.manifests import OLLAMA_TENSORS_DIR


def load_draft(model_dir: Path, module: str | None) -> nn.Module | None:
    """The draft of the model in `model_dir`, built by the architecture module `module` (RunnerConfig.draft_module,
    as the daemon chose it) with its weights loaded; None when the model has no draft or no module runs it.

    It is a model like any (`model(tokens, cache)`, `make_cache()`) whose vocabulary is the model's; its output
    head may be wider than the model's, padded past the vocabulary (create checks both)."""
    draft_dir = Path(model_dir) / DRAFT_FOLDER
    if module is None or not (draft_dir / "config.json").is_file():
        return None
    architecture = importlib.import_module(module)
    if any(draft_dir.glob("*.safetensors")) or (draft_dir / OLLAMA_TENSORS_DIR).is_dir():
        return load_model(draft_dir, architecture)
    config = directory_config(draft_dir)
    draft = architecture.Model(architecture.ModelArgs.from_dict(config))
    tensors = Path(model_dir) / OLLAMA_TENSORS_DIR
    weights = read_ollama_weights(tensors, draft, DRAFT_TENSOR_PREFIX) if tensors.is_dir() else {}
    if not weights:
        raise CheckpointError(f"{draft_dir}: the draft has no tensors, in its folder or named {DRAFT_TENSOR_PREFIX}*")
    fill(draft, weights, checkpoint_quantization(config, ollama=True))
    del weights
    mx.eval(draft.parameters())
    mx.clear_cache()
    return draft
