"""Memory figures from psutil on every platform, and the GPU's working set as a bound on all loaded models.

The Linux path is read live here; the Metal arithmetic runs on a figure recorded on a Mac: mx.metal.device_info()
on an M2 Ultra with 192 GB printed max_recommended_working_set_size 188743680000 (ml-explore/mlx pull request
1060)."""

from types import SimpleNamespace

import psutil
import pytest

from plugd.builtins import system_memory
from plugd.hookspecs import MemoryFit
from plugd.procfs import kib_field
from plugd.scheduler import memory

M2_ULTRA_WORKING_SET = 188_743_680_000
GiB = 2**30


def registry_with(*budgets):
    fits = [MemoryFit(name=f"fit{i}", budget=budget) for i, budget in enumerate(budgets)]
    return SimpleNamespace(items={"plugd_memory_fits": fits})


@pytest.mark.skipif(kib_field("/proc/meminfo", "MemAvailable") is None, reason="reads Linux's /proc/meminfo")
def test_the_system_fit_reads_what_the_kernel_calls_available():
    kernel = kib_field("/proc/meminfo", "MemAvailable")
    held = 3 * GiB
    assert abs(system_memory.budget(held) - held - kernel) < 0.05 * kernel  # the same figure, read moments apart
    assert system_memory.available_bytes() <= psutil.virtual_memory().total


def test_the_working_set_bounds_what_the_system_would_allow():
    # 192 GB machine, 180 GiB free as the system counts it: Metal's working set is the tighter bound.
    system = registry_with(lambda held: 180 * GiB + held)
    assert memory.budget(system, held=0, device_limit=M2_ULTRA_WORKING_SET) == M2_ULTRA_WORKING_SET
    # A model already holding 20 GiB: the system would allow 200 GiB in all, the GPU still 175.8 GiB.
    assert memory.budget(system, held=20 * GiB, device_limit=M2_ULTRA_WORKING_SET) == M2_ULTRA_WORKING_SET
    # Short of memory (another app holds most of it), the system's figure binds instead.
    tight = registry_with(lambda held: 30 * GiB + held)
    assert memory.budget(tight, held=20 * GiB, device_limit=M2_ULTRA_WORKING_SET) == 50 * GiB
    # No runner has reported a working set yet (the first load), or none has one (Linux, CUDA): the fits alone.
    assert memory.budget(system, held=0) == 180 * GiB
    assert memory.budget(registry_with(), held=0) is None


def test_a_second_model_that_would_pass_the_working_set_does_not_fit():
    """The scheduler's rule (needed + claimed <= budget) on the recorded figure: a 120 GiB model loaded, a 60 GiB
    one fits the system's 70 GiB free besides it, not the GPU's 175.8 GiB working set in all."""
    system = registry_with(lambda held: 70 * GiB + held)
    held = claimed = 120 * GiB
    bound = memory.budget(system, held, device_limit=M2_ULTRA_WORKING_SET)
    assert 60 * GiB + claimed <= 70 * GiB + held  # what the system alone would have let in
    assert not 60 * GiB + claimed <= bound
