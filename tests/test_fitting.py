"""Fitting a long conversation into num_ctx takes about log2(turns) renders, not one per dropped turn: 400
messages with num_ctx 64 took 11.7 s holding the model's slot when every dropped turn meant a new render (and a
tokenize). A renderer plugin that counts its calls wraps the built-in Jinja one, behind a live daemon."""

import asyncio
import json
import math

import anthropic
import httpx
import pytest

from plugd.builtins.jinja_renderer import render
from plugd.chat.fitting import droppable_turns, fitted
from plugd.chat.tokens import encode_prompt
from plugd.hookspecs import ModelFiles, RenderRequest
from plugd.tokenizer import Tokenizer
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


def test_counting_tokens_loads_no_model(plugd_server_factory, tiny_qwen3, tmp_path):
    """The daemon tokenizes prompts itself: /v1/messages/count_tokens answers with no runner started, and its
    count is what the model is then given."""
    server = plugd_server_factory()
    (tmp_path / "Modelfile").write_text(f"FROM {tiny_qwen3}\n")
    assert server.cli("create", "m", "-f", str(tmp_path / "Modelfile")).returncode == 0
    claude = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "What does the quick brown fox jump over?"}]
    counted = claude.messages.count_tokens(model="m", system="Be brief.", messages=messages).input_tokens
    assert server.runner_pids() == [] and httpx.get(f"{server.url}/api/ps").json() == {"models": []}
    reply = claude.messages.create(model="m", system="Be brief.", messages=messages, max_tokens=1)
    assert reply.usage.input_tokens == counted > 10


@pytest.mark.parametrize("num_ctx", [40, 160, 1000, 5000, 100_000])
def test_fitting_drops_the_fewest_turns_wherever_the_search_starts(tiny_qwen3, num_ctx):
    """Against every candidate checked one by one: the long history (the guess from its newest turns' texts) and
    the short one (checked whole first) both end on the fewest dropped turns that fit, or on dropping them all."""
    template = json.loads((tiny_qwen3 / "tokenizer_config.json").read_text())["chat_template"]
    model_files = ModelFiles(config={}, chat_template=template, tokenizer_config={})
    tokenizer = Tokenizer.from_dir(tiny_qwen3)

    async def rendered(messages):
        return render(RenderRequest(model_files, messages, [], None))

    async def encode(prompt):
        return encode_prompt(tokenizer, None, prompt)

    for count in (3, 41, 400):
        messages = [Message("system", "Be brief."),
                    *[Message(["user", "assistant"][i % 2], f"turn {i}: " + "lazy dog " * (i % 7)) for i in range(count)],
                    Message("user", "What is a fox?")]
        turns = droppable_turns(messages)

        def tokens_without(dropped, messages=messages, turns=turns):
            gone = {i for turn in turns[:dropped] for i in turn}
            kept = [m for i, m in enumerate(messages) if i not in gone]
            return len(tokenizer.encode(render(RenderRequest(model_files, kept, [], None)).text))

        fewest = next((k for k in range(len(turns) + 1) if tokens_without(k) <= num_ctx), len(turns))
        result = asyncio.run(fitted(messages, num_ctx, rendered, encode, tokenizer))
        assert len(tokenizer.encode(result.prompt.text)) == tokens_without(fewest), (count, num_ctx)
        assert result.fits == (tokens_without(fewest) <= num_ctx)
