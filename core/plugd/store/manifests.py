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

    def to_bytes(self) -> bytes:
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
        return cls(config=Layer.from_json(data.get("config")), layers=[Layer.from_json(x) for x in layers])

    def digests(self) -> set[str]:
        return {self.config.digest} | {layer.digest for layer in self.layers}

    def files(self) -> dict[str, Layer]:
        """Model directory files by relative path."""
        return {layer.name: layer for layer in self.layers if layer.media_type == MODEL_FILE and layer.name}

    def layer(self, media_type: str) -> Layer | None:
        return next((layer for layer in self.layers if layer.media_type == media_type), None)

    def size(self) -> int:
        return self.config.size + sum(layer.size for layer in self.layers)

    def digest(self) -> str:
        return hashlib.sha256(self.to_bytes()).hexdigest()
