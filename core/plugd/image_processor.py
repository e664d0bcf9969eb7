"""The image processor's settings a vision checkpoint ships beside config.json, handed to its architecture.

transformers keeps them apart from config.json: in preprocessor_config.json, or in processor_config.json's
"image_processor" entry (the newer layout, read first). The daemon (for `Architecture.media_tokens`) and the
runner (for `ModelArgs.from_dict`) both give the architecture config.json with those settings under
plugd.hookspecs.IMAGE_PROCESSOR, so the tokens an image expands to and the pixels the tower sees follow the same
numbers: a checkpoint that lowers Qwen3.5's `max_pixels` gets fewer image tokens on both sides. MLX-free.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from plugd.hookspecs import IMAGE_PROCESSOR


def with_image_processor(config: Mapping[str, Any], read_json: Callable[[str], Mapping[str, Any]]) -> dict[str, Any]:
    """`config` with the image processor's settings under IMAGE_PROCESSOR ({} when the checkpoint ships none);
    `read_json(name)` gives the JSON object of the model's file `name`, {} when there is no such file."""
    settings = read_json("processor_config.json").get(IMAGE_PROCESSOR) or read_json("preprocessor_config.json")
    return {**config, IMAGE_PROCESSOR: dict(settings) if isinstance(settings, Mapping) else {}}


def directory_config(directory: Path) -> dict[str, Any]:
    """The config.json of a model directory (which must have one) with its image processor's settings."""

    def read_json(name: str) -> dict[str, Any]:
        return json.loads((directory / name).read_text()) if (directory / name).is_file() else {}

    return with_image_processor(json.loads((directory / "config.json").read_text()), read_json)
