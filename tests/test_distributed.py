"""One model over a runner group (plugd.runner.group): two ranks of MLX's ring backend on loopback, started by
plugd.group_launcher from a host file, against the same model in one process, through the HTTP API and the
official ollama client.

Split by tensors, each rank holds half of every split layer (plugd.nn.sharding); split into a pipeline, each
holds half of the layers (plugd.nn.pipeline). The group's greedy output matching one process's token for token
shows that the split, the transfers and the ranks' lockstep all hold.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import httpx
import ollama
import psutil
import pytest

from plugd.protocol import PIPELINE, TENSOR
from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.training import Transcript, train_checkpoint

FAMILIES = ("qwen3", "qwen3_moe", "qwen3_next", "nemotron_h")
# Nemotron-H whose first stage keeps only recurrent caches (Mamba2; the MoE keeps none) and whose second keeps only
# keys and values: the two ranks' cache policies would resume and pause prefills at different points on their own.
STAGES_APART = {"hybrid_override_pattern": "MEM*-*"}
GREEDY = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": 24}
PROMPT = "the quick brown fox jumps over the lazy dog " * 3
TRANSCRIPTS = [Transcript(f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n", answer)
               for question, answer in (("Hi", "Hello, how are you today? The river is calm."),
                                        ("Where is the fox?", "The brown fox sleeps under the old bridge."),
                                        ("Sing", "Seven green parrots sing about rivers and stone all day long."))]
SCHEMA = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}, "legs": {"type": "boolean"}},
          "required": ["colour", "legs"], "additionalProperties": False}


def create(server, name: str, checkpoint) -> None:
    client = ollama.Client(host=server.url)
    client.create(model=name, files={p.name: client.create_blob(p) for p in sorted(checkpoint.iterdir())})


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("distributed")
    checkpoints = {family: write_checkpoint(root / family, family, seed=3) for family in FAMILIES}
    # One key/value head: it cannot be shared out between two ranks.
    return checkpoints | {"unsplittable": write_checkpoint(root / "unsplittable", "qwen3", seed=3,
                                                           overrides={"num_key_value_heads": 1}),
                          "stages_apart": write_checkpoint(root / "stages_apart", "nemotron_h", seed=3,
                                                           overrides=STAGES_APART)}


@pytest.fixture(scope="module")
def hostfile(tmp_path_factory):
    path = tmp_path_factory.mktemp("hosts") / "hosts.json"
    path.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * 2))
    return path


@pytest.fixture(scope="module")
def servers(plugd_server_factory, checkpoints, hostfile):
    """(one process, a 2-rank group), each with every family created."""
    alone, group = plugd_server_factory(), plugd_server_factory(env={"PLUGD_HOSTFILE": str(hostfile)})
    for server in (alone, group):
        for family, checkpoint in checkpoints.items():
            create(server, family, checkpoint)
    return alone, group


@pytest.fixture(scope="module")
def pipeline(plugd_server_factory, checkpoints, hostfile):
    """A 2-rank group that splits every model into a pipeline, with every family created."""
    server = plugd_server_factory(env={"PLUGD_HOSTFILE": str(hostfile), "PLUGD_GROUP_SPLIT": PIPELINE})
    for family, checkpoint in checkpoints.items():
        create(server, family, checkpoint)
    return server


@pytest.fixture
def split_group(request, servers, pipeline):
    """The group that splits as the test's `split` parameter says."""
    return servers[1] if request.param == TENSOR else pipeline


def generate(server, model: str, prompt: str = PROMPT, **fields):
    return ollama.Client(host=server.url).generate(model=model, prompt=prompt, raw=True, options=GREEDY, **fields)


def group_of(server, model: str) -> list[dict]:
    loaded = {m["name"]: m for m in httpx.get(f"{server.url}/api/ps").json()["models"]}
    return loaded[f"{model}:latest"]["group"]


@pytest.mark.parametrize("split_group", [TENSOR, PIPELINE], indirect=True)
@pytest.mark.parametrize("family", FAMILIES)
def test_the_group_decodes_what_one_process_decodes(servers, split_group, family):
    alone, group = servers[0], split_group
    expected, got = generate(alone, family), generate(group, family)
    assert got.eval_count == expected.eval_count == GREEDY["num_predict"]
    assert got.response == expected.response
    ranks = group_of(group, family)
    assert [rank["rank"] for rank in ranks] == [0, 1] and len({rank["pid"] for rank in ranks}) == 2
    assert "HOSTS" in group.cli("ps").stdout


@pytest.mark.parametrize("split_group, family", [(TENSOR, "qwen3"), (TENSOR, "qwen3_next"),
                                                  (PIPELINE, "qwen3_next"), (PIPELINE, "stages_apart")],
                         indirect=["split_group"])
def test_the_prefix_cache_serves_the_group(servers, split_group, family):
    alone, group = servers[0], split_group
    generate(group, family)
    longer = PROMPT + "and then it runs away"
    expected, got = generate(alone, family, longer), generate(group, family, longer)
    assert got.response == expected.response
    assert got.prompt_eval_count < len(PROMPT.split())  # it resumed after the prompt before
    departing = " ".join(PROMPT.split()[:20]) + " and a cat sleeps"  # back to a restore point, or trimmed there
    assert generate(group, family, departing).response == generate(alone, family, departing).response


