"""/v1/responses and the context, through a live daemon and the official `openai` client: a prompt over the
context is the 400 OpenAI's Responses API sends (Codex reads its code context_length_exceeded as "ran out of room
in the model's context window", and does not retry), and a generation that fills the context is incomplete with
the reason OpenAI gives, max_output_tokens; once a stream has begun, a context error is its response.failed event
with that code."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from plugd.chat.pipeline import ContextExceeded, Prefill
from plugd.server.openai_responses import ResponseBuilder, ResponsesBody, ResponseStream
from plugd.server.openai_responses_tools import ResponsesTools
from plugd.server.streaming import write_stream
from plugd.testing.checkpoints import write_checkpoint

CONTEXT = 96
LONG = " ".join(f"word{i}" for i in range(120))  # about 300 tokens of the tiny vocabulary: over the context


@pytest.fixture(scope="module")
def client(modelfile_server, tmp_path_factory):
    # Seed 3's greedy output runs on without an end-of-sequence token for longer than the small context holds.
    checkpoint = write_checkpoint(tmp_path_factory.mktemp("context") / "tiny", "qwen3", seed=3)
    server = modelfile_server({"small": f"FROM {checkpoint}\nPARAMETER num_ctx {CONTEXT}\nPARAMETER temperature 0\n"})
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_over_the_context_is_the_400_openai_sends(client, stream):
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="small", input=LONG, stream=stream)
    assert refused.value.status_code == 400
    assert refused.value.body == {
        "message": "Your input exceeds the context window of this model. Please adjust your input and try again.",
        "type": "invalid_request_error", "param": "input", "code": "context_length_exceeded"}


def test_a_full_context_ends_incomplete_for_max_output_tokens(client):
    whole = client.responses.create(model="small", input="Tell me")
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert whole.usage.total_tokens == CONTEXT and whole.output[0].status == "incomplete"
    events = list(client.responses.create(model="small", input="Tell me", stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert events[-1].response.usage.total_tokens == CONTEXT


def test_a_context_error_once_the_stream_has_begun_is_its_final_failed_event():
    """Once response.created is out, a prompt over the context can only be told in the stream: response.failed with
    the code Codex takes as final (a server_error it would resend) and the Responses API's words."""
    async def events():
        yield Prefill(prompt_tokens=120, cached_tokens=0)
        raise ContextExceeded(120, 95, CONTEXT)

    async def streamed() -> list[bytes]:
        later = events()
        first = await anext(later)
        stream = ResponseStream(ResponseBuilder(ResponsesBody(model="small"), ResponsesTools(None)))
        return [chunk async for chunk in write_stream(stream, first, later)]

    chunks = asyncio.run(streamed())
    assert chunks[1] == b": prefill\n\n"
    last = json.loads(chunks[-1].decode().split("data: ", 1)[1])
    assert [chunk.split(b"\n")[0] for chunk in (chunks[0], chunks[-1])] == [b"event: response.created",
                                                                             b"event: response.failed"]
    assert last["response"]["status"] == "failed" and last["response"]["error"] == {
        "code": "context_length_exceeded",
        "message": "Your input exceeds the context window of this model. Please adjust your input and try again."}
