"""A model's draft: a smaller model sharing its vocabulary, which proposes tokens for the model to check
(speculative decoding), stored among the model's own layers as Ollama stores one.

Ollama's create (x/create/draft.go in ollama/ollama) writes the draft's JSON files as JSON layers named under
`draft/` (its config as `draft/config.json`), its tensors as tensor layers whose names, of the layer and of every
tensor in it, start with `draft.`, and records in the config blob `"draft": {"model_format", "architecture",
"tensor_prefix", "config"}`. plugd's create keeps the draft's files as they are, in the `draft/` folder of the model
directory (`draft/config.json`, `draft/model.safetensors`, ...), as it keeps the model's own. Either way the draft's
configuration and tokenizer are in `draft/`, and its tensors there or, in Ollama's layout, among the model's tensor
layers under the prefix; this module tells them apart for the daemon, plugd.runner.draft loads them.
"""

from __future__ import annotations

from typing import Any

from plugd.store.manifests import OLLAMA_TENSOR, Layer
from plugd.store.metadata import tensor_metadata
from plugd.store.model_files import is_weights
from plugd.store.store import Store

DRAFT_FOLDER = "draft/"
DRAFT_CONFIG = DRAFT_FOLDER + "config.json"
DRAFT_TENSOR_PREFIX = "draft."


def is_draft_file(path: str, layer: Layer) -> bool:
    """Whether the model directory's file `path` is the draft's: in its folder, or one of its tensor layers."""
    return path.startswith(DRAFT_FOLDER) or (
        layer.media_type == OLLAMA_TENSOR and (layer.name or "").startswith(DRAFT_TENSOR_PREFIX))


def split_files(files: dict[str, Layer]) -> tuple[dict[str, Layer], dict[str, Layer]]:
    """A model directory's files (Manifest.files()) as (the model's own, its draft's), each by its path there."""
    own = {path: layer for path, layer in files.items() if not is_draft_file(path, layer)}
    return own, {path: layer for path, layer in files.items() if path not in own}


def weight_tensors(store: Store, files: dict[str, Layer]) -> dict[str, dict[str, Any]]:
    """Every tensor of the model directory's weight files by name (dtype, shape: plugd.store.metadata), a draft's
    named with DRAFT_TENSOR_PREFIX as in Ollama's layout, wherever it is stored."""
    tensors: dict[str, dict[str, Any]] = {}
    for path, layer in sorted(files.items()):
        if is_weights(path):
            found = tensor_metadata(store, layer.digest, path)["tensors"]
            prefix = DRAFT_TENSOR_PREFIX if path.startswith(DRAFT_FOLDER) else ""
            tensors |= {prefix + name: info for name, info in found.items()}
    return tensors


def split_tensors(tensors: dict[str, dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """(the model's own tensors, its draft's by their names in the draft's checkpoint)."""
    own = {name: info for name, info in tensors.items() if not name.startswith(DRAFT_TENSOR_PREFIX)}
    draft = {name.removeprefix(DRAFT_TENSOR_PREFIX): info for name, info in tensors.items()
             if name.startswith(DRAFT_TENSOR_PREFIX)}
    return own, draft


def config_entry(draft_config: dict[str, Any], files: dict[str, Layer]) -> dict[str, Any]:
    """The config blob's `draft` entry, in Ollama's shape (types/model/config.go's Draft): the draft's format, its
    architecture, its config.json's path, and the prefix of its tensor layers where it has some."""
    architecture = (draft_config.get("architectures") or [draft_config.get("model_type", "")])[0]
    entry = {"model_format": "safetensors", "architecture": architecture}
    if any(layer.media_type == OLLAMA_TENSOR for layer in files.values()):
        entry["tensor_prefix"] = DRAFT_TENSOR_PREFIX
    return entry | {"config": DRAFT_CONFIG}


def vocabulary_mismatch(model: dict[str, int], draft: dict[str, int], draft_width: int | None) -> str | None:
    """Why a draft whose tokenizer maps token strings to ids as `draft` does (added tokens included), and whose output
    head is `draft_width` wide (config.json's vocab_size), cannot draft for a model whose tokenizer is `model`: the
    first id the two vocabularies disagree on, or an output head that cannot name every token. None when it can.
    Output heads may be padded past the vocabulary differently (0.5B and 72B Qwen2.5 are); the ids past it are
    never tokens."""
    by_id = {i: token for token, i in model.items()}
    draft_by_id = {i: token for token, i in draft.items()}
    for i in sorted(by_id.keys() | draft_by_id.keys()):
        if by_id.get(i) != draft_by_id.get(i):
            theirs, ours = (repr(t) if t is not None else "absent" for t in (draft_by_id.get(i), by_id.get(i)))
            return (f"the draft does not share the model's vocabulary: token id {i} is {theirs} in the draft's "
                    f"tokenizer and {ours} in the model's")
    size = max(draft.values(), default=-1) + 1
    if draft_width is not None and draft_width < size:
        return f"the draft's output head covers {draft_width} token ids, fewer than the {size} of its vocabulary"
    return None