@pytest.mark.parametrize("split_group", [TENSOR, PIPELINE], indirect=True)
def test_structured_output_on_the_group(servers, split_group):
    alone, group = servers[0], split_group
    expected, got = generate(alone, "qwen3", format=SCHEMA), generate(group, "qwen3", format=SCHEMA)
    assert got.response == expected.response
    assert set(json.loads(got.response)) == {"colour", "legs"}


def test_requests_decode_together_on_a_pipeline(pipeline, tmp_path):
    """Requests in flight together decode in one batch on every rank, the layers' caches and the stand-ins for
    the other rank's alike; a checkpoint trained on their transcripts gives each its own (a batched forward may
    differ from a lone one in the last bits, which the training margin keeps from flipping a token)."""
    checkpoint = train_checkpoint(tmp_path / "trained", TRANSCRIPTS, model_type="qwen3_next",
                                  overrides={"num_hidden_layers": 2})
    create(pipeline, "trained", checkpoint)

    async def stream(client: ollama.AsyncClient, prompt: str) -> tuple[float, float, str]:
        first, text = None, ""
        async for chunk in await client.generate(model="trained", prompt=prompt, raw=True, stream=True,
                                                 options=GREEDY | {"num_predict": 64}):
            first = first or (time.monotonic() if chunk.response else None)
            text += chunk.response
        return first, time.monotonic(), text

    async def run() -> list[tuple[float, float, str]]:
        client = ollama.AsyncClient(host=pipeline.url)
        await client.generate(model="trained", prompt="warm", raw=True, options={"num_predict": 1})
        return await asyncio.gather(*(stream(client, transcript.prompt) for transcript in TRANSCRIPTS))

    results = asyncio.run(run())
    assert [text for _, _, text in results] == [transcript.completion for transcript in TRANSCRIPTS]
    assert max(first for first, _, _ in results) < min(end for _, end, _ in results)  # none waited for another


def test_a_request_cancelled_mid_prefill_leaves_the_group_in_step(servers):
    """The client hangs up during a long prefill; the group's next answers are still one process's."""
    alone, group = servers
    long_prompt = "word " * 1500
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{group.url}/api/generate", timeout=httpx.Timeout(30, read=0.3), json={
            "model": "qwen3_next", "prompt": long_prompt, "raw": True, "options": GREEDY})
    for prompt in (long_prompt, PROMPT):
        assert generate(group, "qwen3_next", prompt).response == generate(alone, "qwen3_next", prompt).response


def test_a_model_whose_tensors_cannot_split_is_refused_with_the_reason_and_runs_as_a_pipeline(servers, pipeline):
    alone, group = servers
    with pytest.raises(ollama.ResponseError) as refused:
        generate(group, "unsplittable")
    assert refused.value.status_code == 400
    assert "1 key/value heads do not split evenly across 2 ranks" in refused.value.error
    assert f"PLUGD_GROUP_SPLIT={PIPELINE}" in refused.value.error
    assert generate(pipeline, "unsplittable").response == generate(alone, "unsplittable").response


@pytest.mark.parametrize("split_group", [TENSOR, PIPELINE], indirect=True)
def test_a_rank_that_dies_fails_its_requests_and_the_next_request_starts_the_group_again(servers, split_group):
    alone, group = servers[0], split_group
    generate(group, "qwen3")
    follower = group_of(group, "qwen3")[1]["pid"]
    stream = ollama.Client(host=group.url).generate(model="qwen3", prompt=PROMPT, raw=True, stream=True,
                                                    options=GREEDY | {"num_predict": 3000})
    with pytest.raises(ollama.ResponseError) as failed:
        for i, _ in enumerate(stream):
            if i == 3:
                os.kill(follower, signal.SIGKILL)
    assert "runner group" in failed.value.error or "peer" in failed.value.error
    assert generate(group, "qwen3").response == generate(alone, "qwen3").response
    assert follower not in [rank["pid"] for rank in group_of(group, "qwen3")]


def test_an_idle_group_sleeps(servers):
    """Between requests neither the launcher nor a rank spends CPU: the launcher waits for its ranks to end, and
    a follower for the leader's doorbell, not in the ring backend's polling receive."""
    _, group = servers
    generate(group, "qwen3")
    ranks = [psutil.Process(rank["pid"]) for rank in group_of(group, "qwen3")]
    processes = [*ranks, ranks[0].parent()]
    assert "plugd.group_launcher" in processes[-1].cmdline()

    def cpu_seconds() -> float:
        return sum(sum(process.cpu_times()[:2]) for process in processes)

    before = cpu_seconds()
    time.sleep(3)
    assert cpu_seconds() - before < 0.3  # a spinning one spends about 3


def test_unloading_stops_every_rank(servers):
    _, group = servers
    generate(group, "qwen3_moe")
    pids = [rank["pid"] for rank in group_of(group, "qwen3_moe")]
    generate(group, "qwen3_moe", keep_alive=0)
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
