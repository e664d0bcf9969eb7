"""What both Gemma families need from a conversation before rendering it: roles checked, the bos token, the system head."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from plugd.hookspecs import ModelFiles
from plugd.rendering import special_token_text
from plugd.types import Message

KNOWN_ROLES = ("system", "developer", "user", "assistant", "tool")


def system_roles_unified(messages: Sequence[Message]) -> list[Message]:
    """The messages with `developer` read as `system` (no Gemma template has a developer turn); unknown roles refused."""
    unified = []
    for index, message in enumerate(messages):
        if message.role not in KNOWN_ROLES:
            raise ValueError(f"message {index} has role {message.role!r}; Gemma templates know {', '.join(KNOWN_ROLES)}")
        unified.append(attrs.evolve(message, role="system") if message.role == "developer" else message)
    return unified


def split_system_head(messages: list[Message], family: str) -> tuple[Message | None, list[Message]]:
    """The leading system message (the one the template treats specially) and the rest of the conversation."""
    if not messages or messages[0].role != "system":
        return None, messages
    if messages[0].images:
        raise ValueError(f"the {family} template cannot show images in the leading system message")
    return messages[0], messages[1:]


def bos_text(model: ModelFiles) -> str:
    return special_token_text(model.tokenizer_config.get("bos_token"))
