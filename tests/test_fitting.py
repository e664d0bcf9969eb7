"""Fitting a long conversation into num_ctx takes about log2(turns) renders, not one per dropped turn: 400
messages with num_ctx 64 took 11.7 s holding the model's slot when every dropped turn meant a new render (and a
tokenize). A renderer plugin that counts its calls wraps the built-in Jinja one, behind a live daemon."""

import json
import math

import httpx

from plugd.builtins.jinja_renderer import render
from plugd.hookspecs import ModelFiles, RenderRequest
from plugd.runner.tokenizer import Tokenizer
from plugd.types import Message

COUNTING_RENDERER = '''
import os

from plugd.builtins.jinja_renderer import render as jinja_render
from plugd.hookspecs import Renderer, hookimpl

PLUGD_API = "1.0"


def render(request):
    with open(os.environ["RENDER_LOG"], "a") as log:
        log.write(f"{len(request.messages)}\\n")
    return jinja_render(request)


@hookimpl
def plugd_renderers():
    return [Renderer(name="counting", render=render)]
'''


def test_a_long_conversation_fits_in_logarithmically_many_renders(plugd_temporary_plugins, plugd_server_factory,
                                                                  tiny_qwen3, tmp_path):
    plugd_temporary_plugins.add("counting", COUNTING_RENDERER)
    log = tmp_path / "renders.log"
    server = plugd_server_factory(env={**plugd_temporary_plugins.env(), "RENDER_LOG": str(log)})
    (tmp_path / "Modelfile").write_text(f"FROM {tiny_qwen3}\nRENDERER counting\n")
    assert server.cli("create", "m", "-f", str(tmp_path / "Modelfile")).returncode == 0

    turns = [{"role": role, "content": f"turn {i}: " + "lazy dog " * 4}
             for i, role in zip(range(399), ["user", "assistant"] * 200)]
    question = {"role": "user", "content": "What is a fox?"}
    options = {"num_ctx": 160, "num_predict": 1, "temperature": 0}
    reply = httpx.post(f"{server.url}/api/chat", timeout=120, json={
        "model": "m", "messages": [{"role": "system", "content": "Be brief."}, *turns, question],
        "options": options, "stream": False}).json()

    renders = [int(line) for line in log.read_text().split()]
    assert len(renders) <= 2 + math.ceil(math.log2(len(turns)))

    template = json.loads((tiny_qwen3 / "tokenizer_config.json").read_text())["chat_template"]
    model_files = ModelFiles(config={}, chat_template=template, tokenizer_config={})
    tokenizer = Tokenizer.from_dir(tiny_qwen3)

    def prompt_tokens(kept_turns):
        """The prompt's tokens with the latest `kept_turns` turns, rendered and counted as the daemon does."""
        latest = [Message(turn["role"], turn["content"]) for turn in turns[len(turns) - kept_turns:]]
        messages = [Message("system", "Be brief."), *latest, Message("user", question["content"])]
        return len(tokenizer.encode(render(RenderRequest(model_files, messages, [], None)).text))

    # What was sent keeps as many of the latest turns as fit, and no fewer.
    kept = next(n for n in range(len(turns)) if prompt_tokens(n + 1) > 160)
    assert kept >= 1 and reply["prompt_eval_count"] == prompt_tokens(kept) <= 160
