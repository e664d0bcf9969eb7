"""Everything the pipeline needs to know about a stored model, read from the store's small files."""

from __future__ import annotations

import json
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from attrs import define

from plugd.errors import PlugdError
from plugd.hookspecs import Architecture, ModelFiles
from plugd.image_processor import with_image_processor
from plugd.plugins import Registry
from plugd.store import manifests as mt
from plugd.store.drafts import DRAFT_CONFIG, split_tensors, weight_tensors
from plugd.store.integrity import damage
from plugd.store.model_files import chat_template, read_json
from plugd.store.names import ModelName
from plugd.store.ollama_format import config_view
from plugd.store.sentence_layout import EmbeddingLayout
from plugd.store.store import CorruptModel, Store, StoredModel
from plugd.types import Message, structure


class UnsupportedModel(PlugdError, ValueError):
    """No installed plugin can run this model."""

    status = 400


@define(frozen=True)
class ResolvedDraft:
    """A model's draft (plugd.store.drafts): its config.json, the installed architecture that runs it (None when
    none does now), and its tensors' dtypes and shapes by their names in its checkpoint."""

    config: dict[str, Any]
    architecture: Architecture | None
    tensors: dict[str, dict[str, Any]]


@define(frozen=True)
class ResolvedModel:
    name: ModelName
    digest: str  # of the manifest: a model changes identity when any of its layers does
    files: dict[str, Path]  # model directory file name -> blob path
    config: dict[str, Any]  # the store's config blob (capabilities, renderer, parser, ...)
    model_files: ModelFiles
    generation_config: dict[str, Any]
    architecture: Architecture | None
    tensors: dict[str, dict[str, Any]]  # the model's own, not its draft's
    parameters: dict[str, Any]
    system: str | None
    messages: list[Message]
    draft: ResolvedDraft | None = None

    @property
    def embeds(self) -> bool:
        """Whether this is an embedding model (a sentence-transformers layout), which embeds and generates not."""
        return "embedding" in self.config

    @cached_property  # read on every request, and the model's tensor names are many
    def takes_images(self) -> bool:
        """Whether the model sees images: its architecture has a vision tower, and so does its checkpoint."""
        return self.architecture is not None and self.architecture.takes_images(self.tensors)

    def require_architecture(self) -> Architecture:
        if self.architecture is None:
            model_type = self.model_files.config.get("model_type")
            raise UnsupportedModel(
                f"no installed architecture plugin runs model_type {model_type!r} (model '{self.name}'); "
                "see `plugd plugins`"
            )
        return self.architecture


def resolve(store: Store, registry: Registry, name: ModelName) -> ResolvedModel:
    """The model `name` points at now; only its manifest is read, and its blobs checked, when it was resolved
    before. CorruptModel when a blob is missing or changed (plugd.store.integrity)."""
    model = store.get(name)
    if (problem := damage(store, model.manifest)) is not None:
        raise CorruptModel(f"model '{name.display()}' is damaged: {problem}; pull or create it again")
    return _resolve(store, registry, model)


@lru_cache(maxsize=64)
def _resolve(store: Store, registry: Registry, model: StoredModel) -> ResolvedModel:
    name = model.name
    files = model.manifest.files()
    hf_config = read_json(store, files, "config.json", required=True)
    texts = {layer.media_type: store.text_blob(layer.digest) for layer in model.manifest.layers
             if layer.media_type in (mt.TEMPLATE, mt.SYSTEM, mt.PARAMS, mt.MESSAGES)}
    template = texts.get(mt.TEMPLATE) or chat_template(store, files)
    tensors, draft_tensors = split_tensors(weight_tensors(store, files))
    draft = None
    if DRAFT_CONFIG in files:
        draft_config = read_json(store, files, DRAFT_CONFIG)
        draft = ResolvedDraft(draft_config, registry.architectures().get(draft_config.get("model_type")), draft_tensors)
    return ResolvedModel(
        name=name,
        digest=model.manifest.digest(),
        files={file: store.blobs.path(layer.digest) for file, layer in files.items()},
        config=config_view(store, model, registry),
        model_files=ModelFiles(
            config=with_image_processor(hf_config, lambda file: read_json(store, files, file)), chat_template=template,
            tokenizer_config=read_json(store, files, "tokenizer_config.json"),
        ),
        generation_config=read_json(store, files, "generation_config.json"),
        architecture=registry.architectures().get(hf_config.get("model_type")),
        tensors=tensors,
        parameters=json.loads(texts[mt.PARAMS]) if mt.PARAMS in texts else {},
        system=texts.get(mt.SYSTEM),
        messages=[Message(m["role"], m["content"]) for m in json.loads(texts.get(mt.MESSAGES, "[]"))],
        draft=draft,
    )


def embedding_layout(model: ResolvedModel) -> EmbeddingLayout | None:
    """The embedding pipeline create read from the model's sentence-transformers layout; None for other models."""
    return structure(model.config["embedding"], EmbeddingLayout) if model.embeds else None
