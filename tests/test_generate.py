"""End to end: generation through a real daemon and real runner processes, driven by the official ollama client."""

import concurrent.futures
import json
import os
import signal
import time

import httpx
import mlx.core as mx
import mlx_lm
import ollama
import pytest
from mlx_lm.sample_utils import make_sampler
from safetensors.numpy import load_file, save_file

from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.plugins import write_distribution
from plugd.testing.server import LiveServer

GREEDY = {"temperature": 0, "repeat_penalty": 1.0}
# A generation that runs for minutes: room for 250k tokens, and greedy decoding of this seed cycles without EOS.
ENDLESS = {"num_predict": -1, "num_ctx": 262144, "temperature": 0, "repeat_penalty": 1.0}


def create(server, name, directory):
    client = ollama.Client(host=server.url)
    files = {p.name: client.create_blob(p) for p in sorted(directory.iterdir())}
    client.create(model=name, files=files)
    return client


@pytest.fixture
def tiny_long_context(tmp_path):
    return write_checkpoint(tmp_path / "long", "qwen3", overrides={"max_position_embeddings": 262144})


@pytest.fixture
def client(plugd_server, tiny_long_context):
    return create(plugd_server, "tiny", tiny_long_context)


def test_generate_and_chat_streaming_and_not(client):
    whole = client.generate(model="tiny", prompt="Hello", options=GREEDY | {"num_predict": 12})
    assert whole.done and whole.done_reason in ("stop", "length")
    assert whole.eval_count <= 12 and whole.prompt_eval_count > 0
    assert whole.total_duration >= whole.load_duration > 0
    parts = list(client.generate(model="tiny", prompt="Hello", options=GREEDY | {"num_predict": 12}, stream=True))
    assert "".join(p.response for p in parts) == whole.response
    assert parts[-1].done and not any(p.done for p in parts[:-1])

    reply = client.chat(model="tiny", messages=[{"role": "user", "content": "Hi"}], options=GREEDY | {"num_predict": 8})
    assert reply.message.role == "assistant" and reply.done_reason in ("stop", "length")
    chunks = list(client.chat(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                              options=GREEDY | {"num_predict": 8}, stream=True))
    assert "".join(c.message.content for c in chunks) == reply.message.content


def test_seeded_sampling_is_reproducible(client):
    def sample(seed):
        options = {"seed": seed, "temperature": 1.5, "top_k": 100, "top_p": 0.95, "num_predict": 24}
        return client.generate(model="tiny", prompt="Once upon a time", options=options).response

    assert sample(7) == sample(7)
    assert len({sample(7), sample(8), sample(9)}) > 1


def test_num_predict_and_stop_strings(client):
    full = client.generate(model="tiny", prompt="Count", raw=True, options=GREEDY | {"num_predict": 20})
    assert full.done_reason == "length" and full.eval_count == 20
    stop = full.response[5:8]
    assert stop and stop not in full.response[:5], "pick a stop string that first appears at offset 5"
    stopped = client.generate(model="tiny", prompt="Count", raw=True, options=GREEDY | {"num_predict": 20, "stop": [stop]})
    assert stopped.response == full.response[:5]
    assert stopped.done_reason == "stop"


def stored_model_dir(server, name, directory):
    """The model's files as the store holds them, linked into a Hugging Face layout for mlx-lm."""
    manifest = json.loads((server.models / "manifests/registry.ollama.ai/library" / name / "latest").read_text())
    directory.mkdir()
    for layer in manifest["layers"]:
        if layer.get("name"):
            (directory / layer["name"]).symlink_to(server.models / "blobs" / layer["digest"].replace(":", "-"))
    return directory


@pytest.mark.parametrize("model_type, quantize", [("qwen3", None), ("qwen3_moe", None), ("qwen3", "q4"),
                                                  ("qwen3_moe", "q4")])
