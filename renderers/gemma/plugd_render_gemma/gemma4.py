"""Gemma 4: the chat templates of google/gemma-4-*-it, written in Python, byte for byte.

One implementation covers four templates (`Gemma4Template`): the large
models' (31B style), which close an empty thought channel in the generation
prompt when thinking is off, and the small models' (E2B/E4B), which do not;
each in its July 2026 revision and in the April 2026 one it replaced.

Where plugd departs from the templates, on purpose:
- `developer` is `system`. The templates treat a leading developer message
  as the system turn but write a later one as `<|turn>developer`, a role the
  model never saw; plugd writes `<|turn>system` there. System messages after
  the first user turn are written in place as system turns, as the templates do.
- A tool result is named by the call it answers: by `tool_call_id` when it has
  one, else by its `tool_name`, else by its position among the results. The
  templates compare call ids, and calls without ids (Ollama's habit) then all
  match, naming every result after the last call; results without a name
  become `unknown`. A tool result that answers no call of the assistant
  message right before it is refused (ValueError), where the templates drop it.
- Images on the leading system message are refused (the templates drop them),
  and so are images in tool results for the April revision (which drops them).
"""

from __future__ import annotations

from collections.abc import Sequence

from attrs import define

from plugd.hookspecs import ModelFiles, RenderRequest
from plugd.types import Media, Message, Prompt, Tool, ToolCall
from plugd_render_gemma.conversation import bos_text, split_system_head, system_roles_unified
from plugd_render_gemma.gemma4_declarations import declare_tool
from plugd_render_gemma.gemma4_syntax import write_arguments, write_value

IMAGE = "<|image|>"
EMPTY_THOUGHT = "<|channel>thought\n<channel|>"
# The large models' template literally writes this pair (with "\n" escaped) for its empty thought channel.
_EMPTY_THOUGHT_MARKER = "'<|channel>thought\\n<channel|>'"


@define(frozen=True)
class Gemma4Template:
    """What tells one Gemma 4 chat template from another."""

    empty_thought_channel: bool
    """Large models: with thinking off, the generation prompt closes an empty thought channel."""
    april: bool = False
    """The April 2026 revision: None written as `None`, thinking kept only beside tool calls, turns closed by content."""

    @property
    def null(self) -> str:
        return "None" if self.april else "null"

    def detect(self, model: ModelFiles) -> bool:
        template = model.chat_template or ""
        return (
            is_gemma4_template(template)
            and (_EMPTY_THOUGHT_MARKER in template) == self.empty_thought_channel
            and ("preserve_thinking" not in template) == self.april
        )

    def render(self, request: RenderRequest) -> Prompt:
        return _Writer(self, request).prompt()


def is_gemma4_template(template: str) -> bool:
    return "<|turn>" in template and "<|tool_call>" in template and '<|"|>' in template


