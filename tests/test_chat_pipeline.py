"""The shared chat pipeline through a live daemon: agent habits, unparseable output, and bad conversations."""

import base64
import io
import time

import httpx
import pytest
from PIL import Image

from plugd.testing.checkpoints import write_checkpoint
from plugd.testing.plugins import write_distribution
from plugd.testing.server import LiveServer

ENDLESS = {"num_predict": -1, "num_ctx": 262144, "temperature": 0, "repeat_penalty": 1.0}

# A parser plugin that gives up on the output once it has seen 40 characters, the way a family parser
# gives up on a tool call it cannot read.
STRICT_PARSER = """
    from plugd.hookspecs import ParsedPiece, Parser, hookimpl
    from plugd.parsing import ParseError

    class GivesUp:
        def __init__(self):
            self.seen = 0

        def feed(self, text):
            self.seen += len(text)
            if self.seen > 40:
                raise ParseError("a tool call that is not JSON")
            return [ParsedPiece("content", text)]

        def finish(self):
            return []

    @hookimpl
    def plugd_parsers():
        return [Parser(name="gives-up", create=lambda tools, prompt: GivesUp())]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    checkpoint = write_checkpoint(tmp_path_factory.mktemp("tiny"), "qwen3",
                                  overrides={"max_position_embeddings": 262144})
    site = write_distribution(tmp_path_factory.mktemp("site"), "gives-up", {"gives_up": STRICT_PARSER},
                              {"gives-up": "gives_up"})
    live = LiveServer(tmp_path_factory.mktemp("models"), env={"PYTHONPATH": str(site)})
    try:
        live.cli("create", "tiny", "--from", str(checkpoint), check=True)
        modelfile = tmp_path_factory.mktemp("modelfile") / "Modelfile"
        modelfile.write_text("FROM tiny\nPARSER gives-up\n")
        live.cli("create", "strict", "-f", str(modelfile), check=True)
        yield live
    finally:
        live.stop()


def _chat(server, body, **kwargs):
    return httpx.post(f"{server.url}/api/chat", json={"stream": False} | body, timeout=120, **kwargs)


def _rendered(server, messages, **body):
    response = _chat(server, {"model": "tiny", "messages": messages, "_debug_render_only": True} | body)
    assert response.status_code == 200, response.text
    return response.json()["_debug_info"]["rendered_template"]


def test_debug_render_only_returns_the_prompt_without_loading(server):
    assert _rendered(server, [{"role": "user", "content": "Hi"}]) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert server.runner_pids() == []
    generate = httpx.post(f"{server.url}/api/generate", timeout=60,
                          json={"model": "tiny", "prompt": "Hi", "system": "Be brief.", "_debug_render_only": True})
    assert generate.json()["_debug_info"]["rendered_template"].startswith("<|im_start|>system\nBe brief.<|im_end|>")


def test_leading_system_and_developer_messages_fold_into_one_system_turn(server):
    prompt = _rendered(server, [{"role": "system", "content": "You are an agent."},
                                {"role": "developer", "content": "Use tools."},
                                {"role": "user", "content": "Go"}])
    assert prompt.startswith("<|im_start|>system\nYou are an agent.\n\nUse tools.<|im_end|>\n<|im_start|>user\nGo")


def test_a_system_message_after_the_first_user_turn_stays_in_place(server):
    prompt = _rendered(server, [{"role": "user", "content": "Go"}, {"role": "assistant", "content": "Going."},
                                {"role": "system", "content": "Tokens left: 100"}, {"role": "user", "content": "More"}])
    assert prompt.index("Going.") < prompt.index("<|im_start|>system\nTokens left: 100") < prompt.index("More")


def test_unparseable_output_ends_the_stream_with_one_error_and_frees_the_runner(server):
    body = {"model": "strict", "messages": [{"role": "user", "content": "Go"}], "options": ENDLESS, "stream": True}
    with httpx.stream("POST", f"{server.url}/api/chat", json=body, timeout=60) as response:
        assert response.headers["content-type"] == "application/x-ndjson"
        lines = [line for line in response.iter_lines() if line]
    assert "could not be parsed" in lines[-1] and '"error"' in lines[-1]
    assert sum('"error"' in line for line in lines) == 1 and not any('"done": true' in line for line in lines)

    started = time.monotonic()
    whole = _chat(server, body | {"stream": False})
    assert whole.status_code == 500 and "a tool call that is not JSON" in whole.json()["error"]
    assert time.monotonic() - started < 30, "the runner was still generating for the failed request"
    follow_up = _chat(server, {"model": "tiny", "messages": [{"role": "user", "content": "Go"}],
                               "options": ENDLESS | {"num_predict": 3}})
    assert follow_up.status_code == 200 and follow_up.json()["done"]


def _png() -> str:
    out = io.BytesIO()
    Image.new("RGB", (2, 2)).save(out, "PNG")
    return base64.b64encode(out.getvalue()).decode()


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}
CALL = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {}}}]}


@pytest.mark.parametrize(("body", "message"), [
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "invalid message role 'wizard'"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "18C"}]}, "answers no earlier tool call"),
    ({"messages": [{"role": "user", "content": "hi"}, CALL, {"role": "tool", "tool_name": "get_time", "content": "9"}]},
     "tool result 'get_time' answers no earlier tool call"),
    ({"messages": [{"role": "user", "content": "hi"}],
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
     "must be a JSON Schema of type object"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER, WEATHER]}, "tool names must be unique"),
    ({"messages": [{"role": "user", "content": "hi", "images": [base64.b64encode(b"not an image").decode()]}]},
     "not an image"),
    ({"messages": [{"role": "user", "content": "hi", "images": ["%%%"]}]}, "not valid base64"),
    ({"messages": [{"role": "user", "content": "hi", "images": [_png()]}]}, "does not support images"),
])
def test_bad_conversations_get_a_clear_400(server, body, message):
    response = _chat(server, {"model": "tiny"} | body)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]


def test_invalid_utf8_and_oversize_bodies(server):
    response = httpx.post(f"{server.url}/api/chat", content=b'{"model": "tiny", "messages": "\xff\xfe"}', timeout=30)
    assert response.status_code == 400 and "invalid JSON body" in response.json()["error"]
    huge = b'{"model": "tiny", "messages": [{"role": "user", "content": "' + b"x" * (65 << 20) + b'"}]}'
    response = httpx.post(f"{server.url}/api/chat", content=huge, timeout=60)
    assert response.status_code == 413 and "error" in response.json()
