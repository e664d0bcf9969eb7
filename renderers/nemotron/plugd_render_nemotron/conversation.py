"""What both Nemotron renderers accept: roles, no images, tool results that answer a call."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from plugd.rendering import check_conversation
from plugd.types import Message


def prepared(messages: Sequence[Message], family: str) -> list[Message]:
    """The messages with `developer` read as `system`, refusing what `family` cannot render.

    Refused with ValueError: an unknown role, a message with images, and a
    tool result that answers no earlier assistant tool call (matched by
    tool_call_id when given, else by tool_name, else by any earlier call).
    """
    check_conversation(messages, [])
    if any(message.images for message in messages):
        raise ValueError(f"{family} does not take images")
    return [attrs.evolve(m, role="system") if m.role == "developer" else m for m in messages]