class _Writer:
    """Renders one request; `last` is what the template calls `prev_message_type`."""

    def __init__(self, template: Gemma4Template, request: RenderRequest):
        self.template = template
        self.request = request
        self.thinking = request.think not in (None, False)
        self.parts = [bos_text(request.model)]
        self.media: list[Media] = []
        self.last: str | None = None

    def write(self, text: str) -> None:
        self.parts.append(text)

    def prompt(self) -> Prompt:
        head, body = split_system_head(system_roles_unified(self.request.messages), "Gemma 4")
        results = _tool_results(body)
        if self.thinking or self.request.tools or head is not None:
            self._system_turn(head, self.request.tools)
        last_user = max((i for i, m in enumerate(body) if m.role == "user"), default=-1)
        following = _following_roles(body)
        previous_role = None
        for index, message in enumerate(body):
            if message.role == "tool":
                continue  # written with the assistant message whose calls it answers
            self._message(message, index > last_user, previous_role, results.get(index, []), following[index])
            previous_role = message.role
        self._generation_prompt()
        return Prompt(text="".join(self.parts), media=self.media)

    def _system_turn(self, head: Message | None, tools: Sequence[Tool]) -> None:
        self.write("<|turn>system\n")
        if self.thinking:
            self.write("<|think|>\n")
            self.last = "think"
        if head is not None:
            self.write(head.content.strip())
        for tool in tools:
            self.write(f"<|tool>{declare_tool(tool, null=self.template.null, always_filter=self.template.april)}<tool|>")
            self.last = "tool"
        self.write("<turn|>\n")

    def _message(self, message: Message, after_last_user: bool, previous_role: str | None,
                 results: list[tuple[str, Message]], following: str | None) -> None:
        self.last = None
        role = "model" if message.role == "assistant" else message.role
        if not (role == "model" and previous_role == "assistant"):  # consecutive assistant messages share a turn
            self.write(f"<|turn>{role}\n")
        if message.thinking and after_last_user and (message.tool_calls or not self.template.april):
            self.write(f"<|channel>thought\n{message.thinking}\n<channel|>")
        for call in message.tool_calls:
            self.write(self._call(call))
            self.last = "tool_call"
        for name, result in results:
            self._tool_result(name, result)
            self.last = "tool_response"
        text = _strip_thinking(message.content) if role == "model" else message.content.strip()
        self.write(IMAGE * len(message.images) + text)
        self.media += message.images
        if self.template.april and message.images:
            self.last = "image"
        self._close(message, role, bool(results), bool(message.images or text), following)

    def _close(self, message: Message, role: str, answered: bool, has_content: bool, following: str | None) -> None:
        if self.last == "tool_call" and not answered:
            self.write("<|tool_response>")  # the turn stays open for the tool's answer
        elif self.template.april:
            if not (answered and not (message.images or message.content)):
                self.write("<turn|>\n")
        elif role == "model" and following == "assistant" and (answered or not message.tool_calls):
            pass  # the next assistant message continues this model turn
        elif not (answered and not has_content and following is None):
            self.write("<turn|>\n")

    def _call(self, call: ToolCall) -> str:
        return f"<|tool_call>call:{call.name}{{{write_arguments(call.arguments, null=self.template.null)}}}<tool_call|>"

    def _tool_result(self, name: str, result: Message) -> None:
        if result.images and self.template.april:
            raise ValueError("the April 2026 Gemma 4 template cannot show images in tool results")
        value = write_value(result.content, quote_keys=False, null=self.template.null)
        self.write(f"<|tool_response>response:{name}{{value:{value}}}<tool_response|>")
        self.write(IMAGE * len(result.images))
        self.media += result.images

    def _generation_prompt(self) -> None:
        if self.last not in ("tool_response", "tool_call"):
            self.write("<|turn>model\n")
            if self.template.empty_thought_channel and not self.thinking:
                self.write(EMPTY_THOUGHT)
        elif self.last == "tool_response" and self.thinking and not self.template.april:
            self.write("<|channel>thought\n")  # after tool results the model thinks again, in the same turn


def _strip_thinking(text: str) -> str:
    """A model message's text without thought channels (`<|channel>...<channel|>`), trimmed, as the template writes it."""
    return "".join(part.split("<|channel>")[0] for part in text.split("<channel|>")).strip()


def _following_roles(body: list[Message]) -> list[str | None]:
    """For each message, the role of the next message that is not a tool result (None at the end)."""
    following: list[str | None] = []
    upcoming = None
    for message in reversed(body):
        following.append(upcoming)
        if message.role != "tool":
            upcoming = message.role
    return following[::-1]


def _tool_results(body: list[Message]) -> dict[int, list[tuple[str, Message]]]:
    """Each tool result, with the name of the call it answers, under the index of the assistant message that made it."""
    results: dict[int, list[tuple[str, Message]]] = {}
    owner: int | None = None
    for index, message in enumerate(body):
        if message.role != "tool":
            owner = index if message.role == "assistant" and message.tool_calls else None
            continue
        if owner is None:
            raise ValueError(f"tool result {_label(message, 0)!r} does not follow an assistant message with tool calls")
        answers = results.setdefault(owner, [])
        answers.append((_answered_call(body[owner].tool_calls, message, len(answers)), message))
    return results


def _label(result: Message, position: int) -> str:
    return result.tool_call_id or result.tool_name or f"#{position + 1}"


def _answered_call(calls: list[ToolCall], result: Message, position: int) -> str:
    if result.tool_call_id is not None:
        matching = [c for c in calls if c.id == result.tool_call_id]
    elif result.tool_name is not None:
        matching = [c for c in calls if c.name == result.tool_name]
    else:
        matching = calls[position : position + 1]
    if not matching:
        raise ValueError(f"tool result {_label(result, position)!r} answers no tool call of the assistant message before it")
    return matching[-1].name
