"""The cache policy through a live daemon and the official ollama client: the runner takes the prefix-cache
plugin when it is installed, PLUGD_CACHE_POLICY picks another, and /api/ps reports the cache."""

from __future__ import annotations

import httpx
import ollama
import pytest

from plugd.testing.checkpoints import write_checkpoint

OPTIONS = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": 2}
BASE = " ".join(f"word{i}" for i in range(80))


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
    assert cache["nodes"] >= 3 and cache["bytes"] > 0


def test_the_environment_picks_the_single_slot_policy(plugd_server_factory, checkpoint):
    server = plugd_server_factory(env={"PLUGD_CACHE_POLICY": "single-slot"})
    assert first_variant_again(server, checkpoint) > 1
    assert httpx.get(f"{server.url}/api/ps").json()["models"][0]["prompt_cache"] == {"bytes": 0, "nodes": 0}
