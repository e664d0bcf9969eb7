"""Value formatting shared by the renderers, matching what the upstream templates' filters print."""

from __future__ import annotations

import json
from typing import Any


def tojson(value: Any) -> str:
    """The `tojson` filter as transformers defines it for chat templates."""
    return json.dumps(value, ensure_ascii=False)