def test_greedy_tokens_match_mlx_lm(plugd_server, tmp_path, model_type, quantize):
    client = ollama.Client(host=plugd_server.url)
    source = write_checkpoint(tmp_path / "float", model_type, seed=3)
    files = {p.name: client.create_blob(p) for p in sorted(source.iterdir())}
    client.create(model="m", files=files, quantize=quantize)
    prompt = "The quick brown fox jumps over the lazy dog. Hello, world!"
    ours = client.generate(model="m", prompt=prompt, raw=True, options=GREEDY | {"num_predict": 32})
    assert ours.eval_count == 32
    model, tokenizer = mlx_lm.load(str(stored_model_dir(plugd_server, "m", tmp_path / "stored")))
    steps = mlx_lm.stream_generate(model, tokenizer, prompt=tokenizer.encode(prompt), max_tokens=32,
                                   sampler=make_sampler(temp=0.0))
    theirs = [step.token for step in steps]
    assert len(theirs) == 32
    # Text of the token ids as decoded whole: mlx-lm's own streamed text drops a leading space.
    assert ours.response == tokenizer.decode(theirs)


def test_deleting_a_model_unloads_it_unless_another_name_refers_to_it(plugd_server, client):
    client.create(model="own", from_="tiny", system="A model of its own.")  # a manifest unlike tiny's
    client.copy("own", "alias")
    client.generate(model="own", prompt="", keep_alive=-1)
    client.delete("own")
    assert len(plugd_server.runner_pids()) == 1  # "alias" is the same model
    client.delete("alias")
    assert plugd_server.runner_pids() == [] and client.ps().models == []


def test_load_unload_ps_and_keep_alive(plugd_server, client):
    loaded = client.generate(model="tiny", prompt="")
    assert loaded.done_reason == "load" and loaded.response == ""
    (entry,) = client.ps().models
    # No num_ctx: the model's maximum, as its caches for 262,144 positions (128 MiB) fit in the machine's memory.
    assert entry.model == "tiny:latest" and entry.context_length == 262144
    assert len(plugd_server.runner_pids()) == 1

    unloaded = client.generate(model="tiny", prompt="", keep_alive=0)
    assert unloaded.done_reason == "unload"
    assert client.ps().models == []
    assert plugd_server.runner_pids() == []

    client.generate(model="tiny", prompt="Hi", keep_alive=0, options={"num_predict": 2})
    assert client.ps().models == [] and plugd_server.runner_pids() == []

    client.generate(model="tiny", prompt="Hi", keep_alive="4s", options={"num_predict": 2})
    assert len(client.ps().models) == 1
    deadline = time.monotonic() + 30
    while plugd_server.runner_pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert plugd_server.runner_pids() == [] and client.ps().models == []

    client.generate(model="tiny", prompt="", keep_alive=-1)
    assert client.ps().models[0].expires_at.year == 1
    cpu_only = mx.default_device() == mx.cpu
    assert client.ps().models[0].size_vram == (0 if cpu_only else client.ps().models[0].size)
    header, row = plugd_server.cli("ps").stdout.splitlines()
    assert header.split() == ["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL"]
    assert row.startswith("tiny:latest") and row.endswith("Forever") and " 262144 " in row
    assert (" 100% CPU " if cpu_only else " 100% GPU ") in row
    assert plugd_server.cli("stop", "tiny").returncode == 0
    assert plugd_server.runner_pids() == []


def test_runner_killed_mid_stream(plugd_server, client):
    stream = client.generate(model="tiny", prompt="Tell me everything", stream=True, options=ENDLESS)
    next(stream)
    (pid,) = plugd_server.runner_pids()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ollama.ResponseError) as err:
        for _ in stream:
            pass
    assert "killed by signal 9" in str(err.value)
    assert httpx.get(plugd_server.url).status_code == 200
    again = client.generate(model="tiny", prompt="Hi", options={"num_predict": 3})
    assert again.done and plugd_server.runner_pids() != [pid]


