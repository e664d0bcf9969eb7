"""The BLAS that MLX's float32 matrix products run on, for processes that run models on a Linux CPU.

MLX's Linux CPU wheel links a reference BLAS; a system OpenBLAS preloaded ahead of it serves the same
symbols with optimised kernels. OpenBLAS picks its kernels by CPU model, and a build older than the CPU
does not recognise it: Debian 12's 0.3.21 takes this project's Xeons for a "Prescott" and runs SSE3
kernels, 0.50 s for a 2048 x 2048 float32 product against 0.12 s with the AVX-512 ones. So the kernel
family the CPU's flags allow is named, unless the environment already names one.
"""

from __future__ import annotations

import ctypes.util
import sys
from collections.abc import Mapping
from pathlib import Path

AVX512 = {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}
AVX2 = {"avx2", "fma"}


def with_openblas(environ: Mapping[str, str]) -> dict[str, str]:
    """A copy of `environ` plus what makes a child process's MLX use the system OpenBLAS well (nothing added where
    there is none)."""
    env = dict(environ)
    openblas = ctypes.util.find_library("openblas") if sys.platform == "linux" else None
    if openblas is None:
        return env
    env["LD_PRELOAD"] = " ".join(filter(None, [env.get("LD_PRELOAD"), openblas]))
    if "OPENBLAS_CORETYPE" not in env and (coretype := coretype_for(cpu_flags())):
        env["OPENBLAS_CORETYPE"] = coretype
    return env


def coretype_for(flags: set[str]) -> str | None:
    """OpenBLAS's name for the widest x86 kernels these CPU flags allow."""
    if AVX512 <= flags:
        return "SkylakeX"
    if AVX2 <= flags:
        return "Haswell"
    return None


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()
