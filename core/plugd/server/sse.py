"""Server-sent events, as the OpenAI and Anthropic dialects stream them."""

from __future__ import annotations

import json
from typing import Any


def sse_event(data: dict[str, Any] | str, event: str | None = None) -> bytes:
    """One event: an optional `event:` line, then the data (a JSON object, or a bare string such as "[DONE]")."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()
