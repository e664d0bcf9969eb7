"""Create a model from uploaded Hugging Face files or an existing model, plus Modelfile-style overrides."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from attrs import define, field
from tokenizers import Tokenizer

from plugd.builtins.jinja_renderer import FALLBACK_RENDERER, check_template
from plugd.errors import PlugdError
from plugd.hookspecs import Architecture, ModelFiles
from plugd.plugins import Registry
from plugd.store import manifests as mt
from plugd.store.drafts import DRAFT_CONFIG, DRAFT_FOLDER, config_entry, split_files, vocabulary_mismatch
from plugd.store.manifests import Layer, Manifest
from plugd.store.metadata import file_type, human_parameters, parameter_count, quantization, tensor_metadata
from plugd.store.model_files import chat_template, is_model_path, is_weights, read_json
from plugd.store.names import ModelName
from plugd.store.ollama_format import config_view
from plugd.store.quantize import QuantizeError, bits_for, quantize_files
from plugd.store.sentence_layout import read_layout
from plugd.store.store import Store
from plugd.types import OPTION_TYPES, unstructure

CAPABILITIES = ("completion", "tools", "thinking", "vision", "embedding")


class CreateError(PlugdError, ValueError):
    """The request cannot produce a model; the message says what to fix."""

    status = 400


@define
class CreateRequest:
    """Ollama's /api/create body, plus plugd's renderer, parser and capabilities overrides.

    A draft model (plugd.store.drafts) comes as Ollama sends one, `draft_files` (the draft directory's files by name,
    uploaded as blobs like `files`), or as plugd's `draft`: the name of a model in the store, as `from` names one."""

    model: str
    from_: str | None = None
    files: dict[str, str] = field(factory=dict)
    template: str | None = None
    system: str | None = None
    parameters: dict[str, Any] = field(factory=dict)
    messages: list[dict[str, str]] | None = None
    license: str | list[str] | None = None
    renderer: str | None = None
    parser: str | None = None
    capabilities: list[str] | None = None
    quantize: str | None = None
    draft: str | None = None
    draft_files: dict[str, str] = field(factory=dict)
    stream: bool = True


@define
class _Parts:
    """What the new model will be made of, before it is written."""

    files: dict[str, Layer]
    extra: dict[str, Layer]  # non-file layers by media type, inherited from `from`
    base_config: dict[str, Any] = field(factory=dict)
    draft: dict[str, Layer] = field(factory=dict)  # the draft's files by their path in the model directory


def _check_file_name(name: str) -> None:
    """A model's files lie side by side, as the runner reads them, but for a sentence-transformers module's in its
    own folder (plugd.store.model_files.is_model_path): any other name with a folder in it is refused."""
    folder, _, file = name.rpartition("/")
    if not file or file in (".", "..") or "\\" in name or (folder and not is_model_path(name)):
        raise CreateError(f"invalid file name {name!r}: must be the name of a file at the top of the model "
                          "directory, or of a sentence-transformers module's config.json or model.safetensors")


def _uploaded(store: Store, files: dict[str, str], what: str = "file") -> dict[str, Layer]:
    layers = {}
    for name, digest in files.items():
        _check_file_name(name)
        try:
            present = store.blobs.exists(digest)
        except ValueError as exc:
            raise CreateError(f"{what} {name}: {exc}") from None
        if not present:
            raise CreateError(f"blob {digest} for {what} {name} is not in the store; upload it with POST /api/blobs/{digest}")
        layers[name] = Layer(mt.MODEL_FILE, digest, store.blobs.size(digest), name)
    return layers


def _parts_from_model(store: Store, registry: Registry, source: str) -> _Parts:
    base = store.get(ModelName.parse(source))
    # An Ollama-format base keeps its tensor and JSON layers as they are, and a base with a draft its draft.
    files, draft = split_files(base.manifest.files())
    extra = {layer.media_type: layer for layer in base.manifest.layers if layer not in [*files.values(), *draft.values()]}
    config = config_view(store, base, registry)  # Ollama's renderer and parser names mapped onto installed plugins
    config["capabilities"] = [c for c in config.get("capabilities") or [] if c in CAPABILITIES]
    return _Parts(files=files, extra=extra, base_config=config, draft=draft)


