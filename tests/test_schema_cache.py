"""plugd.runner_api.SchemaCache, the compile cache both JSON Schema engines keep."""

from __future__ import annotations

import pytest

from plugd.runner_api import GrammarRefused, SchemaCache


def counting_cache(size: int = 2) -> tuple[SchemaCache, list]:
    asked: list = []

    def compile_schema(schema):
        asked.append(schema)
        if schema.get("refuse"):
            raise GrammarRefused("refused at /")
        return ("compiled", dict(schema))

    return SchemaCache(compile_schema, size=size), asked


def test_a_schema_compiles_once_while_it_is_among_the_last_asked_for():
    cache, asked = counting_cache(size=2)
    a, b, c = {"type": "string"}, {"type": "integer"}, {"type": "null"}
    assert cache.compile("json_schema", a) == ("compiled", a)
    cache.compile("json_schema", {"type": "string"})  # the same JSON, a new object
    cache.compile("json_schema", b)
    cache.compile("json_schema", a)  # a is now the newest: c pushes b out
    cache.compile("json_schema", c)
    cache.compile("json_schema", a)
    cache.compile("json_schema", b)
    assert asked == [a, b, c, b]


def test_a_refusal_is_kept_and_raised_each_time():
    cache, asked = counting_cache()
    for _ in range(2):
        with pytest.raises(GrammarRefused, match="refused at /"):
            cache.compile("json_schema", {"refuse": True})
    assert len(asked) == 1


def test_format_json_is_any_object_and_other_values_are_refused():
    cache, asked = counting_cache()
    cache.compile("json", None)
    assert asked == [{"type": "object"}]
    with pytest.raises(GrammarRefused, match="must be an object or a boolean, not list"):
        cache.compile("json_schema", [1])
