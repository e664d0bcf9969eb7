"""Models in Ollama's safetensors format for its MLX engine, written as `ollama create` writes them, for tests.

    model = write_ollama_model(checkpoint, tmp_path / "ollama", "tiny:mlx", quantize="int4", experts="stacked")
    upload(model, registry.url, "test/tiny", "mlx")          # as `ollama push` leaves it on a registry
    twin = write_twin(checkpoint, tmp_path / "twin", "int4")  # the same weights in a directory plugd creates from

Written after ollama/ollama at commit fb30760996871fa9460115c753afd2c60d4ab0f7: x/create (create.go's
GetTensorQuantization and ExpertGroupPrefix, plan.go, quantize.go, quantpolicy.go), x/create/client/create.go
(config blob, Modelfile layers) and manifest/ (the manifest as WriteManifest encodes it). Each tensor is a
safetensors file of its own under its Hugging Face name; a MoE layer's experts are stacked per projection into
`P.experts.PROJ.weight` and kept in one layer `P.experts` when every projection is quantized alike (one layer per
projection otherwise), or, with `experts="switch_mlp"`, stacked as imports from March to July 2026 named them,
or, with `experts="per_expert"`, kept one tensor per expert as earlier imports did. A quantized tensor T is the
packed weight T, T.scale and (affine) T.bias, from MLX's own quantizer; quant_type and group_size go into the
file's metadata, per tensor where one file mixes types. config.json and the other *.json files are layers
named by their file name. A draft model (x/create/draft.go) follows the model's layers: its tensors unquantized, as
Ollama's create leaves them unless asked, in layers whose names and tensors' names start with `draft.`, then its
*.json files named under `draft/`, and the config blob says where (`draft`).

The twin is the checkpoint as plugd loads the Ollama model: affine tensors quantized identically, in mlx-lm's
layout (experts stacked as `switch_mlp`, `scales`/`biases`, config.json's `quantization`), and the tensors of
the other modes dequantized to float32.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import mlx.core as mx
from attrs import define

from plugd.store import manifests as mt
from plugd.store.names import ModelName

# x/quant: mode, bits, group size.
QUANT_PARAMS = {"int4": ("affine", 4, 64), "int8": ("affine", 8, 64), "nvfp4": ("nvfp4", 4, 16),
                "mxfp4": ("mxfp4", 4, 32), "mxfp8": ("mxfp8", 8, 32)}
EXPERT_LAYOUTS = ("stacked", "switch_mlp", "per_expert")
_LAYER_PREFIX = re.compile(r"(?:model\.language_model\.|language_model(?:\.model)?\.|model\.|backbone\.)?layers\.\d+")
_EXPERT_MARKERS = (".mlp.experts.", ".mlp.shared_experts.", ".mlp.switch_mlp.", ".moe.experts.", ".mixer.experts.",
                   ".mixer.shared_experts.")
_PER_EXPERT = re.compile(r"(?P<group>.+)\.(?P<index>\d+)\.(?P<proj>[^.]+)\.weight")


@define(frozen=True)
class OllamaModel:
    """A model in an Ollama models directory: `manifests/<host>/<namespace>/<model>/<tag>` and `blobs/sha256-*`."""

    root: Path
    name: ModelName

    @property
    def manifest(self) -> bytes:
        return self.root.joinpath("manifests", *self.name.parts).read_bytes()

    def blob(self, digest: str) -> Path:
        return self.root / "blobs" / digest.replace(":", "-")


def eight_bit(quant_type: str) -> str:
    return "int8" if quant_type in ("int4", "int8") else "mxfp8"


def _aligned(shape: tuple[int, ...], quant_type: str) -> bool:
    return bool(shape) and shape[-1] % QUANT_PARAMS[quant_type][2] == 0


def stacked_expert(name: str) -> bool:
    return not name.endswith((".bias", ".scale", ".qbias")) and any(
        marker in name for marker in (".experts.", ".mlp.switch_mlp.", ".mlp.shared_experts.", ".mixer.shared_experts."))


def quant_type(name: str, shape: tuple[int, ...], requested: str | None) -> str | None:
    """The type Ollama's default policy (GetTensorQuantization) quantizes a tensor to; None keeps it as it is."""
    if not requested:
        return None
    expert = stacked_expert(name)
    plain = name.endswith(".weight") and not any(s in name for s in ("embed", "norm", "ln_", "audio_tower"))
    if not (expert or plain) or not (len(shape) == 2 or (len(shape) == 3 and expert)):
        return None
    if math.prod(shape) < 1024 or name.endswith(
            (".mlp.gate.weight", ".mixer.gate.weight", ".shared_expert_gate.weight", ".router.proj.weight")):
        return None
    if name.endswith("lm_head.weight"):
        return eight_bit(requested) if _aligned(shape, eight_bit(requested)) else None
    if "vision" in name or "visual" in name or not _aligned(shape, requested):
        return None
    promotes = requested == "int4" or (requested in ("nvfp4", "mxfp4") and not expert)
    if promotes and any(s in name for s in (".v_proj", ".k_proj", "down_proj")) and _aligned(shape, eight_bit(requested)):
        return eight_bit(requested)
    return requested


