"""Exact patterns for the date and time formats.

xgrammar's own `date`, `date-time` and `time` grammars check only the digits' shapes: they let a model write
2023-02-31, year 0000 or second 60. Before conversion those formats are swapped for patterns that allow only
real calendar dates (month lengths, leap years), years 0001-9999 and seconds 00-59: every string they allow
is a valid RFC 3339 date or time, which is what the schema asks for.
"""

from __future__ import annotations

import copy
from typing import Any

from plugd_xgrammar.coverage import subschemas

_YEAR = "(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
_MONTH_DAY = ("(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
              "|02-(?:0[1-9]|1[0-9]|2[0-8]))")
_LEAP_DAY = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)-02-29"
_DATE = f"(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_DAY})"
_TIME = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]+)?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
PATTERNS = {"date": f"^{_DATE}$", "time": f"^{_TIME}$", "date-time": f"^{_DATE}T{_TIME}$"}


def with_exact_formats(schema: Any) -> Any:
    """A copy of `schema` in which every date, date-time and time format is the pattern above."""
    schema = copy.deepcopy(schema)
    for _, node in subschemas(schema, ""):
        if node.get("format") in PATTERNS and "pattern" not in node:
            node["pattern"] = PATTERNS[node.pop("format")]
    return schema