def test_client_disconnect_stops_the_runner(plugd_server, client):
    body = {"model": "tiny", "prompt": "Go on and on", "options": ENDLESS}
    with httpx.stream("POST", plugd_server.url + "/api/generate", json=body, timeout=30) as response:
        for i, _ in enumerate(response.iter_lines()):
            if i == 3:
                break
    started = time.monotonic()
    follow_up = client.generate(model="tiny", prompt="Hi", options={"num_predict": 2, "num_ctx": 262144})
    assert follow_up.done
    assert time.monotonic() - started < 20, "the runner was still busy with the abandoned generation"


def test_two_models_alternate_under_a_memory_bound_that_fits_one(tmp_path, tiny_qwen3):
    fit = """
        import os
        from plugd.hookspecs import MemoryFit, hookimpl

        @hookimpl
        def plugd_memory_fits():
            return [MemoryFit(name="fixed", budget=lambda held: int(os.environ["TEST_BUDGET"]))]
    """
    site = write_distribution(tmp_path / "site", "fixed-budget", {"fixed_budget": fit}, {"fixed-budget": "fixed_budget"})
    # The tiny model needs about 2.7 MB at num_ctx 4096 (weights in float32 plus its KV cache).
    server = LiveServer(tmp_path / "models", env={"PYTHONPATH": str(site), "TEST_BUDGET": str(4 << 20)})
    try:
        client = create(server, "a", tiny_qwen3)
        create(server, "b", write_checkpoint(tmp_path / "other", "qwen3", seed=1))
        for name in ["a", "b", "a", "b"]:
            assert client.generate(model=name, prompt="Hi", options={"num_predict": 2}).done
            assert [m.model for m in client.ps().models] == [f"{name}:latest"]
            assert len(server.runner_pids()) == 1
        wide = {"hidden_size": 512, "intermediate_size": 1024, "head_dim": 128}
        create(server, "big", write_checkpoint(tmp_path / "big", "qwen3", overrides=wide))
        with pytest.raises(ollama.ResponseError) as err:
            client.generate(model="big", prompt="Hi")
        assert "model 'big:latest' needs 36.1 MiB (weights and KV cache) but only 4.0 MiB is available" in str(err.value)
        # Unloading b would not have made room enough: it stays loaded, and answers at once.
        assert [m.model for m in client.ps().models] == ["b:latest"] and len(server.runner_pids()) == 1
    finally:
        server.stop()


@pytest.mark.parametrize("damage, message", [
    (lambda w: w.pop("model.layers.1.mlp.up_proj.weight"), "missing tensor model.layers.1.mlp.up_proj.weight"),
    (lambda w: w.update({"model.norm.weight": w["model.norm.weight"][:10]}), "model.norm.weight has shape (10,)"),
])
def test_malformed_checkpoint_fails_the_load_naming_the_tensor(plugd_server, tmp_path, damage, message):
    directory = write_checkpoint(tmp_path / "damaged", "qwen3")
    weights = load_file(str(directory / "model.safetensors"))
    damage(weights)
    save_file(weights, str(directory / "model.safetensors"))
    client = create(plugd_server, "damaged", directory)
    with pytest.raises(ollama.ResponseError) as err:
        client.generate(model="damaged", prompt="Hi")
    assert message in str(err.value)
    assert httpx.get(plugd_server.url + "/api/ps").json() == {"models": []}
    assert plugd_server.runner_pids() == []


def test_the_log_has_a_line_per_request_and_not_the_daemons_calls_to_its_runner(client, plugd_server):
    client.generate(model="tiny", prompt="Hi", options={"num_predict": 2})
    httpx.post(plugd_server.url + "/api/generate", json={"model": "missing", "prompt": "x"})
    log = plugd_server.log()
    assert '"POST /api/generate HTTP/1.1" 200' in log and '"POST /api/generate HTTP/1.1" 404' in log
    assert "http://runner" not in log