def expert_group(name: str) -> str | None:
    """ExpertGroupPrefix: the layer's expert group a per-expert weight belongs to, e.g. `model.layers.1.mlp.experts`."""
    if not name.endswith(".weight"):
        return None
    for marker in _EXPERT_MARKERS:
        at = name.find(marker)
        if at != -1 and _LAYER_PREFIX.fullmatch(name[:at]):
            return name[:at] + marker.rstrip(".")
    return None


def _quantized(name: str, array: mx.array, kind: str | None) -> dict[str, mx.array]:
    if kind is None:
        return {name: array}
    mode, bits, group_size = QUANT_PARAMS[kind]
    parts = mx.quantize(array, group_size=group_size, bits=bits, mode=mode)
    return dict(zip((name, f"{name}.scale", f"{name}.bias"), parts, strict=False))


def _blob(tensors: dict[str, tuple[mx.array, str | None]], per_tensor_metadata: bool = False) -> bytes:
    """One safetensors blob of `tensors` (name -> array, quant type) as quantizeBlob writes it."""
    arrays: dict[str, mx.array] = {}
    for name, (array, kind) in tensors.items():
        arrays |= _quantized(name, array, kind)
    kinds = [kind for _, kind in tensors.values()]
    metadata: dict[str, str] = {}
    if any(kinds):
        if len(set(kinds)) == 1 and not per_tensor_metadata:
            metadata = {"quant_type": kinds[0], "group_size": str(QUANT_PARAMS[kinds[0]][2])}
        else:
            for name, (_, kind) in tensors.items():
                if kind:
                    metadata |= {f"{name}.quant_type": kind, f"{name}.group_size": str(QUANT_PARAMS[kind][2])}
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "blob.safetensors"
        mx.save_safetensors(str(path), arrays, metadata=metadata or None)
        return path.read_bytes()


def _tensor_blobs(checkpoint: Path, quantize: str | None, experts: str, prefix: str = "") -> list[tuple[str, bytes]]:
    """(layer name, blob) for every tensor layer, in the plan's order: plain tensors by name, then expert groups; the
    names of the layers and of the tensors in them start with `prefix`."""
    weights: dict[str, mx.array] = {}
    for file in sorted(checkpoint.glob("*.safetensors")):
        weights |= mx.load(str(file))
    groups: dict[str, dict[str, list[tuple[int, mx.array]]]] = defaultdict(lambda: defaultdict(list))
    blobs = []
    for name in sorted(weights):
        group = expert_group(name)
        per_expert = _PER_EXPERT.fullmatch(name)
        if group and per_expert and per_expert["group"] == group and experts != "per_expert":
            groups[group][per_expert["proj"]].append((int(per_expert["index"]), weights[name]))
            continue
        kind = quant_type(name, tuple(weights[name].shape), quantize)
        blobs.append((prefix + name, _blob({prefix + name: (weights[name], kind)})))
    for group in sorted(groups):
        stem = group if experts == "stacked" else group.removesuffix(".experts") + ".switch_mlp"
        stacked = {}
        for proj in sorted(groups[group]):
            name = f"{stem}.{proj}.weight"
            array = mx.stack([a for _, a in sorted(groups[group][proj], key=lambda pair: pair[0])])
            stacked[prefix + name] = (array, quant_type(name, tuple(array.shape), quantize))
        if experts == "switch_mlp" or len({kind for _, kind in stacked.values()}) == 1:
            blobs.append((prefix + group, _blob(stacked, per_tensor_metadata=experts == "switch_mlp")))
        else:
            blobs += [(name, _blob({name: tensor})) for name, tensor in stacked.items()]
    return blobs


