"""plugd.schema_rewrites against jsonschema on random schemas (plugd.testing.random_schemas): a rewritten schema
takes exactly the instances the original takes (formats asserted), in both of rewritten's modes. Found on the
way: a combinator pair (anyOf beside oneOf) that crashed the distribution, dependency schemas rewritten on
values that are not objects, rewrites under an unevaluatedProperties that reads their annotations, and
recursive definitions unrolled round after round."""

from __future__ import annotations

import random

import pytest

from plugd.schema_rewrites import rewritten
from plugd.testing.random_schemas import random_instance, random_schema, valid

SCHEMAS = 500
INSTANCES = 30


@pytest.mark.parametrize("seed", range(4))
def test_rewritten_schemas_take_the_same_instances(seed):
    rng = random.Random(seed)
    for _ in range(SCHEMAS):
        schema = random_schema(rng)
        instances = [random_instance(rng) for _ in range(INSTANCES)]
        for false_schemas in (True, False):
            after = rewritten(schema, false_schemas=false_schemas)
            for instance in instances:
                assert valid(after, instance) == valid(schema, instance), (schema, after, instance)
