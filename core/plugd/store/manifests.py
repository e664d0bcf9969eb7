"""Manifests: `manifests/<host>/<namespace>/<model>/<tag>`, OCI-shaped JSON listing a config blob and layers."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from attrs import define, field

MANIFEST_MEDIA_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_MEDIA_TYPE = "application/vnd.docker.container.image.v1+json"
# A file of the Hugging Face model directory; the layer's `name` is its relative path there.
MODEL_FILE = "application/vnd.plugd.model.file"
TEMPLATE = "application/vnd.ollama.image.template"
SYSTEM = "application/vnd.ollama.image.system"
PARAMS = "application/vnd.ollama.image.params"
MESSAGES = "application/vnd.ollama.image.messages"
LICENSE = "application/vnd.ollama.image.license"
# Ollama's weights: a GGUF file, for llama.cpp; plugd runs safetensors (MODEL_FILE layers).
GGUF_WEIGHTS = "application/vnd.ollama.image.model"
# Ollama's safetensors format for its MLX engine (docs/registries.md): a safetensors file per tensor or stacked expert
# group, the layer named after it, and the model directory's JSON files, each layer named by its path there.
OLLAMA_TENSOR = "application/vnd.ollama.image.tensor"
OLLAMA_JSON = "application/vnd.ollama.image.json"
# The folder of a model directory holding Ollama's tensor layers, one file per blob: `<digest hex>.safetensors`.
OLLAMA_TENSORS_DIR = "ollama-tensors"


class MalformedManifest(ValueError):
    pass


@define(frozen=True)
class Layer:
    media_type: str
    digest: str
    size: int
    name: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.name is not None:
            out["name"] = self.name
        return out

    @classmethod
    def from_json(cls, data: Any) -> Layer:
        if not isinstance(data, dict):
            raise MalformedManifest(f"layer is not an object: {data!r}")
        try:
            layer = cls(data["mediaType"], data["digest"], data["size"], data.get("name"))
        except KeyError as exc:
            raise MalformedManifest(f"layer lacks {exc.args[0]!r}") from None
        if not (isinstance(layer.media_type, str) and isinstance(layer.digest, str) and isinstance(layer.size, int)):
            raise MalformedManifest(f"layer has fields of the wrong type: {data!r}")
        if layer.name is not None and not isinstance(layer.name, str):
            raise MalformedManifest(f"layer name is not a string: {data!r}")
        return layer


@define(frozen=True)
class Manifest:
    config: Layer
    layers: tuple[Layer, ...] = field(converter=tuple)
    media_type: str = MANIFEST_MEDIA_TYPE
    # The bytes it was read from: a pulled manifest is stored and pushed back byte for byte, its digest unchanged.
    raw: bytes | None = field(default=None, eq=False, repr=False)

    def to_bytes(self) -> bytes:
        if self.raw is not None:
            return self.raw
        data = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": self.config.to_json(),
            "layers": [layer.to_json() for layer in self.layers],
        }
        return json.dumps(data, indent=2).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Manifest:
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise MalformedManifest(f"not JSON: {exc}") from None
        if not isinstance(data, dict) or data.get("schemaVersion") != 2:
            raise MalformedManifest("not a schemaVersion 2 manifest")
        layers = data.get("layers")
        if not isinstance(layers, list):
            raise MalformedManifest("layers is not a list")
        media_type = data.get("mediaType") or MANIFEST_MEDIA_TYPE
        if not isinstance(media_type, str):
            raise MalformedManifest("mediaType is not a string")
        return cls(config=Layer.from_json(data.get("config")), layers=[Layer.from_json(x) for x in layers],
                   media_type=media_type, raw=raw)

    def digests(self) -> set[str]:
        return {self.config.digest} | {layer.digest for layer in self.layers}

    def files(self) -> dict[str, Layer]:
        """Model directory files by relative path: plugd's file layers and Ollama's JSON layers by their names,
        Ollama's tensor layers as OLLAMA_TENSORS_DIR/<digest hex>.safetensors."""
        files = {}
        for layer in self.layers:
            if layer.media_type in (MODEL_FILE, OLLAMA_JSON) and layer.name:
                files[layer.name] = layer
            elif layer.media_type == OLLAMA_TENSOR:
                files[f"{OLLAMA_TENSORS_DIR}/{layer.digest.removeprefix('sha256:')}.safetensors"] = layer
        return files

    def ollama_format(self) -> bool:
        """Whether the weights are in Ollama's safetensors format (OLLAMA_TENSOR layers)."""
        return any(layer.media_type == OLLAMA_TENSOR for layer in self.layers)

    def layer(self, media_type: str) -> Layer | None:
        return next((layer for layer in self.layers if layer.media_type == media_type), None)

    def size(self) -> int:
        return self.config.size + sum(layer.size for layer in self.layers)

    def digest(self) -> str:
        return hashlib.sha256(self.to_bytes()).hexdigest()
