"""The OpenAPI document as the endpoints behave: each operation's request body, from the attrs class its handler
takes (plugd.server.bodies.json_body), and its errors in its dialect's own shape (plugd.server.errors), where
Litestar alone would document neither (the bodies are read by plugd's strict reader, not Litestar's) and its own
error shape instead."""

from __future__ import annotations

import types
import typing
from typing import Any, Literal, Union

import attrs
from litestar import Litestar
from litestar.openapi.spec import OpenAPIMediaType, OpenAPIResponse, OpenAPIType, RequestBody, Schema

from plugd.server.errors import dialect_of

ERROR_STATUSES = {"400": "the request is malformed or cannot be served as asked",
                  "404": "no such model", "500": "the model or its runner failed",
                  "503": "too many requests are waiting (see Retry-After)"}
_STRING = Schema(type=OpenAPIType.STRING)
_ERROR_SCHEMAS = {
    "ollama": Schema(type=OpenAPIType.OBJECT, properties={"error": _STRING}, required=["error"]),
    "openai": Schema(type=OpenAPIType.OBJECT, required=["error"], properties={"error": Schema(
        type=OpenAPIType.OBJECT, required=["message", "type"],
        properties={"message": _STRING, "type": _STRING, "param": Schema(type=[OpenAPIType.STRING, OpenAPIType.NULL]),
                    "code": Schema(type=[OpenAPIType.STRING, OpenAPIType.NULL])})}),
    "anthropic": Schema(type=OpenAPIType.OBJECT, required=["type", "error"], properties={
        "type": Schema(const="error"),
        "error": Schema(type=OpenAPIType.OBJECT, required=["type", "message"],
                        properties={"type": _STRING, "message": _STRING})}),
}
_SCALARS = {str: OpenAPIType.STRING, int: OpenAPIType.INTEGER, float: OpenAPIType.NUMBER,
            bool: OpenAPIType.BOOLEAN, type(None): OpenAPIType.NULL}


def schema_of(annotation: Any) -> Schema:
    """A JSON Schema for a body type: attrs classes, scalars, lists, dicts, unions, literals and Any."""
    if annotation is Any:
        return Schema()
    if annotation in _SCALARS:
        return Schema(type=_SCALARS[annotation])
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return Schema(enum=list(args))
    if origin in (Union, types.UnionType):
        return Schema(one_of=[schema_of(arg) for arg in args])
    if origin is list:
        return Schema(type=OpenAPIType.ARRAY, items=schema_of(args[0]) if args else Schema())
    if origin is dict:
        return Schema(type=OpenAPIType.OBJECT, additional_properties=schema_of(args[1]) if args else Schema())
    if attrs.has(annotation):
        hints = typing.get_type_hints(annotation)
        fields = attrs.fields(annotation)
        # A field named after a Python keyword (`from_`) is read under the keyword itself.
        names = {field.name: field.name.removesuffix("_") for field in fields}
        return Schema(type=OpenAPIType.OBJECT, properties={names[f.name]: schema_of(hints[f.name]) for f in fields},
                      required=[names[f.name] for f in fields if f.default is attrs.NOTHING] or None)
    raise TypeError(f"no JSON Schema for {annotation!r}")


def _json(schema: Schema) -> dict[str, OpenAPIMediaType]:
    return {"application/json": OpenAPIMediaType(schema=schema)}


def _bodies(app: Litestar) -> dict[tuple[str, str], Any]:
    """The body type of each operation, by method and path: the `payload` its handler takes."""
    bodies = {}
    for route in app.routes:
        for handler in getattr(route, "route_handlers", ()):
            if (payload := handler.parsed_fn_signature.parameters.get("payload")) is not None:
                bodies |= {(method.lower(), route.path): payload.annotation for method in handler.http_methods}
    return bodies


def describe_bodies_and_errors(app: Litestar) -> None:
    """Fill in `app`'s OpenAPI document: request bodies, and every operation's errors in its dialect's shape."""
    bodies = _bodies(app)
    for path, item in app.openapi_schema.paths.items():
        for method in ("get", "post", "delete", "head"):
            operation = getattr(item, method, None)
            if operation is None:
                continue
            if (body := bodies.get((method, path))) is not None:
                operation.request_body = RequestBody(content=_json(schema_of(body)), required=True)
            errors = _ERROR_SCHEMAS[dialect_of(path)]
            operation.responses = {status: response for status, response in (operation.responses or {}).items()
                                   if status.startswith("2")}
            operation.responses |= {status: OpenAPIResponse(description=text, content=_json(errors))
                                    for status, text in ERROR_STATUSES.items()}
