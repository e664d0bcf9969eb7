"""keep_alive values as Ollama reads them: "5m", "1h30m", "300ms", seconds as a number, negative for ever."""

from __future__ import annotations

import math
import re

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_keep_alive(value: str | int | float) -> float:
    """Seconds to keep a model loaded after its last request; math.inf for a negative value."""
    if isinstance(value, bool):
        raise ValueError(f"invalid keep_alive {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            sign = -1.0 if text.startswith("-") else 1.0
            body = text.lstrip("+-")
            parts = _PART.findall(body)
            if not body or "".join(n + u for n, u in parts) != body:
                raise ValueError(
                    f'invalid keep_alive {value!r}: use a duration like "5m", "1h" or "30s", or seconds'
                ) from None
            seconds = sign * sum(float(n) * _UNITS[u] for n, u in parts)
    return math.inf if seconds < 0 else seconds
