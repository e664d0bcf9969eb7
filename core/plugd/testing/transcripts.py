"""A ready-made agent scenario for end-to-end tests: what a tiny model trained on it answers, word for word.

The conversations are rendered with the tiny tokenizer's ChatML template
(plugd.testing.tokenizer.CHAT_TEMPLATE) by the built-in Jinja renderer, exactly
as the daemon renders them for a model created with `RENDERER jinja`; the
answers are written the way Qwen3 models write theirs, so that the `qwen3`
parser reads the thinking and the tool call back out:

    <think>\\n{thinking}\\n</think>\\n\\n{content}
    <think>\\n{thinking}\\n</think>\\n\\n<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>

`train_agent(path)` writes a tiny checkpoint trained on all of it.
"""

from __future__ import annotations

import json
from pathlib import Path

from attrs import define

from plugd.builtins.jinja_renderer import render
from plugd.hookspecs import ModelFiles, RenderRequest
from plugd.testing.tokenizer import CHAT_TEMPLATE
from plugd.testing.training import FAST_OVERRIDES, Transcript, train_checkpoint
from plugd.types import Message, Think, Tool, ToolCall

# The model files the daemon hands the renderer for a tiny checkpoint; the template reads no other field.
MODEL_FILES = ModelFiles(
    config={"model_type": "qwen3"},
    chat_template=CHAT_TEMPLATE,
    tokenizer_config={"bos_token": None, "eos_token": "<|im_end|>"},
)

# The schema's keys in the order the `ollama` client's Tool model writes them (type, required, properties): every
# client then sends the very same JSON, and the prompt, which holds it verbatim, is the same for all of them.
WEATHER_TOOL = Tool(
    "get_weather",
    "Get the current weather for a city",
    {
        "type": "object",
        "required": ["city"],
        "properties": {"city": {"type": "string", "description": "The city, e.g. Paris"}},
    },
)
WEATHER_QUESTION = "What is the weather in Paris?"
WEATHER_CALL = ToolCall("get_weather", {"city": "Paris"})
WEATHER_CALL_ID = "call_paris_weather"
WEATHER_RESULT = '{"temperature": 18, "sky": "sunny"}'
WEATHER_CALL_THINKING = "The user wants the weather in Paris. I will call the tool."
WEATHER_ANSWER_THINKING = "The tool says it is 18 degrees and sunny."
WEATHER_ANSWER = "It is 18 degrees and sunny in Paris."

HELLO_QUESTION = "Say hello."
HELLO_THINKING = "A greeting."
HELLO_ANSWER = "Hello! How can I help?"
HELLO_ANSWER_WITHOUT_THINKING = "Hello!"


@define(frozen=True)
class Exchange:
    """A conversation as a client sends it (messages, tools, think) and the assistant message the model answers."""

    name: str
    messages: tuple[Message, ...]
    answer: Message
    tools: tuple[Tool, ...] = ()
    think: Think = None

    def prompt(self) -> str:
        """The prompt text the daemon renders for this conversation."""
        return render(RenderRequest(MODEL_FILES, self.messages, self.tools, self.think)).text

    def completion(self) -> str:
        """The text the model generates for `answer`, up to (not including) its end-of-turn token."""
        text = f"<think>\n{self.answer.thinking}\n</think>\n\n" if self.answer.thinking else ""
        calls = [
            "<tool_call>\n" + json.dumps({"name": call.name, "arguments": call.arguments}) + "\n</tool_call>"
            for call in self.answer.tool_calls
        ]
        return text + "\n".join(filter(None, [self.answer.content, *calls]))

    def transcript(self) -> Transcript:
        return Transcript(self.prompt(), self.completion())


def _user(text: str) -> Message:
    return Message("user", text)


WEATHER_CALL_TURN = Exchange(
    "weather: call the tool",
    (_user(WEATHER_QUESTION),),
    Message("assistant", thinking=WEATHER_CALL_THINKING, tool_calls=[WEATHER_CALL]),
    tools=(WEATHER_TOOL,),
)


def weather_answer_turn(*, keep_thinking: bool, ids: bool) -> Exchange:
    """Turn 2 of the weather conversation as a client sends it back.

    `keep_thinking`: the assistant's thinking is in the history (Anthropic and
    Ollama clients send it back; OpenAI clients do not). `ids`: the tool call and
    its result carry a call id (OpenAI and Anthropic clients) or not (Ollama).
    """
    call_id = WEATHER_CALL_ID if ids else None
    call = ToolCall(WEATHER_CALL.name, dict(WEATHER_CALL.arguments), id=call_id)
    history = Message("assistant", thinking=WEATHER_CALL_THINKING if keep_thinking else None, tool_calls=[call])
    result = Message("tool", WEATHER_RESULT, tool_call_id=call_id, tool_name=None if ids else WEATHER_CALL.name)
    return Exchange(
        f"weather: answer ({'thinking kept' if keep_thinking else 'thinking dropped'}, {'ids' if ids else 'no ids'})",
        (_user(WEATHER_QUESTION), history, result),
        Message("assistant", WEATHER_ANSWER, thinking=WEATHER_ANSWER_THINKING),
        tools=(WEATHER_TOOL,),
    )


WEATHER_ANSWER_TURNS = tuple(
    weather_answer_turn(keep_thinking=keep, ids=ids) for keep in (True, False) for ids in (True, False)
)
HELLO = Exchange("hello", (_user(HELLO_QUESTION),), Message("assistant", HELLO_ANSWER, thinking=HELLO_THINKING))
HELLO_WITHOUT_THINKING = Exchange(
    "hello, thinking off", (_user(HELLO_QUESTION),), Message("assistant", HELLO_ANSWER_WITHOUT_THINKING), think=False
)

EXCHANGES: tuple[Exchange, ...] = (WEATHER_CALL_TURN, *WEATHER_ANSWER_TURNS, HELLO, HELLO_WITHOUT_THINKING)


def transcripts(exchanges: tuple[Exchange, ...] = EXCHANGES) -> list[Transcript]:
    """One Transcript per distinct prompt of `exchanges`; raises if two of them render alike but answer differently."""
    by_prompt: dict[str, Transcript] = {}
    for exchange in exchanges:
        transcript = exchange.transcript()
        known = by_prompt.setdefault(transcript.prompt, transcript)
        if known != transcript:
            raise ValueError(f"{exchange.name!r} renders like another exchange but answers differently")
    return list(by_prompt.values())


def train_agent(path: Path, *, cache_dir: Path | None = None) -> Path:
    """A tiny checkpoint in `path` that answers every exchange of EXCHANGES exactly, greedily; returns `path`."""
    return train_checkpoint(path, transcripts(), overrides=FAST_OVERRIDES, cache_dir=cache_dir)
