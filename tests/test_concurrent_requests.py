"""Several clients at once on one model, with default settings: their requests decode together in one runner
(continuous batching), each streamed as it goes, none waiting for the others to finish."""

import asyncio
import time

import ollama
import pytest

from plugd.testing.checkpoints import write_checkpoint

STREAMS = 4
OPTIONS = {"temperature": 0, "num_predict": 200, "repeat_penalty": 1.0}


@pytest.fixture(scope="module")
def server(modelfile_server, tmp_path_factory):
    checkpoint = write_checkpoint(tmp_path_factory.mktemp("concurrent") / "tiny", "qwen3", seed=0)
    return modelfile_server({"m": f"FROM {checkpoint}\n"})


async def stream(client: ollama.AsyncClient, prompt: str) -> tuple[float, float, list]:
    """(when its first token came, when it ended, its chunks)."""
    first = None
    chunks = []
    async for chunk in await client.generate(model="m", prompt=prompt, options=OPTIONS, stream=True, raw=True):
        if first is None and chunk.response:
            first = time.monotonic()
        chunks.append(chunk)
    return first, time.monotonic(), chunks


def test_concurrent_streams_decode_together(server):
    async def run():
        client = ollama.AsyncClient(host=server.url)
        await client.generate(model="m", prompt="warm", options={"num_predict": 1})  # loaded before the race
        return await asyncio.gather(*(stream(client, f"request {i} " * (i + 1)) for i in range(STREAMS)))

    results = asyncio.run(run())
    for first, _, chunks in results:
        assert first is not None and chunks[-1].done and chunks[-1].eval_count > 1
    # Every stream had its first token before any other had finished: none waited for another to end.
    assert max(first for first, _, _ in results) < min(end for _, end, _ in results)

