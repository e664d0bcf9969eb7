"""Values shared by the daemon, the runner and plugins, with the cattrs converter that reads them from JSON."""

from __future__ import annotations

import hashlib
import typing
from typing import Any, Literal

import attrs
import cattrs
import cattrs.cols
from attrs import define, field

Role = Literal["system", "developer", "user", "assistant", "tool"]
Think = bool | Literal["low", "medium", "high"] | None


@define(frozen=True)
class Media:
    """An image (or other media item) as raw bytes; its key is the hash of the bytes."""

    data: bytes = field(repr=lambda d: f"<{len(d)} bytes>")
    mime_type: str = "application/octet-stream"

    @property
    def key(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@define
class ToolCall:
    name: str
    arguments: dict[str, Any] = attrs.Factory(dict)
    id: str | None = None


@define
class Tool:
    name: str
    description: str = ""
    parameters: dict[str, Any] = attrs.Factory(dict)


@define
class Message:
    role: Role
    content: str = ""
    thinking: str | None = None
    images: list[Media] = attrs.Factory(list)
    tool_calls: list[ToolCall] = attrs.Factory(list)
    tool_name: str | None = None
    tool_call_id: str | None = None


@define
class Options:
    """Ollama's generation options that plugd honours; None means the model's or plugd's default."""

    num_ctx: int | None = None
    num_batch: int | None = None
    num_keep: int | None = None
    num_predict: int | None = None
    seed: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stop: list[str] | None = None
    draft_tokens: int | None = None  # plugd's own: the most tokens drafted per round (0: no speculative decoding)


def _option_types() -> dict[str, type]:
    """Each option's value type (int, float or list) with the Optional stripped off."""
    attrs.resolve_types(Options)
    types = {}
    for a in attrs.fields(Options):
        inner = next(t for t in typing.get_args(a.type) if t is not type(None))
        types[a.name] = typing.get_origin(inner) or inner
    return types


OPTION_TYPES: dict[str, type] = _option_types()


@define
class Prompt:
    """What a renderer produces and the runner consumes: text with media items at their placeholders."""

    text: str
    media: list[Media] = attrs.Factory(list)


converter = cattrs.Converter(forbid_extra_keys=False)


def _strict(kind: type) -> typing.Callable[[Any, type], Any]:
    """Accept JSON values of exactly this type (an int where a float is expected too); cattrs would coerce."""

    def hook(value: Any, _: type) -> Any:
        if type(value) is kind or (kind is float and type(value) is int):
            return kind(value)
        raise TypeError(f"expected {kind.__name__}, got {type(value).__name__} {value!r}")

    return hook


for _kind in (str, int, float, bool):
    converter.register_structure_hook(_kind, _strict(_kind))


def _json_arrays_only(kind: type, conv: cattrs.Converter) -> typing.Callable[[Any, type], list]:
    """Lists from JSON arrays only: cattrs takes any iterable, and would read a string as a list of characters."""
    items = cattrs.cols.list_structure_factory(kind, conv)

    def hook(value: Any, _: type) -> list:
        if not isinstance(value, list):
            raise TypeError(f"expected a list, got {type(value).__name__} {value!r}")
        return items(value, kind)

    return hook


converter.register_structure_hook_factory(lambda kind: typing.get_origin(kind) is list, _json_arrays_only)


def _str_or_strings(value: Any, _: type) -> str | list[str] | None:
    if value is None or isinstance(value, str):
        return value
    return converter.structure(value, list[str])


converter.register_structure_hook(str | list[str] | None, _str_or_strings)


def _think(value: Any, _: type) -> Think:
    if value is None or isinstance(value, bool) or value in ("low", "medium", "high"):
        return value
    raise ValueError(f"think must be true, false, \"low\", \"medium\" or \"high\", not {value!r}")


converter.register_structure_hook(Think, _think)


def _duration(value: Any, _: type) -> str | int | float | None:
    if value is None or isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return value
    raise ValueError(f"expected a duration string or a number of seconds, not {value!r}")


converter.register_structure_hook(str | int | float | None, _duration)


def structure(data: Any, cls: type) -> Any:
    """Read `data` (parsed JSON) as `cls`, raising ValueError with a readable reason on bad input."""
    try:
        return converter.structure(data, cls)
    except cattrs.BaseValidationError as exc:
        reasons = "; ".join(cattrs.transform_error(exc))
        raise ValueError(reasons) from None
    except (TypeError, ValueError) as exc:
        raise ValueError(str(exc)) from None


def unstructure(value: Any) -> Any:
    return converter.unstructure(value)