def _draft_source(store: Store, req: CreateRequest) -> dict[str, Layer] | None:
    """The files of the draft the request names, by their paths in the draft's directory; None when it names none."""
    if req.draft and req.draft_files:
        raise CreateError("give the draft as 'draft' (a model) or as 'draft_files', not both")
    if req.draft_files:
        return _uploaded(store, req.draft_files, "draft file")
    if req.draft:
        return split_files(store.get(ModelName.parse(req.draft)).manifest.files())[0]  # not a draft's own draft
    return None


def _check_draft(store: Store, registry: Registry, files: dict[str, Layer], model_files: dict[str, Layer]) -> None:
    """Refuses a draft that cannot draft for the model of `model_files`: no installed architecture runs it, it has no
    weights, or it does not share the model's vocabulary."""
    try:
        config = read_json(store, files, "config.json", required=True)
    except ValueError as exc:
        raise CreateError(f"draft: {exc}") from None
    model_type = config.get("model_type")
    if model_type not in registry.architectures():
        raise CreateError(f"the draft's model_type {model_type!r} is run by no installed architecture plugin; installed: "
                          f"{', '.join(sorted(registry.architectures())) or 'none'} (see `plugd plugins`)")
    if "modules.json" in files:
        raise CreateError("the draft is an embedding model (a sentence-transformers layout), which generates nothing")
    if not any(is_weights(path) for path in files):
        raise CreateError("the draft has no .safetensors weights")
    width = config.get("text_config", config).get("vocab_size")
    mismatch = vocabulary_mismatch(_vocabulary(store, model_files, "the model"), _vocabulary(store, files, "the draft"),
                                   width if isinstance(width, int) else None)
    if mismatch:
        raise CreateError(mismatch)


def _vocabulary(store: Store, files: dict[str, Layer], whose: str) -> dict[str, int]:
    """Token strings to ids in the tokenizer.json of `files`, added tokens included."""
    if (layer := files.get("tokenizer.json")) is None:
        raise CreateError(f"{whose} has no tokenizer.json, so the draft's vocabulary cannot be checked against the model's")
    try:
        return Tokenizer.from_file(str(store.blobs.path(layer.digest))).get_vocab(with_added_tokens=True)
    except Exception as exc:  # the tokenizers library raises its parse errors as plain Exception
        raise CreateError(f"{whose}'s tokenizer.json cannot be read: {exc}") from None


def _tensors(store: Store, parts: _Parts) -> dict[str, dict[str, Any]]:
    weight_files = {n: layer for n, layer in parts.files.items() if is_weights(n)}
    if not weight_files:
        raise CreateError("the model has no .safetensors weights")
    index = read_json(store, parts.files, "model.safetensors.index.json")
    if missing := set(index.get("weight_map", {}).values()) - set(weight_files):
        raise CreateError(f"model.safetensors.index.json names weight files that were not given: {sorted(missing)}")
    tensors: dict[str, dict[str, Any]] = {}
    for name, layer in sorted(weight_files.items()):
        tensors |= tensor_metadata(store, layer.digest, name)["tensors"]
    return tensors


def _any_json(store: Store, files: dict[str, Layer], name: str) -> Any:
    """The JSON value in file `name` (modules.json is a list); None when there is no such file."""
    if (layer := files.get(name)) is None:
        return None
    try:
        return json.loads(store.blobs.path(layer.digest).read_bytes())
    except (OSError, ValueError) as exc:
        raise CreateError(f"{name} cannot be read: {exc}") from None


