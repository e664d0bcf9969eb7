"""Runners' MLX multiplies float32 matrices on the system OpenBLAS, with the kernels the CPU allows."""

from __future__ import annotations

import ctypes.util
import json
import subprocess
import sys

import pytest

from plugd.blas import coretype_for, cpu_flags, with_openblas

PROBE = """
import ctypes, json
import mlx.core as mx
a = mx.ones((64, 64))
mx.eval(a @ a)
maps = open("/proc/self/maps").read()
openblas = ctypes.CDLL(None)  # the preloaded library is in the global scope
openblas.openblas_get_corename.restype = ctypes.c_char_p
print(json.dumps({"corename": openblas.openblas_get_corename().decode(), "mapped": "libopenblas" in maps,
                  "product": (a @ a)[0, 0].item()}))
"""


def test_kernel_families_follow_the_cpu_flags():
    assert coretype_for({"avx2", "fma", "avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}) == "SkylakeX"
    assert coretype_for({"avx2", "fma", "avx512f"}) == "Haswell"  # AVX-512 without the BW/DQ/VL SkylakeX needs
    assert coretype_for({"sse4_2", "avx"}) is None


@pytest.mark.skipif(sys.platform != "linux" or not ctypes.util.find_library("openblas"), reason="no system OpenBLAS")
def test_a_child_with_the_runner_environment_runs_mlx_on_openblas_with_the_cpus_kernels():
    env = with_openblas({"PATH": "/usr/bin:/bin"})
    expected = coretype_for(cpu_flags())
    assert env.get("OPENBLAS_CORETYPE") == expected
    found = json.loads(subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                                      check=True).stdout)
    assert found["mapped"] and found["product"] == 64.0
    if expected is not None:
        assert found["corename"].lower() == expected.lower()


def test_a_kernel_family_named_by_the_user_is_kept():
    env = with_openblas({"OPENBLAS_CORETYPE": "Haswell"})
    assert env["OPENBLAS_CORETYPE"] == "Haswell"
