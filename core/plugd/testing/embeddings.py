"""Tiny embedding checkpoints in the sentence-transformers layout, as `SentenceTransformer.save` writes them: the
base model's weights (no `model.` prefix, no output head), `modules.json`, a Pooling folder, Dense folders and a
Normalize, so that sentence-transformers itself loads the same directory as the reference."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save_file

from plugd.testing.checkpoints import write_checkpoint

IDENTITY = "torch.nn.modules.linear.Identity"


def write_embedding_checkpoint(path: Path, model_type: str = "qwen3", *, seed: int = 0, pooling: str = "lasttoken",
                               dense: Sequence[int] = (), normalize: bool = True, prompts: dict[str, str] | None = None,
                               default_prompt: str | None = None, max_seq_length: int | None = None,
                               append_eos: bool = False, overrides: dict[str, Any] | None = None) -> Path:
    """A tiny `model_type` checkpoint turned into an embedding model: `pooling` over its last hidden states, a Dense
    projection (no bias, no activation, as EmbeddingGemma's) to each width in `dense`, then a Normalize if asked.
    With `append_eos` its tokenizer ends every text with the EOS token, as Qwen3-Embedding's does."""
    path = write_checkpoint(path, model_type, seed=seed, overrides=overrides)
    if append_eos:
        _append_eos(path)
    for file in sorted(path.glob("*.safetensors")):
        weights = {name.removeprefix("model."): tensor for name, tensor in load_file(file).items()
                   if not name.startswith("lm_head.")}
        save_file(weights, str(file), metadata={"format": "pt"})
    hidden = json.loads((path / "config.json").read_text())["hidden_size"]
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               _module(1, "Pooling")]
    _write(path / "1_Pooling" / "config.json", {"word_embedding_dimension": hidden, "pooling_mode": pooling,
                                                 "include_prompt": True})
    rng, width = np.random.default_rng(seed + 1000), hidden
    for out in dense:
        index = len(modules)
        folder = path / f"{index}_Dense"
        _write(folder / "config.json", {"in_features": width, "out_features": out, "bias": False,
                                        "activation_function": IDENTITY})
        weight = (rng.standard_normal((out, width)) / np.sqrt(width)).astype(np.float32)
        save_file({"linear.weight": weight}, str(folder / "model.safetensors"), metadata={"format": "pt"})
        modules.append(_module(index, "Dense"))
        width = out
    if normalize:
        modules.append(_module(len(modules), "Normalize"))
        (path / modules[-1]["path"]).mkdir()
    _write(path / "modules.json", modules)
    _write(path / "config_sentence_transformers.json",
           {"prompts": prompts or {}, "default_prompt_name": default_prompt, "similarity_fn_name": "cosine"})
    if max_seq_length is not None:
        _write(path / "sentence_bert_config.json", {"max_seq_length": max_seq_length, "do_lower_case": False})
    return path


def _append_eos(path: Path) -> None:
    """A post-processor in tokenizer.json that puts the config's EOS token after each sequence."""
    tokenizer = json.loads((path / "tokenizer.json").read_text())
    eos_id = json.loads((path / "config.json").read_text())["eos_token_id"]
    eos = next(token["content"] for token in tokenizer["added_tokens"] if token["id"] == eos_id)
    sequence, special = {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": eos, "type_id": 0}}
    tokenizer["post_processor"] = {
        "type": "TemplateProcessing", "single": [sequence, special],
        "pair": [sequence, {"Sequence": {"id": "B", "type_id": 1}}, special],
        "special_tokens": {eos: {"id": eos, "ids": [eos_id], "tokens": [eos]}},
    }
    _write(path / "tokenizer.json", tokenizer)


def _module(index: int, kind: str) -> dict[str, Any]:
    return {"idx": index, "name": str(index), "path": f"{index}_{kind}", "type": f"sentence_transformers.models.{kind}"}


def _write(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2))
