"""`create --quantize`: the float model's files through `plugd.runner.quantize` in a child process.

The quantizer needs MLX, which the daemon never imports; the child writes the
quantized directory and its files become blobs like any upload.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from plugd.scratch import scratch_prefix
from plugd.store import manifests as mt
from plugd.store.manifests import Layer
from plugd.store.store import Store

LEVELS = {"q4": 4, "q8": 8}


class QuantizeError(ValueError):
    pass


def bits_for(level: str) -> int:
    bits = LEVELS.get(level.lower())
    if bits is None:
        raise QuantizeError(f"unsupported quantization {level!r}: plugd quantizes to {' or '.join(LEVELS)} (MLX affine)")
    return bits


def quantize_files(store: Store, files: dict[str, Layer], module: str, bits: int) -> dict[str, Layer]:
    """Quantize the model made of `files` and store the result's files as blobs; returns the new file layers."""
    with tempfile.TemporaryDirectory(prefix=scratch_prefix("quantize")) as tmp:
        src, dst = Path(tmp, "float"), Path(tmp, "quantized")
        src.mkdir()
        for name, layer in files.items():
            (src / name).symlink_to(store.blobs.path(layer.digest))
        result = subprocess.run(
            [sys.executable, "-m", "plugd.runner.quantize", str(src), str(dst), "--module", module, "--bits", str(bits)],
            capture_output=True, text=True,
        )
        if result.returncode != 0:
            lines = result.stderr.strip().splitlines()
            raise QuantizeError(f"quantization failed: {lines[-1].removeprefix('error: ') if lines else result.returncode}")
        return {
            path.name: Layer(mt.MODEL_FILE, store.blobs.import_file(path), path.stat().st_size, path.name)
            for path in sorted(dst.iterdir())
        }
