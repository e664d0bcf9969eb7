"""Many streaming clients at once, across the four dialects, a tenth of them leaving mid-stream: every other one is
answered in full, nothing fails, and the daemon ends each round with the open files it started with and no more
memory than rounds before (bench/load.py runs the full size: 128 clients)."""

import asyncio

import pytest

from plugd.testing.load import load_round, settled_figures

CLIENTS = 64
MEASURED_ROUNDS = 3
# Python's allocator takes memory in arenas of 1 MiB; a round of 64 requests that kept 16 KiB each would pass it.
GROWTH_ALLOWED = 2 << 20


@pytest.fixture
def server(modelfile_server, tiny_qwen3):
    return modelfile_server({"m": f"FROM {tiny_qwen3}\n"})


def test_concurrent_streams_with_disconnects_leave_nothing_behind(server):
    pid = server.process.pid

    def round_() -> None:
        result = asyncio.run(load_round(server.url, "m", CLIENTS))
        assert result.errors == []
        assert (result.completed, result.disconnected) == (CLIENTS - CLIENTS // 10, CLIENTS // 10)

    round_()  # warm-up: the model loads, the connections to its runner open, the allocator finds its size
    start = asyncio.run(settled_figures(pid, server.url))
    figures = []
    for _ in range(MEASURED_ROUNDS):
        round_()
        figures.append(asyncio.run(settled_figures(pid, server.url)))
    assert [f.open_files for f in figures] == [start.open_files] * MEASURED_ROUNDS
    assert figures[-1].resident - figures[0].resident <= GROWTH_ALLOWED, (start, figures)
    log = server.log()
    assert "Traceback" not in log and " ERROR " not in log, log[-4000:]