def model_config(quantize: str | None, renderer: str | None, parser: str | None, capabilities: list[str],
                 draft: Path | None = None) -> bytes:
    """The config blob: model.ConfigV2 as json.Marshal writes it (its fields in order, omitempty ones left out)."""
    config: dict[str, Any] = {"model_format": "safetensors", "model_family": "", "model_families": None,
                              "model_type": "", "file_type": quantize or ""}
    config |= {key: value for key, value in (("renderer", renderer), ("parser", parser)) if value}
    config |= {"requires": "0.19.0", "capabilities": capabilities}
    if draft is not None:
        architecture = json.loads((draft / "config.json").read_text())["architectures"][0]
        config["draft"] = {"model_format": "safetensors", "architecture": architecture, "tensor_prefix": "draft.",
                           "config": "draft/config.json"}
    config |= {"architecture": "", "os": ""}
    return json.dumps(config, separators=(",", ":")).encode()


def write_ollama_model(checkpoint: Path, root: Path, name: str, *, quantize: str | None = None, experts: str = "stacked",
                       renderer: str | None = "qwen3-coder", parser: str | None = "qwen3",
                       capabilities: tuple[str, ...] = ("completion", "tools"), system: str | None = None,
                       extra_layers: tuple[tuple[str, bytes], ...] = (), draft: Path | None = None) -> OllamaModel:
    """Write `checkpoint` (a Hugging Face directory) into the Ollama models directory `root` as model `name`, with
    the checkpoint `draft` as its draft model.

    The defaults for renderer, parser and capabilities are what Ollama's create picks for a qwen3 checkpoint;
    `extra_layers` adds (media type, content) layers after the Modelfile ones.
    """
    if experts not in EXPERT_LAYOUTS:
        raise ValueError(f"experts must be one of {', '.join(EXPERT_LAYOUTS)}")
    if quantize is not None and quantize not in QUANT_PARAMS:
        raise ValueError(f"quantize must be one of {', '.join(QUANT_PARAMS)}")
    model = OllamaModel(Path(root), ModelName.parse(name))
    (model.root / "blobs").mkdir(parents=True, exist_ok=True)

    def layer(media_type: str, data: bytes, layer_name: str | None = None) -> dict[str, Any]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        model.blob(digest).write_bytes(data)
        return {"mediaType": media_type, "digest": digest, "size": len(data)} | ({"name": layer_name} if layer_name else {})

    layers = [layer(mt.OLLAMA_TENSOR, blob, layer_name) for layer_name, blob in _tensor_blobs(checkpoint, quantize, experts)]
    layers += [layer(mt.OLLAMA_JSON, file.read_bytes(), file.name) for file in sorted(checkpoint.glob("*.json"))
               if file.name != "model.safetensors.index.json"]
    if draft is not None:
        layers += [layer(mt.OLLAMA_TENSOR, blob, layer_name)
                   for layer_name, blob in _tensor_blobs(draft, None, experts, prefix="draft.")]
        layers += [layer(mt.OLLAMA_JSON, file.read_bytes(), f"draft/{file.name}") for file in sorted(draft.glob("*.json"))
                   if file.name != "model.safetensors.index.json"]
    if system:
        layers.append(layer(mt.SYSTEM, system.encode()))
    layers += [layer(media_type, data) for media_type, data in extra_layers]
    config = layer(mt.CONFIG_MEDIA_TYPE, model_config(quantize, renderer, parser, list(capabilities), draft))
    manifest = {"schemaVersion": 2, "mediaType": mt.MANIFEST_MEDIA_TYPE, "config": config, "layers": layers}
    path = model.root.joinpath("manifests", *model.name.parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(json.dumps(manifest, separators=(",", ":")).encode() + b"\n")  # json.Encoder.Encode
    return model


def upload(model: OllamaModel, registry_url: str, repository: str, tag: str) -> str:
    """Put the model's blobs and manifest on an OCI distribution registry, byte for byte; returns the manifest digest."""
    manifest = json.loads(model.manifest)
    with httpx.Client(base_url=f"{registry_url}/v2/{repository}/", timeout=30) as client:
        for digest in dict.fromkeys(layer["digest"] for layer in [manifest["config"], *manifest["layers"]]):
            if client.head(f"blobs/{digest}").status_code == 200:
                continue
            started = client.post("blobs/uploads/")
            started.raise_for_status()
            url = client.base_url.join(started.headers["location"]).copy_merge_params({"digest": digest})
            client.put(url, content=model.blob(digest).read_bytes(),
                       headers={"Content-Type": "application/octet-stream"}).raise_for_status()
        client.put(f"manifests/{tag}", content=model.manifest,
                   headers={"Content-Type": manifest["mediaType"]}).raise_for_status()
    return "sha256:" + hashlib.sha256(model.manifest).hexdigest()


def write_twin(checkpoint: Path, out: Path, quantize: str | None = None) -> Path:
    """The checkpoint as plugd loads its Ollama model quantized to `quantize`, as a directory `plugd create` takes."""
    out.mkdir(parents=True, exist_ok=True)
    for file in checkpoint.iterdir():
        if file.is_file() and not file.name.endswith(".safetensors") and file.name != "model.safetensors.index.json":
            shutil.copy2(file, out)
    weights: dict[str, mx.array] = {}
    for file in sorted(checkpoint.glob("*.safetensors")):
        weights |= mx.load(str(file))
    experts: dict[str, list[tuple[int, mx.array]]] = defaultdict(list)
    for name in sorted(weights):
        group = expert_group(name)
        if group and (per_expert := _PER_EXPERT.fullmatch(name)) and per_expert["group"] == group:
            stacked = f"{group.removesuffix('.experts')}.switch_mlp.{per_expert['proj']}.weight"
            experts[stacked].append((int(per_expert["index"]), weights.pop(name)))
    weights |= {name: mx.stack([a for _, a in sorted(parts, key=lambda pair: pair[0])]) for name, parts in experts.items()}
    config = json.loads((checkpoint / "config.json").read_text())
    out_weights: dict[str, mx.array] = {}
    quantization: dict[str, Any] = {}
    for name, array in weights.items():
        kind = quant_type(name, tuple(array.shape), quantize)
        if kind is None:
            out_weights[name] = array
            continue
        mode, bits, group_size = QUANT_PARAMS[kind]
        parts = mx.quantize(array, group_size=group_size, bits=bits, mode=mode)
        if mode != "affine":
            out_weights[name] = mx.dequantize(*parts[:2], None, group_size=group_size, bits=bits, mode=mode).astype(
                mx.float32)
            continue
        path = name.removesuffix(".weight")
        out_weights |= {name: parts[0], f"{path}.scales": parts[1], f"{path}.biases": parts[2]}
        quantization[path] = {"group_size": group_size, "bits": bits}
    if quantization:
        first = next(iter(quantization.values()))
        config["quantization"] = {**first, "mode": "affine", **quantization}
        (out / "config.json").write_text(json.dumps(config, indent=2))
    mx.save_safetensors(str(out / "model.safetensors"), out_weights, metadata={"format": "mlx"})
    return out
