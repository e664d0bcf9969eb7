"""An embedding model's pipeline as its sentence-transformers layout declares it: MLX-free, read at create.

`modules.json` lists the modules after the transformer: one Pooling (`1_Pooling/config.json`, in either the
legacy `pooling_mode_*` booleans or the newer `pooling_mode`), any Dense projections (`N_Dense/config.json` and
`model.safetensors`), and a Normalize. `config_sentence_transformers.json` may name a default prompt, which
`SentenceTransformer.encode` puts before every input; `sentence_bert_config.json` may bound the input's tokens.
A module folder is named `<index>_<Module>` (`module_folder`), the only folders a model's files may lie in.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from attrs import frozen

POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
_LEGACY_POOLING = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                   "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                   "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
ACTIVATIONS = {"torch.nn.modules.linear.Identity": "identity", "torch.nn.modules.activation.Tanh": "tanh",
               "torch.nn.modules.activation.Sigmoid": "sigmoid", "torch.nn.modules.activation.ReLU": "relu",
               "torch.nn.modules.activation.GELU": "gelu"}
_MODULE_FOLDER = re.compile(r"\d+_[A-Za-z][A-Za-z0-9]*")
LAYOUT_FILES = ("modules.json", "config_sentence_transformers.json", "sentence_bert_config.json")


class LayoutError(ValueError):
    """The layout names something plugd cannot run, or is malformed."""


@frozen
class DenseLayer:
    weights: str  # the model file holding `linear.weight` (and `linear.bias`)
    in_features: int
    out_features: int
    bias: bool
    activation: str  # a value of ACTIVATIONS


@frozen
class EmbeddingLayout:
    pooling: tuple[str, ...]  # POOLING_MODES, concatenated in this order
    dimensions: int  # of the output
    dense: tuple[DenseLayer, ...] = ()
    normalize: bool = False
    prompt: str = ""  # put before every input
    max_tokens: int | None = None  # inputs are cut to this many tokens


def module_folder(name: str) -> bool:
    """Whether `name` is a sentence-transformers module folder (`1_Pooling`, `2_Dense`)."""
    return _MODULE_FOLDER.fullmatch(name) is not None


def read_layout(read: Callable[[str], Any]) -> EmbeddingLayout | None:
    """The layout of the model whose files `read(name)` gives as parsed JSON (None for an absent file); None
    for a model without `modules.json`. LayoutError for what plugd cannot run."""
    modules = read("modules.json")
    if modules is None:
        return None
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise LayoutError("modules.json must be a list of modules")
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if not kinds or kinds[0] != "Transformer" or modules[0].get("path", "") != "":
        raise LayoutError("modules.json must start with the Transformer module at the model's top folder")
    pooling, dimensions, dense, normalize = None, 0, [], False
    for module, kind in zip(modules[1:], kinds[1:], strict=True):
        folder = str(module.get("path", ""))
        if kind == "Normalize":
            normalize = True
            continue
        if kind not in ("Pooling", "Dense") or normalize or (kind == "Pooling") == (pooling is not None):
            raise LayoutError(f"module {kind!r} ({folder}) is not supported there: plugd runs a Transformer, one "
                              "Pooling, any Dense projections and a final Normalize")
        if not module_folder(folder):
            raise LayoutError(f"module folder {folder!r} is not named as sentence-transformers names them")
        config = read(f"{folder}/config.json")
        if not isinstance(config, dict):
            raise LayoutError(f"{folder}/config.json is missing")
        if kind == "Pooling":
            pooling, dimensions = _pooling(folder, config)
        else:
            dense.append(_dense(folder, config, dimensions))
            dimensions = dense[-1].out_features
    if pooling is None:
        raise LayoutError("modules.json has no Pooling module")
    return EmbeddingLayout(pooling, dimensions, tuple(dense), normalize, _prompt(read), _max_tokens(read))


def _pooling(folder: str, config: dict[str, Any]) -> tuple[tuple[str, ...], int]:
    if "pooling_mode" in config:
        mode = config["pooling_mode"]
        modes = (mode,) if isinstance(mode, str) else tuple(mode)
    else:
        modes = tuple(mode for key, mode in _LEGACY_POOLING.items() if config.get(key)) or ("mean",)
    if unknown := [m for m in modes if m not in POOLING_MODES]:
        raise LayoutError(f"{folder}: pooling mode {unknown[0]!r} is not one of {', '.join(POOLING_MODES)}")
    if config.get("include_prompt", True) is False:
        raise LayoutError(f"{folder}: pooling without the prompt's tokens (include_prompt false) is not supported")
    width = config.get("embedding_dimension", config.get("word_embedding_dimension"))
    if not isinstance(width, int) or width < 1:
        raise LayoutError(f"{folder}/config.json gives no embedding dimension")
    return modes, width * len(modes)


def _dense(folder: str, config: dict[str, Any], dimensions: int) -> DenseLayer:
    activation = config.get("activation_function", "torch.nn.modules.activation.Tanh")
    if activation not in ACTIVATIONS:
        raise LayoutError(f"{folder}: activation {activation!r} is not one of {', '.join(ACTIVATIONS)}")
    sizes = config.get("in_features"), config.get("out_features")
    if not all(isinstance(size, int) and size > 0 for size in sizes) or sizes[0] != dimensions:
        raise LayoutError(f"{folder}: a Dense of {sizes[0]} -> {sizes[1]} features cannot follow {dimensions}")
    return DenseLayer(f"{folder}/model.safetensors", sizes[0], sizes[1], bool(config.get("bias", True)),
                      ACTIVATIONS[activation])


def _prompt(read: Callable[[str], Any]) -> str:
    config = read("config_sentence_transformers.json") or {}
    name = config.get("default_prompt_name")
    prompts = config.get("prompts") or {}
    if name is not None and name not in prompts:
        raise LayoutError(f"config_sentence_transformers.json names default prompt {name!r}, which it lacks")
    return prompts[name] if name is not None else ""


def _max_tokens(read: Callable[[str], Any]) -> int | None:
    value = (read("sentence_bert_config.json") or {}).get("max_seq_length")
    return value if isinstance(value, int) and value > 0 else None