def test_generation_errors_are_ollama_shaped(client, plugd_server):
    for body, status, text in [
        ({"model": "tiny", "prompt": "x", "format": "yaml"}, 400, 'format must be "json" or a JSON Schema'),
        ({"model": "tiny", "prompt": "x", "keep_alive": "soon"}, 400, "invalid keep_alive"),
        ({"model": "tiny", "prompt": "x", "options": {"temperature": "hot"}}, 400, "invalid options"),
        ({"model": "tiny", "prompt": "x", "options": {"num_ctx": -5}}, 400,
         "invalid options: num_ctx must be between 1 and 2147483647, not -5"),
        ({"model": "tiny", "prompt": "x", "options": {"top_p": 1.5}}, 400, "top_p must be between 0 and 1, not 1.5"),
        ({"model": "missing", "prompt": "x"}, 404, "not found"),
        ({"model": "tiny", "prompt": "x", "suffix": "y"}, 400, "does not support insert"),
        ({"model": "tiny", "prompt": "x", "images": "aGk="}, 400, "expected list[str] | None @ $.images"),  # not 4 images
    ]:
        response = httpx.post(plugd_server.url + "/api/generate", json=body)
        assert response.status_code == status, body
        assert text in json.loads(response.text)["error"]


def test_logprobs(client, plugd_server):
    body = {"model": "tiny", "prompt": "Hello", "raw": True, "stream": False, "logprobs": True, "top_logprobs": 3,
            "options": GREEDY | {"num_predict": 6}}
    response = httpx.post(plugd_server.url + "/api/generate", json=body, timeout=60).json()
    entries = response["logprobs"]
    assert len(entries) == response["eval_count"] == 6
    assert "".join(e["token"] for e in entries) == response["response"]
    for entry in entries:
        assert entry["logprob"] <= 0
        best = entry["top_logprobs"]
        assert len(best) == 3 and best[0]["logprob"] >= best[1]["logprob"] >= best[2]["logprob"]
        assert (best[0]["token"], best[0]["logprob"]) == (entry["token"], entry["logprob"])  # greedy picks the top
    without = httpx.post(plugd_server.url + "/api/generate", json=body | {"logprobs": False}, timeout=60).json()
    assert "logprobs" not in without and without["response"] == response["response"]


def test_chat_drops_oldest_turns_to_fit_num_ctx(client):
    options = GREEDY | {"num_predict": 8, "num_ctx": 96}
    system = {"role": "system", "content": "Be brief."}
    question = {"role": "user", "content": "What is a fox?"}
    long_turn = "lazy dog " * 60  # each old turn alone exceeds num_ctx
    call = {"function": {"name": "read", "arguments": {"path": "fox.txt"}}}
    history = [{"role": "user", "content": long_turn}, {"role": "assistant", "content": long_turn, "tool_calls": [call]},
               {"role": "tool", "tool_name": "read", "content": long_turn},  # dropped with the call it answers
               {"role": "user", "content": long_turn}, {"role": "assistant", "content": long_turn}]
    truncated = client.chat(model="tiny", messages=[system, *history, question], options=options)
    expected = client.chat(model="tiny", messages=[system, question], options=options)
    assert truncated.message.content == expected.message.content
    assert truncated.prompt_eval_count <= 96


