"""Reading the small JSON and text files of a stored Hugging Face model directory."""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

from plugd.errors import PlugdError
from plugd.store.manifests import Layer
from plugd.store.sentence_layout import LAYOUT_FILES, module_folder
from plugd.store.store import Store

# The files of a Hugging Face model directory that make a model (`plugd create --from DIR` uploads them, a Hub pull
# fetches them): weights, configuration, tokenizer, chat template, preprocessor and licence files, by name, so that
# nothing else a directory holds (notes, a link to a secret) becomes a layer `plugd push` would publish. Weights in
# other formats are left out.
MODEL_FILE_NAMES = frozenset({
    "config.json", "generation_config.json", "model.safetensors.index.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "tokenizer.model",
    "vocab.json", "vocab.txt", "merges.txt", "chat_template.json", "chat_template.jinja",
    "preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json",
    "LICENSE", "LICENSE.txt", "LICENSE.md", "LICENCE", "LICENCE.txt", "LICENCE.md",
    *LAYOUT_FILES,
})
MODULE_FOLDER_FILES = ("config.json", "model.safetensors")  # of a sentence-transformers module folder
MODEL_FILE_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "*.jinja", "*.tiktoken")


def is_model_file(name: str) -> bool:
    """Whether a file called `name`, at the top of a model directory, is one a model is made of."""
    return name in MODEL_FILE_NAMES or any(fnmatchcase(name, pattern) for pattern in MODEL_FILE_PATTERNS)


def is_weights(path: str) -> bool:
    """Whether `path` is one of the model's own weight files: a safetensors file at the top, or among an Ollama
    model's tensor layers; a sentence-transformers module folder's are the module's."""
    folder, _, name = path.rpartition("/")
    return name.endswith(".safetensors") and not module_folder(folder)


def is_model_path(path: str) -> bool:
    """Whether `path`, relative to a model directory, is a file a model is made of: a model file at the top, or
    a sentence-transformers module's configuration or weights in its folder (`2_Dense/model.safetensors`)."""
    folder, _, name = path.rpartition("/")
    if not folder:
        return is_model_file(name)
    return module_folder(folder) and name in MODULE_FOLDER_FILES


class MalformedModelFile(PlugdError, ValueError):
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