def _architecture(registry: Registry, config: dict[str, Any]) -> Architecture:
    """The installed architecture that runs the model: a model no plugin runs is refused here, not at its first request."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise CreateError("config.json has no model_type")
    installed = registry.architectures()
    if model_type not in installed:
        raise CreateError(f"no installed architecture plugin runs model_type {model_type!r}; installed: "
                          f"{', '.join(sorted(installed)) or 'none'} (see `plugd plugins`)")
    return installed[model_type]


def _quantized(store: Store, architecture: Architecture, parts: _Parts, config: dict[str, Any], level: str,
               status: Callable[[str], None]) -> tuple[dict[str, Layer], dict[str, Any], dict[str, dict[str, Any]]]:
    """Replace the float weights of `parts` with quantized ones; returns its new files, config and tensors."""
    try:
        bits = bits_for(level)
        if quantization(config):
            raise QuantizeError("the model is already quantized")
        status(f"quantizing {file_type(_tensors(store, parts), config)} model to {level.upper()}")
        files = quantize_files(store, parts.files, architecture.module, bits)
    except QuantizeError as exc:
        raise CreateError(str(exc)) from None
    quantized = _Parts(files=files, extra=parts.extra)
    return files, read_json(store, files, "config.json", required=True), _tensors(store, quantized)


def infer_capabilities(chat_template: str | None, architecture: Architecture | None,
                       tensor_names: Iterable[str] = ()) -> list[str]:
    """What the model can do, read from its chat template; `vision` when its architecture sees images with the
    checkpoint's tensors."""
    template = chat_template or ""
    found = ["completion"]
    if "tools" in template:
        found.append("tools")
    if "<think>" in template or "enable_thinking" in template or "reasoning_content" in template:
        found.append("thinking")
    if architecture is not None and architecture.takes_images(tensor_names):
        found.append("vision")
    return found


def _pick(kind: str, requested: str | None, available: dict[str, Any], model: ModelFiles) -> str | None:
    if requested is not None:
        if requested not in available:
            raise CreateError(f"unknown {kind} {requested!r}; installed: {', '.join(sorted(available)) or 'none'}")
        return requested
    detected = [name for name, item in available.items() if item.detect and item.detect(model)]
    return detected[0] if detected else None


def _parameters(requested: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for name, value in requested.items():
        kind = OPTION_TYPES.get(name)
        if kind is None:
            raise CreateError(f"unknown parameter {name!r}")
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value) if kind is list else (
            isinstance(value, (int, float)) and not isinstance(value, bool) and (kind is float or float(value).is_integer())
        )
        if not ok:
            raise CreateError(f"invalid value {value!r} for parameter {name!r}: expected {kind.__name__}")
        merged[name] = kind(value) if kind is not list else list(value)
    return merged


def _text_layers(store: Store, req: CreateRequest, parts: _Parts, params: dict[str, Any]) -> dict[str, Layer]:
    """Template, system, parameters, messages and license layers: the request's, else inherited."""
    layers = dict(parts.extra)
    licenses = [req.license] if isinstance(req.license, str) else req.license
    values = {
        mt.TEMPLATE: req.template,
        mt.SYSTEM: req.system,
        mt.PARAMS: json.dumps(params) if params else None,
        mt.MESSAGES: json.dumps(req.messages) if req.messages is not None else None,
        mt.LICENSE: "\n\n".join(licenses) if licenses else None,
    }
    for media_type, text in values.items():
        if text is not None:
            data = text.encode()
            layers[media_type] = Layer(media_type, store.blobs.write_bytes(data), len(data))
    return layers


