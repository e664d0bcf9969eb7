"""/proc readings, kept free of heavy imports so that the mlx-lm peer's memory figures are its own."""

from __future__ import annotations

from pathlib import Path


def proc_status(pid: int | str = "self") -> dict[str, int]:
    """The kB fields of /proc/<pid>/status (VmRSS, VmHWM, RssAnon, RssFile ...) in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if value.strip().endswith(" kB"):
            fields[key] = int(value.split()[0]) * 1024
    return fields


def blas_of(pid: int | str = "self") -> str:
    """The BLAS library the process has mapped, and the OpenBLAS kernels its environment names; a preloaded OpenBLAS
    is named before the reference BLAS MLX links."""
    libraries = {Path(line.split()[-1]).name for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
                 if ".so" in line}
    found = sorted(name for name in libraries if "blas" in name.lower())
    openblas = [name for name in found if "openblas" in name.lower()]
    environ = dict(item.partition("=")[::2] for item in Path(f"/proc/{pid}/environ").read_text().split("\0") if item)
    coretype = environ.get("OPENBLAS_CORETYPE")
    return (openblas or found or ["none"])[0] + (f" ({coretype})" if openblas and coretype else "")
