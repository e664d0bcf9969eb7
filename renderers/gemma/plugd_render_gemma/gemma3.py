"""Gemma 3: the chat template of google/gemma-3-*-it, written in Python.

The template has two turn kinds, `user` and `model`, and no system turn: it
writes the first system message, followed by a blank line, at the top of the
first user turn. plugd extends that one rule to every system (or developer)
message: each is a text block of the user side, placed where it was sent, and
a run of user-side messages (user turns and system messages in a row) shares
one user turn with a blank line between blocks, just as the first system
message and the first user message do. Consecutive assistant messages share
one model turn the same way. Where the upstream template would raise
("Conversation roles must alternate", a conversation opening with a model
turn) or write a role Gemma 3 never saw in training (`<start_of_turn>system`
for a system message after a user turn), plugd renders these merged turns
instead, and a conversation of a system message alone (which the template
drops) becomes a user turn; everywhere else its output is the template's,
byte for byte.

Gemma 3 has neither tool calling nor thinking: offered tools, tool calls and
tool results are refused (ValueError), `think` is ignored, and the thinking of
earlier assistant messages is dropped as the template drops it.
"""

from __future__ import annotations

from plugd.hookspecs import ModelFiles, RenderRequest
from plugd.types import Media, Message, Prompt
from plugd_render_gemma.conversation import bos_text, split_system_head, system_roles_unified

IMAGE = "<start_of_image>"


def render(request: RenderRequest) -> Prompt:
    if request.tools:
        raise ValueError("Gemma 3 has no tool calling; its template cannot offer tools")
    messages = system_roles_unified(request.messages)
    for message in messages:
        if message.role == "tool" or message.tool_calls:
            raise ValueError("Gemma 3 has no tool calling; its template cannot show tool calls or tool results")
    head, rest = split_system_head(messages, "Gemma 3")
    turns: list[tuple[str, list[str]]] = []
    media: list[Media] = []
    if head is not None:
        turns.append(("user", [head.content]))  # the template keeps the first system text untrimmed
    for message in rest:
        side = "model" if message.role == "assistant" else "user"
        if not turns or turns[-1][0] != side:
            turns.append((side, []))
        turns[-1][1].append(_block(message))
        media += message.images
    text = "".join(f"<start_of_turn>{side}\n" + "\n\n".join(blocks) + "<end_of_turn>\n" for side, blocks in turns)
    return Prompt(text=bos_text(request.model) + text + "<start_of_turn>model\n", media=media)


def _block(message: Message) -> str:
    """A message as the template writes its content: its images (they come first), then its text trimmed."""
    return IMAGE * len(message.images) + message.content.strip()


def detect(model: ModelFiles) -> bool:
    template = model.chat_template or ""
    return "<start_of_turn>" in template and "<start_of_image>" in template and "<|turn>" not in template