def create_model(store: Store, registry: Registry, req: CreateRequest, status: Callable[[str], None],
                 origin: dict[str, str] | None = None) -> None:
    """Validate, write the config blob and point the name at the new manifest; reports progress to `status`.

    `origin` says where the files came from (a Hub pull gives the repository and commit); a model made `from`
    another keeps that one's."""
    name = ModelName.parse(req.model)
    if req.files:
        parts = _Parts(files=_uploaded(store, req.files), extra={})
    elif req.from_:
        parts = _parts_from_model(store, registry, req.from_)
    else:
        raise CreateError("neither 'from' nor 'files' was specified")
    status("parsing model files")
    try:
        config = read_json(store, parts.files, "config.json", required=True)
        tokenizer_config = read_json(store, parts.files, "tokenizer_config.json")
        if req.template is not None:
            check_template(req.template)
        template = req.template if req.template is not None else chat_template(store, parts.files)
        tensors = _tensors(store, parts)
        layout = read_layout(lambda file: _any_json(store, parts.files, file))
    except ValueError as exc:  # LayoutError included
        raise CreateError(str(exc)) from None
    architecture = _architecture(registry, config)
    if (draft := _draft_source(store, req)) is not None:
        status("checking the draft")
        _check_draft(store, registry, draft, parts.files)
        parts.draft = {DRAFT_FOLDER + path: Layer(mt.MODEL_FILE, layer.digest, layer.size, DRAFT_FOLDER + path)
                       for path, layer in draft.items()}
    if req.quantize and layout is not None:
        raise CreateError("quantizing an embedding model (a sentence-transformers layout) is not supported")
    if req.quantize:
        parts.files, config, tensors = _quantized(store, architecture, parts, config, req.quantize, status)
    model_files = ModelFiles(config=config, chat_template=template, tokenizer_config=tokenizer_config)

    base = parts.base_config
    capabilities = req.capabilities
    if capabilities is None:
        capabilities = base.get("capabilities") or (
            ["embedding"] if layout is not None else infer_capabilities(template, architecture, tensors))
    if unknown := set(capabilities) - set(CAPABILITIES):
        raise CreateError(f"unknown capabilities {sorted(unknown)}; known: {', '.join(CAPABILITIES)}")
    params_layer = parts.extra.get(mt.PARAMS)
    base_params = json.loads(store.text_blob(params_layer.digest)) if params_layer else {}
    layers = sorted(parts.files.values(), key=lambda layer: layer.name or "")
    layers += sorted(parts.draft.values(), key=lambda layer: layer.name or "")
    layers += _text_layers(store, req, parts, _parameters(req.parameters, base_params)).values()
    for layer in layers:
        status(f"using layer {layer.digest}")

    count = parameter_count(tensors, config)
    model_config = {
        "model_format": "safetensors",
        "model_family": config["model_type"],
        "model_families": [config["model_type"]],
        "model_type": human_parameters(count),
        "file_type": file_type(tensors, config),
        "architecture": (config.get("architectures") or [config["model_type"]])[0],
        "parameter_count": count,
        "context_length": config.get("max_position_embeddings")
        or config.get("text_config", {}).get("max_position_embeddings"),
        "capabilities": list(capabilities),
        "renderer": _pick("renderer", req.renderer or base.get("renderer"), registry.renderers(), model_files)
        or (FALLBACK_RENDERER if template else None),
        "parser": _pick("parser", req.parser or base.get("parser"), registry.parsers(), model_files),
        "rootfs": {"type": "layers", "diff_ids": [layer.digest for layer in layers]},
    }
    if layout is not None:
        model_config["embedding"] = unstructure(layout)
    if parts.draft:
        model_config["draft"] = config_entry(read_json(store, parts.draft, DRAFT_CONFIG), parts.draft)
    if unsupported := (architecture.unsupported_inputs(tensors) if architecture is not None else []):
        model_config["unsupported_inputs"] = unsupported
        for kind in unsupported:
            status(f"the checkpoint's {kind} tower is not supported: it is not loaded, and {kind} input is refused")
    if origin := origin or base.get("origin"):
        model_config["origin"] = origin
    data = json.dumps(model_config, indent=2).encode()
    config_layer = Layer(mt.CONFIG_MEDIA_TYPE, store.blobs.write_bytes(data), len(data))
    status("writing manifest")
    try:
        store.put(name, Manifest(config=config_layer, layers=layers))
    except FileNotFoundError as exc:  # a blob vanished (deleted concurrently) since it was checked
        raise CreateError(str(exc)) from None
