"""Tool declarations as the Gemma 4 template writes them in its system turn: `declaration:NAME{description:...}`.

The template reads JSON Schemas the lenient Jinja way: a missing key is
Undefined (false, and empty when printed), `| upper` prints any value as
text, and a few closing braces depend on which keys are present. Those
quirks are the model's training format, so they are reproduced here, not
tidied: `_MISSING` plays Undefined.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plugd.types import Tool
from plugd_render_gemma.gemma4_syntax import QUOTE, dictsorted, write_value


class _Undefined:
    def __bool__(self) -> bool:
        return False


_MISSING: Any = _Undefined()
_STANDARD_KEYS = ("description", "type", "properties", "required", "nullable")


def _get(value: Any, key: str) -> Any:
    return value[key] if isinstance(value, Mapping) and key in value else _MISSING


def _upper(value: Any) -> str:
    return "" if value is _MISSING else str(value).upper()


def _quoted_list(items: Any) -> str:
    return "[" + ",".join(QUOTE + str(item) + QUOTE for item in items) + "]"


def declare_tool(tool: Tool, *, null: str, always_filter: bool) -> str:
    """One tool's declaration (what goes between `<|tool>` and `<tool|>`).

    `always_filter` is the April 2026 revision's habit of skipping properties
    named like schema keywords (`type`, `description`...) at every level;
    later revisions skip them only where an object schema without
    `properties` is read as its own property list.
    """
    text = f"declaration:{tool.name}{{description:{QUOTE}{tool.description}{QUOTE}"
    params = tool.parameters
    if params:
        text += ",parameters:{"
        if _get(params, "properties"):
            text += "properties:{" + _properties(params["properties"], always_filter, False, null) + "},"
        if _get(params, "required"):
            text += "required:" + _quoted_list(params["required"]) + ","
        if _get(params, "type"):
            text += f"type:{QUOTE}{_upper(params['type'])}{QUOTE}}}"
    return text + "}"


def _properties(properties: Mapping[str, Any], always_filter: bool, filter_keys: bool, null: str) -> str:
    declared = []
    for key, value in dictsorted(properties):
        if (always_filter or filter_keys) and key in _STANDARD_KEYS:
            continue
        declared.append(f"{key}:{{{_property(value, always_filter, null)}}}")
    return ",".join(declared)


def _property(value: Any, always_filter: bool, null: str) -> str:
    fields: list[str] = []
    kind = _upper(_get(value, "type"))
    if _get(value, "description"):
        fields.append(f"description:{QUOTE}{value['description']}{QUOTE}")
    if kind == "STRING" and _get(value, "enum"):
        fields.append("enum:" + write_value(value["enum"], null=null))
    elif kind == "ARRAY" and isinstance(_get(value, "items"), Mapping) and value["items"]:
        fields.append("items:{" + _items(value["items"], always_filter, null) + "}")
    if _get(value, "nullable"):
        fields.append("nullable:true")
    if kind == "OBJECT":
        nested = _get(value, "properties")
        if isinstance(nested, Mapping):
            fields.append("properties:{" + _properties(nested, always_filter, False, null) + "}")
        else:
            fields.append("properties:{" + _properties(value, always_filter, True, null) + "}")
        if _get(value, "required"):
            fields.append("required:" + _quoted_list(value["required"]))
    fields.append(f"type:{QUOTE}{kind}{QUOTE}")
    return ",".join(fields)


def _items(items: Mapping[str, Any], always_filter: bool, null: str) -> str:
    fields: list[str] = []
    for key, value in dictsorted(items):
        if value is None:
            continue
        if key == "properties":
            nested = _properties(value, always_filter, False, null) if isinstance(value, Mapping) else ""
            fields.append("properties:{" + nested + "}")
        elif key == "required":
            fields.append("required:" + _quoted_list(value))
        elif key == "type":
            kind = value.upper() if isinstance(value, str) else [str(v).upper() for v in value]
            fields.append("type:" + write_value(kind, null=null))
        else:
            fields.append(f"{key}:{write_value(value, null=null)}")
    return ",".join(fields)
