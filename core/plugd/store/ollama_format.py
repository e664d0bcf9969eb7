"""How a model in Ollama's safetensors format (docs/registries.md) looks to plugd.

The config blob Ollama's create writes (types/model/config.go in ollama/ollama) names the format, the file type,
the capabilities and Ollama's renderer and parser, and leaves out what plugd's create records (family, parameter
count and size, context length). Those gaps are filled from the model's config.json and tensor headers; the blob
itself is left as it is, so that a push sends it back unchanged. Ollama's renderer and parser names are mapped
onto the installed plugins: the same name, or the plugin Ollama's own code uses for it, else what plugd detects
from the model's files.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from plugd.builtins.jinja_renderer import FALLBACK_RENDERER
from plugd.hookspecs import ModelFiles
from plugd.plugins import Registry
from plugd.store.drafts import split_tensors, weight_tensors
from plugd.store.metadata import file_type, human_parameters, parameter_count
from plugd.store.model_files import chat_template, read_json
from plugd.store.store import Store, StoredModel


def config_view(store: Store, model: StoredModel, registry: Registry | None = None) -> dict[str, Any]:
    """The model's config blob as plugd reads it: unchanged for a model plugd made; for one in Ollama's format, with
    the gaps filled and (given the installed plugins) its renderer and parser mapped onto them."""
    config = store.config(model)
    if not model.manifest.ollama_format():
        return config
    config = config | {key: value for key, value in _described(store, model).items() if not config.get(key)}
    if registry is not None:
        config["renderer"], config["parser"] = _plugin_names(store, model, config, registry)
    return config


@lru_cache(maxsize=64)
def _described(store: Store, model: StoredModel) -> dict[str, Any]:
    """What plugd's create would record about the model, read off its config.json and tensor headers (its draft's
    left out)."""
    files = model.manifest.files()
    hf_config = read_json(store, files, "config.json")
    tensors, _ = split_tensors(weight_tensors(store, files))
    count = parameter_count(tensors, hf_config)
    model_type = hf_config.get("model_type", "")
    return {
        "model_family": model_type,
        "model_families": [model_type] if model_type else [],
        "model_type": human_parameters(count),
        "file_type": file_type(tensors, hf_config),
        "architecture": (hf_config.get("architectures") or [model_type])[0],
        "parameter_count": count,
        "context_length": hf_config.get("max_position_embeddings")
        or (hf_config.get("text_config") or {}).get("max_position_embeddings"),
        "capabilities": ["completion"],
    }


def _plugin_names(store: Store, model: StoredModel, config: dict[str, Any], registry: Registry) -> tuple[str | None, ...]:
    renderers, parsers = registry.renderers(), registry.parsers()
    renderer = _installed(config.get("renderer"), renderers)
    parser = _installed(config.get("parser"), parsers)
    if renderer is None or parser is None:
        files = model.manifest.files()
        template = chat_template(store, files)
        found = ModelFiles(config=read_json(store, files, "config.json"), chat_template=template,
                           tokenizer_config=read_json(store, files, "tokenizer_config.json"))
        renderer = renderer or _detected(renderers, found) or (FALLBACK_RENDERER if template else None)
        parser = parser or _detected(parsers, found)
    return renderer, parser


def _installed(name: Any, installed: dict[str, Any]) -> str | None:
    """The installed renderer or parser that `name` (Ollama's name, in an Ollama model's config) is, or is an alias
    of."""
    if not isinstance(name, str):
        return None
    if name in installed:
        return name
    return next((known for known, item in installed.items() if name in item.aliases), None)


def _detected(available: dict[str, Any], model_files: ModelFiles) -> str | None:
    return next((name for name, item in available.items() if item.detect and item.detect(model_files)), None)
