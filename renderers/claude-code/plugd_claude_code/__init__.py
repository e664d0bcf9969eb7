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

Claude Code also opens its system prompt with a block of its own,
`x-anthropic-billing-header: cc_version=<version>.<hash>; cc_entrypoint=cli; ...`,
whose hash changes with the session's first user message. Left in, it is the
first thing in the prompt and no two sessions share a cached token past it;
the renderer leaves it out (it is addressed to Anthropic's billing, not to the
model), so every session reuses the cached system prompt and tools.

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
# The billing block's line and the blank line that joins it to the next system block.
_BILLING_HEADER = re.compile(r"^x-anthropic-billing-header:[^\n]*(?:\n\n?|\Z)", re.MULTILINE)


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


def without_billing_header(messages: list[Message]) -> list[Message]:
    """The conversation with Claude Code's billing-header line taken out of the system messages (and a system
    message left empty by it dropped)."""
    out = []
    for message in messages:
        if message.role == "system" and _BILLING_HEADER.search(message.content):
            message = attrs.evolve(message, content=_BILLING_HEADER.sub("", message.content))
            if not message.content.strip() and not message.images:
                continue
        out.append(message)
    return out


def render(request: RenderRequest, model_render: Callable[[RenderRequest], Prompt]) -> Prompt:
    messages = with_reminders_in_place(without_billing_header(list(request.messages)))
    return model_render(attrs.evolve(request, messages=messages))


@hookimpl
def plugd_client_renderers():
    return [ClientRenderer(name="claude-code", claims=is_claude_code, render=render)]
