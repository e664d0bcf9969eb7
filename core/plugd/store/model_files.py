"""Reading the small JSON and text files of a stored Hugging Face model directory."""

from __future__ import annotations

from typing import Any

from plugd.store.manifests import Layer
from plugd.store.store import Store

# The files of a Hugging Face model directory that make a model (`plugd create --from DIR` uploads them, a Hub pull
# fetches them); weights in other formats are left out.
MODEL_FILE_SUFFIXES = (".json", ".safetensors", ".jinja", ".txt", ".model", ".tiktoken")


class MalformedModelFile(ValueError):
    pass


def read_json(store: Store, files: dict[str, Layer], name: str, required: bool = False) -> dict[str, Any]:
    """The JSON object in file `name`; {} when absent and not required."""
    layer = files.get(name)
    if layer is None:
        if required:
            raise MalformedModelFile(f"the model has no {name}")
        return {}
    try:
        return store.json_blob(layer.digest, name)
    except ValueError as exc:
        raise MalformedModelFile(str(exc)) from None


def chat_template(store: Store, files: dict[str, Layer]) -> str | None:
    """chat_template.jinja if present, else the default template in tokenizer_config.json."""
    if layer := files.get("chat_template.jinja"):
        return store.text_blob(layer.digest)
    template = read_json(store, files, "tokenizer_config.json").get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None)
    return template if isinstance(template, str) else None
