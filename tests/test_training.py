"""plugd.testing.training and its agent scenario: a trained tiny checkpoint, loaded by a real runner behind a live
daemon, answers its transcripts word for word."""

import json
import time

import ollama
import pytest

from plugd.testing import transcripts as scenario
from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.server import LiveServer
from plugd.testing.training import (
    FAST_OVERRIDES,
    LONG_PROMPT_MODEL_TYPE,
    LONG_PROMPT_OVERRIDES,
    TrainingError,
    Transcript,
    train_checkpoint,
)

GREEDY = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": 200}
GREETING = Transcript("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "Hello there!")


def safetensors_header(path):
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    header.pop("__metadata__")
    return {name: (entry["dtype"], entry["shape"]) for name, entry in header.items()}


def test_scenario_renders_each_client_habit():
    kept, dropped = (scenario.weather_answer_turn(keep_thinking=keep, ids=True) for keep in (True, False))
    # Call ids are not in the template: the turn with ids renders like the one without.
    for keep in (True, False):
        with_ids, without = (scenario.weather_answer_turn(keep_thinking=keep, ids=ids) for ids in (True, False))
        assert with_ids.prompt() == without.prompt()
    assert scenario.WEATHER_CALL_THINKING in kept.prompt() and scenario.WEATHER_CALL_THINKING not in dropped.prompt()
    assert kept.prompt().startswith(scenario.WEATHER_CALL_TURN.prompt().removesuffix("<|im_start|>assistant\n"))
    assert scenario.HELLO_WITHOUT_THINKING.prompt() == scenario.HELLO.prompt() + "<think>\n\n</think>\n\n"
    assert scenario.WEATHER_CALL_TURN.completion() == (
        "<think>\nThe user wants the weather in Paris. I will call the tool.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    assert scenario.HELLO_WITHOUT_THINKING.completion() == "Hello!"
    assert len(scenario.transcripts()) == 5  # the four turn-2 variants render two ways


def test_trained_checkpoint_reproduces_every_transcript_through_a_live_runner(agent_server):
    client = ollama.Client(host=agent_server.url)
    for transcript in scenario.transcripts():
        reply = client.generate(model="agent", prompt=transcript.prompt, raw=True, options=GREEDY)
        assert (reply.response, reply.done_reason) == (transcript.completion, "stop")


def test_chat_returns_the_thinking_and_the_parsed_tool_call(agent_server):
    tool = {"type": "function", "function": {"name": scenario.WEATHER_TOOL.name,
                                             "description": scenario.WEATHER_TOOL.description,
                                             "parameters": scenario.WEATHER_TOOL.parameters}}
    client = ollama.Client(host=agent_server.url)
    reply = client.chat(model="agent", messages=[{"role": "user", "content": scenario.WEATHER_QUESTION}], tools=[tool])
    assert reply.message.thinking == scenario.WEATHER_CALL_THINKING
    assert not reply.message.content
    assert [(c.function.name, dict(c.function.arguments)) for c in reply.message.tool_calls] == [
        ("get_weather", {"city": "Paris"})]


@pytest.fixture(scope="module")
def greeting_checkpoint(tmp_path_factory):
    """One short transcript, trained into a bfloat16 checkpoint through a cache."""
    root = tmp_path_factory.mktemp("greeting")
    started = time.perf_counter()
    path = train_checkpoint(root / "trained", [GREETING], dtype="bfloat16", overrides=FAST_OVERRIDES,
                            cache_dir=root / "cache")
    return path, root / "cache", time.perf_counter() - started


def test_trained_tensors_keep_the_checkpoints_names_shapes_and_dtype(greeting_checkpoint, tmp_path):
    trained, _, _ = greeting_checkpoint
    untrained = write_checkpoint(tmp_path / "untrained", "qwen3", dtype="bfloat16", overrides=FAST_OVERRIDES)
    header = safetensors_header(trained / "model.safetensors")
    assert header == safetensors_header(untrained / "model.safetensors")
    assert {dtype for dtype, _ in header.values()} == {"BF16"}
    assert (trained / "model.safetensors").read_bytes() != (untrained / "model.safetensors").read_bytes()
    assert sorted(p.name for p in trained.iterdir()) == sorted(p.name for p in untrained.iterdir())


def test_training_is_deterministic_and_cached(greeting_checkpoint, tmp_path):
    trained, cache, first_seconds = greeting_checkpoint
    again = train_checkpoint(tmp_path / "again", [GREETING], dtype="bfloat16", overrides=FAST_OVERRIDES)
    assert (again / "model.safetensors").read_bytes() == (trained / "model.safetensors").read_bytes()

    started = time.perf_counter()
    cached = train_checkpoint(tmp_path / "cached", [GREETING], dtype="bfloat16", overrides=FAST_OVERRIDES,
                              cache_dir=cache)
    assert time.perf_counter() - started < min(1.0, first_seconds / 2)
    assert (cached / "model.safetensors").read_bytes() == (trained / "model.safetensors").read_bytes()


def test_training_that_does_not_converge_says_so(tmp_path):
    with pytest.raises(TrainingError, match="did not reproduce all 1 transcripts within 1 steps"):
        train_checkpoint(tmp_path / "m", [GREETING], max_steps=1, overrides=FAST_OVERRIDES)


def test_a_sliding_window_model_learns_a_long_prompt_from_its_end_alone(tmp_path):
    """Trained on the last 64 tokens of a 20,000-token prompt, it answers that prompt, and any other ending alike,
    through a live runner; one prefix rewritten answers the same, one ending changed does not."""
    filler = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(1100))
    ending = "<|im_start|>user\nWhat is the colour of the sky?<|im_end|>\n<|im_start|>assistant\n"
    other = ending.replace("sky", "sea")
    checkpoint = train_checkpoint(tmp_path / "long", [Transcript(filler + ending, "Blue."),
                                                      Transcript(filler + other, "Green.")],
                                  model_type=LONG_PROMPT_MODEL_TYPE, overrides=LONG_PROMPT_OVERRIDES)
    server = LiveServer(tmp_path / "models")
    try:
        (tmp_path / "Modelfile").write_text(f"FROM {checkpoint}\n")
        assert server.cli("create", "long", "-f", str(tmp_path / "Modelfile")).returncode == 0
        client = ollama.Client(host=server.url)

        def answer(prompt):
            reply = client.generate(model="long", prompt=prompt, raw=True, options=GREEDY)
            return reply.response, reply.prompt_eval_count

        text, tokens = answer(filler + ending)
        assert text == "Blue." and tokens > 20_000
        assert answer(filler.replace("fox", "cat", 1000) + ending)[0] == "Blue."  # the last 100 lines as they were
        assert answer(filler + other)[0] == "Green."
    finally:
        server.stop()
