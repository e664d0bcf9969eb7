"""A prompt over the context, and a generation that fills it, through a live daemon and the official clients.

The OpenAI and Anthropic dialects refuse an over-long prompt with the 400 their real APIs send, worded so that
clients that parse it react; Ollama's API truncates it, as Ollama does. A generation stopped by a full context
says so: Anthropic's stop reason model_context_window_exceeded, OpenAI's finish reason length.
"""

from __future__ import annotations

import anthropic
import ollama
import openai
import pytest

from plugd.testing.checkpoints import write_checkpoint

CONTEXT = 96
GREEDY = {"temperature": 0}
LONG = " ".join(f"word{i}" for i in range(120))  # about 300 tokens of the tiny vocabulary: over the context
SHORT = "Tell me"  # leaves the context's room to fill


@pytest.fixture(scope="module")
def server(modelfile_server, tmp_path_factory):
    # Seed 3's greedy output runs on without an end-of-sequence token for longer than the small context holds.
    checkpoint = write_checkpoint(tmp_path_factory.mktemp("context") / "tiny", "qwen3", seed=3)
    return modelfile_server({"roomy": f"FROM {checkpoint}\n", "small": f"FROM roomy\nPARAMETER num_ctx {CONTEXT}\n"})


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def gpt(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_anthropic_refuses_a_prompt_over_the_context_as_anthropic_does(claude):
    tokens = claude.messages.count_tokens(model="small", messages=user(LONG)).input_tokens
    assert tokens > CONTEXT
    for stream in (False, True):
        with pytest.raises(anthropic.BadRequestError) as refused:
            claude.messages.create(model="small", max_tokens=10, messages=user(LONG), stream=stream)
        assert refused.value.status_code == 400
        assert refused.value.body == {"type": "error", "error": {
            "type": "invalid_request_error", "message": f"prompt is too long: {tokens} tokens > {CONTEXT - 1} maximum"}}


def test_openai_chat_refuses_a_prompt_over_the_context_as_openai_does(gpt):
    roomy = gpt.chat.completions.create(model="roomy", messages=user(LONG), max_tokens=1, **GREEDY)
    tokens = roomy.usage.prompt_tokens
    assert tokens > CONTEXT
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as refused:
            gpt.chat.completions.create(model="small", messages=user(LONG), stream=stream)
        assert refused.value.status_code == 400 and refused.value.code == "context_length_exceeded"
        assert refused.value.body == {
            "message": f"This model's maximum context length is {CONTEXT} tokens. However, your messages resulted in "
                       f"{tokens} tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}


def test_openai_completions_refuse_a_prompt_over_the_context(gpt):
    tokens = gpt.completions.create(model="roomy", prompt=LONG, max_tokens=1, **GREEDY).usage.prompt_tokens
    with pytest.raises(openai.BadRequestError) as refused:
        gpt.completions.create(model="small", prompt=LONG, max_tokens=4)
    assert refused.value.code == "context_length_exceeded" and refused.value.param == "prompt"
    assert refused.value.body["message"] == (f"This model's maximum context length is {CONTEXT} tokens. However, "
                                             f"your prompt resulted in {tokens} tokens. Please reduce the length of "
                                             "the prompt.")


def test_ollama_truncates_a_prompt_over_the_context_as_ollama_does(server):
    client = ollama.Client(host=server.url)
    generated = client.generate(model="small", prompt=LONG, options=GREEDY | {"num_predict": 2})
    assert generated.done and generated.prompt_eval_count <= CONTEXT - 1
    chat = client.chat(model="small", messages=user(LONG), options=GREEDY | {"num_predict": 2})
    assert chat.done and chat.prompt_eval_count <= CONTEXT - 1


def test_a_full_context_is_model_context_window_exceeded_for_anthropic(claude):
    whole = claude.messages.create(model="small", max_tokens=1000, messages=user(SHORT), extra_body=GREEDY)
    with claude.messages.stream(model="small", max_tokens=1000, messages=user(SHORT), extra_body=GREEDY) as stream:
        streamed = stream.get_final_message()
    for message in (whole, streamed):
        used = message.usage.input_tokens + message.usage.cache_read_input_tokens + message.usage.output_tokens
        assert message.stop_reason == "model_context_window_exceeded" and used == CONTEXT
    limited = claude.messages.create(model="small", max_tokens=5, messages=user(SHORT), extra_body=GREEDY)
    assert limited.stop_reason == "max_tokens" and limited.usage.output_tokens == 5


def test_a_full_context_is_length_for_openai(gpt):
    whole = gpt.chat.completions.create(model="small", messages=user(SHORT), **GREEDY)
    assert whole.choices[0].finish_reason == "length" and whole.usage.total_tokens == CONTEXT
    chunks = list(gpt.chat.completions.create(model="small", messages=user(SHORT), stream=True,
                                              stream_options={"include_usage": True}, **GREEDY))
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.total_tokens == CONTEXT
