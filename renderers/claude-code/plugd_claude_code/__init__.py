"""A plugd client renderer for Claude Code: its runtime reminders rendered in place, as system turns.

Claude Code attaches `<system-reminder>` blocks (tokens left, files changed,
todo-list nudges) as user text after tool results. A family template then
takes the reminder for the user's latest question: Qwen's templates, for
one, drop the reasoning of every assistant turn before the last user
query, so each reminder rewrites the history that precedes it and the
prompt cache loses everything past the first changed turn. This renderer
turns user turns made only of reminders into system messages at the same
place (which families render in place and never count as a query), then
lets the model's own renderer render the conversation.

Enable it with PLUGD_CLIENT_RENDERERS=claude-code.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import attrs

from plugd.hookspecs import ClientRenderer, ClientRequest, Prompt, RenderRequest, hookimpl
from plugd.types import Message

PLUGD_API = "1.0"  # the plugd plugin API this plugin is built for

_REMINDERS_ONLY = re.compile(r"\s*(<system-reminder>.*?</system-reminder>\s*)+", re.DOTALL)


def is_claude_code(request: ClientRequest) -> bool:
    """Claude Code names itself in its User-Agent (`claude-cli/<version> ...`) and sends `x-app: cli`."""
    headers = {name.lower(): value for name, value in request.headers.items()}
    return headers.get("user-agent", "").startswith("claude-cli/") or headers.get("x-app") == "cli"


def is_runtime_reminder(message: Message) -> bool:
    return message.role == "user" and not message.images and _REMINDERS_ONLY.fullmatch(message.content) is not None


def with_reminders_in_place(messages: list[Message]) -> list[Message]:
    """The conversation with each reminder-only user turn after the first user turn turned into a system message."""
    first_user = next((i for i, m in enumerate(messages) if m.role == "user"), len(messages))
    return [
        attrs.evolve(m, role="system") if i > first_user and is_runtime_reminder(m) else m
        for i, m in enumerate(messages)
    ]


def render(request: RenderRequest, model_render: Callable[[RenderRequest], Prompt]) -> Prompt:
    return model_render(attrs.evolve(request, messages=with_reminders_in_place(list(request.messages))))


@hookimpl
def plugd_client_renderers():
    return [ClientRenderer(name="claude-code", claims=is_claude_code, render=render)]
