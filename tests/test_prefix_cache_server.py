"""The cache policy through a live daemon and the official ollama client: the runner takes the prefix-cache
plugin when it is installed, PLUGD_CACHE_POLICY picks another, /api/ps reports the cache, and the cache's
budget is what the memory fits leave."""

from __future__ import annotations

import httpx
import ollama
import pytest

from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.plugins import write_distribution

OPTIONS = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": 2}
BASE = " ".join(f"word{i}" for i in range(80))
FIXED_FIT = """
    import os
    from plugd.hookspecs import MemoryFit, hookimpl

    @hookimpl
    def plugd_memory_fits():
        return [MemoryFit(name="fixed", budget=lambda held: int(os.environ["TEST_BOUND"]))]
"""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("prefix-server") / "qwen3", "qwen3", seed=4)


def first_variant_again(server, checkpoint):
    """Two variants of one prompt, then the first again: its prompt_eval_count."""
    client = ollama.Client(host=server.url)
    client.create(model="tiny", files={p.name: client.create_blob(p) for p in sorted(checkpoint.iterdir())})
    first, second = BASE + " where is the first answer", BASE + " and now a rather different question"
    for prompt in (first, second):
        client.generate(model="tiny", prompt=prompt, raw=True, options=OPTIONS)
    return client.generate(model="tiny", prompt=first, raw=True, options=OPTIONS).prompt_eval_count


def test_the_plugin_is_the_default_and_ps_reports_it(plugd_server_factory, checkpoint):
    server = plugd_server_factory()
    assert first_variant_again(server, checkpoint) == 1
    cache = httpx.get(f"{server.url}/api/ps").json()["models"][0]["prompt_cache"]
    assert cache["nodes"] >= 3 and cache["bytes"] > 0 and cache["live_bytes"] > 0


def test_the_environment_picks_the_single_slot_policy(plugd_server_factory, checkpoint):
    server = plugd_server_factory(env={"PLUGD_CACHE_POLICY": "single-slot"})
    assert first_variant_again(server, checkpoint) > 1
    cache = httpx.get(f"{server.url}/api/ps").json()["models"][0]["prompt_cache"]
    assert (cache["bytes"], cache["nodes"]) == (0, 0) and cache["live_bytes"] > 0  # the live caches are not its own


@pytest.mark.parametrize("wanted", [None, 1 << 20])
def test_the_cache_gets_its_budget_or_what_the_memory_fits_leave(plugd_server_factory, checkpoint, tmp_path, wanted):
    site = write_distribution(tmp_path / "site", "fixed-fit", {"fixed_fit": FIXED_FIT}, {"fixed-fit": "fixed_fit"})
    bound = 8 << 20  # the tiny model needs about 2.7 MB; the default budget, an eighth of memory, is far more
    env = {"PYTHONPATH": str(site), "TEST_BOUND": str(bound)}
    server = plugd_server_factory(env=env | ({} if wanted is None else {"PLUGD_PREFIX_CACHE_BYTES": str(wanted)}))
    assert first_variant_again(server, checkpoint) == 1
    model = httpx.get(f"{server.url}/api/ps").json()["models"][0]
    assert model["prompt_cache"]["budget"] == (bound - model["size"] if wanted is None else wanted)
    assert 0 < model["prompt_cache"]["bytes"] <= model["prompt_cache"]["budget"]