def test_queue_limit_and_max_loaded_models(tmp_path, tiny_long_context):
    server = LiveServer(tmp_path / "models", env={"PLUGD_MAX_QUEUE": "1", "PLUGD_MAX_LOADED_MODELS": "1",
                                                  "PLUGD_NUM_PARALLEL": "1"})
    try:
        client = create(server, "a", tiny_long_context)
        create(server, "b", write_checkpoint(tmp_path / "other", "qwen3", seed=1))
        for name in ["b", "a"]:
            client.generate(model=name, prompt="Hi", options={"num_predict": 2, "num_ctx": 262144})
            assert [m.model for m in client.ps().models] == [f"{name}:latest"]

        body = {"model": "a", "prompt": "Go", "options": ENDLESS}
        with httpx.stream("POST", server.url + "/api/generate", json=body, timeout=60) as busy:
            lines = busy.iter_lines()
            next(lines)  # the runner's only slot is now taken (dropping the iterator would close the stream)
            with httpx.Client(timeout=60) as http, concurrent.futures.ThreadPoolExecutor() as pool:
                small = {"model": "a", "prompt": "Hi", "stream": False, "options": {"num_predict": 1, "num_ctx": 262144}}
                queued = pool.submit(http.post, server.url + "/api/generate", json=small)
                time.sleep(1)  # the first waiting request fills the queue
                refused = http.post(server.url + "/api/generate", json=small, timeout=10)
                assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
                assert "1 requests are already waiting" in refused.json()["error"]
                busy.close()
                assert queued.result().status_code == 200
    finally:
        server.stop()


def test_without_plugins_stored_models_are_listed_but_not_run_nor_created(tmp_path, tiny_qwen3):
    with_plugins = LiveServer(tmp_path / "models")
    try:
        create(with_plugins, "tiny", tiny_qwen3)
    finally:
        with_plugins.stop()
    server = LiveServer(tmp_path / "models", env={"PLUGD_PLUGINS": ""})
    try:
        client = ollama.Client(host=server.url)
        assert [m.model for m in client.list().models] == ["tiny:latest"]
        with pytest.raises(ollama.ResponseError) as err:
            client.generate(model="tiny", prompt="Hi")
        assert err.value.status_code == 400
        assert "no installed architecture plugin runs model_type 'qwen3'" in str(err.value)
        assert "no architecture plugin is installed" in server.log()
        with pytest.raises(ollama.ResponseError) as refused:
            client.create(model="again", from_="tiny")
        assert refused.value.status_code == 400
        assert "no installed architecture plugin runs model_type 'qwen3'; installed: none" in str(refused.value)
        assert [m.model for m in client.list().models] == ["tiny:latest"]
    finally:
        server.stop()


def test_a_slow_load_does_not_hold_up_models_already_loaded(tmp_path, tiny_qwen3):
    site = write_distribution(tmp_path / "site", "slow-arch", {
        "slow_arch": """
            import time
            time.sleep(6)  # a model that takes long to load
            from plugd_qwen.qwen3 import Model, ModelArgs  # noqa: F401
        """,
        "slow_plugin": """
            from plugd.hookspecs import Architecture, hookimpl

            @hookimpl
            def plugd_architectures():
                return [Architecture(model_type="slowqwen", module="slow_arch")]
        """,
    }, {"slow": "slow_plugin"})
    server = LiveServer(tmp_path / "models", env={"PYTHONPATH": str(site)})
    try:
        client = create(server, "fast", tiny_qwen3)
        slow_dir = write_checkpoint(tmp_path / "slow", "qwen3")
        config = json.loads((slow_dir / "config.json").read_text())
        (slow_dir / "config.json").write_text(json.dumps(config | {"model_type": "slowqwen"}))
        create(server, "slow", slow_dir)
        client.generate(model="fast", prompt="Hi", options={"num_predict": 2})
        with concurrent.futures.ThreadPoolExecutor() as pool:
            slow = pool.submit(client.generate, model="slow", prompt="Hi", options={"num_predict": 2})
            time.sleep(1)
            started = time.monotonic()
            assert client.generate(model="fast", prompt="Hello", options={"num_predict": 2}).done
            assert time.monotonic() - started < 4
            assert not slow.done(), "the slow model should still be loading"
            assert slow.result().done
        assert {m.model for m in client.ps().models} == {"fast:latest", "slow:latest"}
    finally:
        server.stop()
